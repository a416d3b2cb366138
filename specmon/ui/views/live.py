"""Live run: speculative decoding of a local model pair on a prompt set, stored as a run, then its acceptance; or a
load sweep (several prompts decoded at once at each batch size, speculatively and plainly), then its speedup curve.

The run happens in a thread of its own (a job kept in the session), so the page renders at once, shows progress
while the run goes on, can cancel it, and loads torch only when a run starts.
"""
from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from specmon.core.faults import SpecmonError
from specmon.core.resources import DRAFT_MODEL, PAGES, PROMPT_SETS, PROMPTS, TARGET_MODEL
from specmon.core.settings import (
    LIVE_DEFAULTS,
    PROPOSER_LABELS,
    PROPOSER_NGRAM,
    SWEEP_DEFAULTS,
    LiveSettings,
    SweepSettings,
)
from specmon.store.database import Store
from specmon.ui import data
from specmon.ui.widgets import guarded, md_text, segment_label, table

log = logging.getLogger(__name__)
_JOB = "live_job"
_SWEEP = "live_sweep"  # the last sweep's curve, shown until the next run


class _Cancelled(Exception):
    """Raised in the run's thread at the next prompt boundary (a sweep's: the next run) once Cancel was pressed."""


@dataclass
class _Job:
    """One live run and what the page shows of it. Only the run's thread writes the fields; the page reads them."""
    settings: LiveSettings
    target: str
    draft: str
    prompt_set: str
    run: str | None = None  # the name asked for (empty: the default), then the name stored
    sweep: SweepSettings | None = None  # a load sweep instead of one sequence at a time
    stage: str = "loading the models"
    done: int = 0
    total: int = 0
    template: str | None = None
    summary: str | None = None  # set when the run is stored
    error: str | None = None
    result: Any = None  # a sweep's specmon.pair.sweep.SweepRun, once stored
    cancel: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


@functools.lru_cache(maxsize=2)
def _pair(target: str, draft: str | None):
    from specmon.pair import live  # torch and transformers load when a run starts, not when the page renders

    return live.load_pair(target, draft)


def _work(job: _Job, store: Store) -> None:
    settings = job.settings
    try:
        from specmon.pair import live, live_inputs

        pair = _pair(job.target, None if settings.ngram else job.draft)
        prompts = live_inputs.read_prompts(str(PROMPTS / job.prompt_set))
        job.template = Path(job.prompt_set).stem
        if job.sweep is not None:
            _sweep(job, store, pair, prompts)
            return
        job.run = job.run or live.run_name(pair, settings)
        job.stage, job.total = "running", len(prompts)

        def progress(n: int, total: int) -> None:
            job.done = n
            if job.cancel.is_set():
                raise _Cancelled

        done = live.record_run(store, pair, prompts, settings, run=job.run, template=job.template,
                               meta=live.run_meta(settings, job.target, job.draft, job.prompt_set),
                               progress=progress)
        job.summary = (f"Stored run **{md_text(job.run)}**: {done.steps} steps, {done.tokens} tokens in "
                       f"{done.seconds:.1f} s.")
    except _Cancelled:
        job.error = "Cancelled: nothing was stored."
    except SpecmonError as exc:
        job.error = str(exc)
    except Exception:  # shown as a plain message; the details go to the server log
        log.exception("live run failed")
        job.error = "The run failed. The server log has the details; nothing was stored."


def _sweep(job: _Job, store: Store, pair, prompts: list[str]) -> None:
    """The load sweep in the run's thread; cancel stops it at the next run, storing nothing."""
    from specmon.pair import live
    from specmon.pair import sweep as sweeps

    assert job.sweep is not None and job.template is not None
    job.run = job.run or sweeps.sweep_name(pair, job.settings)

    def progress(done: int, total: int, what: str) -> None:
        job.done, job.total, job.stage = done, total, what
        if job.cancel.is_set():
            raise _Cancelled

    meta = {**live.run_meta(job.settings, job.target, job.draft, job.prompt_set), "k": sorted(set(job.sweep.ks))}
    job.stage = "warming up"
    done = sweeps.record_sweep(store, pair, prompts, job.settings, job.sweep, run=job.run, template=job.template,
                               meta=meta, progress=progress)
    job.result = done
    job.summary = (f"Stored run **{md_text(job.run)}**: {done.steps} steps and a load sweep of "
                   f"{len(done.measurements)} runs in {done.seconds:.1f} s.")


