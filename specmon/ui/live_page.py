"""Live run: speculative decoding of a local model pair on a prompt set, stored as a run, then its acceptance."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from specmon.ui import data
from specmon.ui.widgets import guarded, md_text, segment_label

ROOT = Path(__file__).resolve().parent.parent.parent
MODELS = ROOT / "data" / "models"
PROMPTS = ROOT / "data" / "prompts"


@st.cache_resource
def _pair(target: str, draft: str | None):
    from specmon import live  # torch and transformers load when this page is first used, not at app start

    return live.load_pair(target, draft)


@guarded
def render() -> None:
    from specmon import live

    st.title("Live run")
    st.caption("Runs speculative decoding (Leviathan et al.'s Algorithm 1, KV caches rolled back on rejection) of "
               "a model pair on a prompt set, here on this machine, logs every step with exact beta and timings, "
               "and stores it as a run. The default pair ships with specmon: a small target and an 11x smaller "
               "draft trained on CPython's standard library to write Python and to continue a repetition.")
    with st.form("live"):
        c1, c2 = st.columns(2)
        target = c1.text_input("Target model", value=str(MODELS / "target"), help="a local directory or a hub name")
        proposer = c2.radio("Proposer", ["draft model", "n-gram prompt lookup"], horizontal=True)
        draft = c2.text_input("Draft model", value=str(MODELS / "draft"), help="ignored for n-gram lookup")
        prompt_files = sorted(p.name for p in PROMPTS.glob("*.jsonl"))
        prompt_set = c1.selectbox("Prompt set", prompt_files, help="copy.jsonl: repeat or edit a given text; "
                                                                    "open.jsonl: open-ended code")
        k = st.slider("draft length k", 1, 8, 4)
        temperature = st.slider("temperature (0 = greedy)", 0.0, 1.5, 0.7, 0.05)
        max_new = st.slider("new tokens per prompt", 8, 128, 48, 8)
        run_name = st.text_input("Run name", placeholder="default: from the pair, k and temperature")
        submitted = st.form_submit_button("Run", type="primary")
    if not submitted:
        return
    ngram = proposer != "draft model"
    pair = _pair(target, None if ngram else draft)
    prompts = live.read_prompts(str(PROMPTS / prompt_set))
    template = Path(prompt_set).stem
    run = run_name or f"live {pair.name} k={k} T={temperature:g}"
    bar = st.progress(0.0, text="starting")
    meta = {"target": target, "draft": None if ngram else draft, "proposer": proposer, "k": k,
            "temperature": temperature, "prompts": prompt_set, "max_new_tokens": max_new}
    done = live.record_run(data.get_store(), pair, prompts, run=run, template=template, meta=meta,
                           progress=lambda n, total: bar.progress(n / total, text=f"prompt {n} of {total}"),
                           k=k, max_new_tokens=max_new, temperature=temperature,
                           ngram=live.NgramProposer() if ngram else None)
    bar.progress(1.0, text="done")
    st.success(f"Stored run **{md_text(run)}**: {done.steps} steps, {done.tokens} tokens in {done.seconds:.1f} s.")
    st.session_state["segment"] = segment_label({"run": run, "template": template})
    st.switch_page("specmon/ui/acceptance.py")


if __name__ == "__main__":  # Streamlit runs a page file as __main__
    render()