def sweep_frame(points: list) -> pd.DataFrame:
    """One row per (k, batch size) of a sweep's curve (specmon.pair.sweep.CurvePoint), as the chart and the table
    show them."""
    return pd.DataFrame([{
        "k": str(p.k), "batch": p.concurrency, "speedup": p.speedup.estimate, "lo": p.speedup.lo,
        "hi": p.speedup.hi, "speculative tokens/s": p.tokens_per_s, "plain tokens/s": p.baseline_tokens_per_s,
        "alpha": p.alpha, "tokens/step": p.tokens_per_step, "c": p.c, "mean batch": p.mean_batch}
        for p in points])


def sweep_chart(df: pd.DataFrame) -> alt.Chart:
    """Speedup against batch size, per k, with 95% intervals and the 1.0 line."""
    x = alt.X("batch:Q", title="batch size (sequences decoded at once)", scale=alt.Scale(type="log", base=2))
    colour = alt.Color("k:N", title="draft length k")
    bars = alt.Chart(df.dropna(subset=["lo", "hi"])).mark_errorbar(ticks=True).encode(
        x=x, y=alt.Y("lo:Q", title="speedup over plain batched decoding"), y2="hi:Q", color=colour)
    line = alt.Chart(df).mark_line(point=True).encode(
        x=x, y=alt.Y("speedup:Q", title="speedup over plain batched decoding"), color=colour,
        tooltip=["k", "batch", alt.Tooltip("speedup:Q", format=".3f"), alt.Tooltip("lo:Q", format=".3f"),
                 alt.Tooltip("hi:Q", format=".3f"), alt.Tooltip("alpha:Q", format=".3f")])
    one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="black").encode(y="y:Q")
    return (bars + line + one).properties(height=300)


def _show_sweep(done: Any) -> None:
    st.subheader(f"Speedup by batch size: {md_text(done.run)}")
    df = sweep_frame(done.points)
    st.altair_chart(sweep_chart(df), width="stretch")
    for k, crossing in done.crossings.items():
        st.markdown(f"**k = {k}**: {md_text(crossing.describe())}.")
    st.caption("Speedup: output tokens/s of speculative decoding over plain batched decoding of the same prompts at "
               "the same batch size, mean over the repeats, with a 95% interval. The sweep is stored as a run (each "
               "cell's steps a segment, e.g. \"copy, k=2, batch 8\") with its load sweep, as the Load page reads it.")
    table(df, missing="unknown", hide_index=True, width="stretch", column_config={
        c: st.column_config.NumberColumn(format="%.3f") for c in ("speedup", "lo", "hi", "alpha", "tokens/step", "c")})


def _start(job: _Job) -> None:
    job.thread = threading.Thread(target=_work, args=(job, data.get_store()), name="specmon-live", daemon=True)
    st.session_state[_JOB] = job
    job.thread.start()


@st.fragment(run_every=1.0)
def _follow(job: _Job) -> None:
    """Redrawn every second while the run goes on; the whole page reruns once it has ended."""
    if not job.running:
        st.rerun()
    if job.sweep is not None and job.total:
        st.progress(job.done / job.total, text=f"{job.stage} (run {min(job.done + 1, job.total)} of {job.total})")
    elif job.stage == "running" and job.total:
        st.progress(job.done / job.total, text=f"prompt {job.done} of {job.total}")
    else:
        st.progress(0.0, text=job.stage)
    if job.cancel.is_set():
        st.caption("Cancelling after the run in hand…" if job.sweep is not None else
                   "Cancelling after the prompt in hand…")
    elif st.button("Cancel"):
        job.cancel.set()


@guarded
def render() -> None:
    st.title("Live run")
    st.caption("Runs speculative decoding (Leviathan et al.'s Algorithm 1, KV caches rolled back on rejection) of "
               "a model pair on a prompt set, here on this machine, logs every step with exact beta and timings, "
               "and stores it as a run. The default pair ships with specmon: a small target and an 11x smaller "
               "draft trained on CPython's standard library to write Python and to continue a repetition.")
    job: _Job | None = st.session_state.get(_JOB)
    if job is not None and job.running:
        _follow(job)
        return
    if job is not None:
        del st.session_state[_JOB]
        if job.error:
            st.error(job.error)
        elif job.result is not None:
            st.success(job.summary)
            st.session_state[_SWEEP] = job.result
        elif job.summary:
            st.success(job.summary)
            st.session_state["segment"] = segment_label({"run": job.run, "template": job.template})
            st.switch_page(PAGES / "acceptance.py")  # absolute: the main script is ./app.py or specmon/ui/app.py
    with st.form("live"):
        c1, c2 = st.columns(2)
        target = c1.text_input("Target model", value=str(TARGET_MODEL), help="a local directory or a hub name")
        labels = list(PROPOSER_LABELS.values())
        proposer = c2.radio("Proposer", labels, index=labels.index(PROPOSER_LABELS[LIVE_DEFAULTS.proposer]),
                            horizontal=True)
        draft = c2.text_input("Draft model", value=str(DRAFT_MODEL), help="ignored for n-gram lookup")
        prompt_files = [f"{name}.jsonl" for name in PROMPT_SETS]
        prompt_set = c1.selectbox("Prompt set", prompt_files, help="copy.jsonl: repeat or edit a given text; "
                                                                    "open.jsonl: open-ended code")
        k = st.slider("draft length k", 1, 8, LIVE_DEFAULTS.k)
        temperature = st.slider("temperature (0 = greedy)", 0.0, 1.5, LIVE_DEFAULTS.temperature, 0.05)
        max_new = st.slider("new tokens per prompt", 8, 128, LIVE_DEFAULTS.max_new_tokens, 8)
        c3, c4 = st.columns(2)
        top_p = c3.number_input("top-p (nucleus sampling on both sides; 1 = off)", 0.05, 1.0,
                                LIVE_DEFAULTS.top_p or 1.0, 0.05)
        seed = c4.number_input("seed", 0, 2**31 - 1, LIVE_DEFAULTS.seed)
        run_name = st.text_input("Run name", placeholder="default: from the pair, k and temperature")
        is_sweep = st.checkbox("Load sweep: decode several prompts at once at each batch size, speculatively at "
                               "each draft length and plainly, alternating (k above is then ignored)")
        c5, c6, c7 = st.columns(3)
        sizes = c5.text_input("batch sizes", value=",".join(map(str, SWEEP_DEFAULTS.concurrency)))
        lengths = c6.text_input("draft lengths k", value=",".join(map(str, SWEEP_DEFAULTS.ks)))
        choices = list(range(1, 11))
        repeats = c7.selectbox("repeats", choices, index=choices.index(SWEEP_DEFAULTS.repeats),
                               help="runs of each cell and of its baseline: two or more give an interval")
        submitted = st.form_submit_button("Run", type="primary")
    if submitted:
        ngram = proposer == PROPOSER_LABELS[PROPOSER_NGRAM]
        settings = replace(LIVE_DEFAULTS, k=k, temperature=temperature, max_new_tokens=max_new,
                           top_p=None if top_p >= 1 else top_p, seed=int(seed), ngram=ngram)
        sweep = None
        if is_sweep:
            try:
                sweep = SweepSettings(_numbers(sizes, "batch sizes"), _numbers(lengths, "draft lengths"),
                                      int(repeats))
            except SpecmonError as exc:
                st.error(str(exc))
                return
        st.session_state.pop(_SWEEP, None)
        _start(_Job(settings, target, draft, prompt_set, run_name or None, sweep))
        st.rerun()
    shown = st.session_state.get(_SWEEP)
    if shown is not None:
        _show_sweep(shown)


def _numbers(text: str, what: str) -> tuple[int, ...]:
    """ "1,2,4" as (1, 2, 4), each at least 1."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise SpecmonError(f"{what}: expected whole numbers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise SpecmonError(f"{what}: expected whole numbers of at least 1, got {text!r}")
    return values


if __name__ == "__main__":  # Streamlit runs a page file as __main__
    render()
