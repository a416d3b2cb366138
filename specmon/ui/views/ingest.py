"""Ingest: upload any file `specmon ingest` reads, in the browser; it goes through the same code."""
from __future__ import annotations

import os
import tempfile
import threading

import pandas as pd
import streamlit as st
from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx
from streamlit.runtime.uploaded_file_manager import UploadedFile

from specmon.core.faults import SpecmonError
from specmon.ingest.pipeline import ingest_stream
from specmon.store.database import Store
from specmon.ui import data
from specmon.ui.widgets import guarded, md_text, table


def result_message(result) -> tuple[str, str]:
    """(level, text) for one file's outcome."""
    file = md_text(result.file)
    if result.status == "already ingested":
        return "info", f"**{file}**: already ingested (same content); nothing changed."
    if result.status == "nothing to ingest":
        return "info", f"**{file}**: the file is empty; nothing to ingest, nothing changed."
    if result.status == "rejected":
        return "error", (f"**{file}**: rejected, nothing stored — {result.fault_count} fault(s). Fix them, or "
                         "tick *store the good rows* to skip bad rows.")
    text = f"**{file}**: stored {result.stored_what()} in run **{md_text(result.run)}**."
    if result.rejected:
        text += f" {result.rejected:,} rows were rejected (listed below)."
    return "success", text


def _ingest_upload(store: Store, upload: UploadedFile, run: str | None, template: str | None,
                   skip_bad: bool) -> dict:
    """One uploaded file through the ingest, with its progress bar; returns what to show of its outcome."""
    label = md_text(upload.name)
    bar = st.progress(0.0, text=f"{label}: reading")
    page = get_script_run_ctx()
    share, doing = 0.0, "reading"

    def progress(done: int, total: int) -> None:
        nonlocal share
        # a load done by one DuckDB query reports from a polling thread (store.query_progress): give it the page
        if get_script_run_ctx(suppress_warning=True) is None:
            add_script_run_ctx(threading.current_thread(), page)
        share = min(done / total, 1.0) if total else 1.0
        bar.progress(share, text=f"{label}: {doing}, {done / 2**20:.1f} MB")

    def stage(what: str) -> None:  # the steps after the reading, which a full bar would hide
        nonlocal doing
        doing = what
        bar.progress(share, text=f"{label}: {what}")

    with tempfile.TemporaryDirectory(prefix="specmon-report-") as tmp:
        report_path = os.path.join(tmp, "rejected.jsonl")
        try:
            result = ingest_stream(store, upload, upload.name, run=run, template=template, skip_bad=skip_bad,
                                   report_path=report_path, progress=progress, stage=stage)
        except SpecmonError as exc:  # e.g. a run name that belongs to the demo: said as the CLI says it
            bar.progress(1.0, text=f"{label}: not stored")
            return {"name": upload.name, "level": "error", "text": md_text(str(exc)), "notes": [], "faults": [],
                    "more": 0, "report": None}
        report = open(report_path, "rb").read() if result.report_path else None
    bar.progress(1.0, text=f"{label}: done")
    level, text = result_message(result)
    return {"name": upload.name, "level": level, "text": text, "notes": result.notes,
            "faults": [f.as_dict() for f in result.faults], "more": result.fault_count - len(result.faults),
            "report": report}


def _show(outcome: dict) -> None:
    label = md_text(outcome["name"])
    getattr(st, outcome["level"])(outcome["text"])
    for note in outcome["notes"]:
        st.caption(f"{label}: {md_text(note)}")
    if outcome["faults"]:
        table(pd.DataFrame(outcome["faults"]), hide_index=True, width="stretch")
        if outcome["more"] > 0:
            st.caption(f"… and {outcome['more']} more.")
    if outcome["report"]:
        st.download_button(f"Rejected rows of {label} (JSON Lines)", outcome["report"],
                           file_name=f"{outcome['name']}.rejected.jsonl", key=f"report-{outcome['name']}")


@guarded
def render() -> None:
    st.title("Ingest")
    st.caption("Every format `specmon ingest` reads, told apart by content, not by name: specmon step logs (JSON "
               "Lines, or the flat form as CSV or Parquet); vLLM, llama.cpp and SGLang server logs as they print "
               "them (.log, .txt, .out, ...) and vLLM's per-request JSON responses; saved Prometheus /metrics "
               "pages. Each file is stored whole or not at all; a file already stored is recognised by its "
               "content and skipped.")
    with st.form("ingest", clear_on_submit=True):
        # No type filter: the ingest detects the format from the content, and server logs carry any extension.
        files = st.file_uploader("Logs, step logs or Prometheus pages", accept_multiple_files=True, type=None)
        c1, c2 = st.columns(2)
        run = c1.text_input("Run name", placeholder="default: the file name",
                            help="steps of one deployment or experiment")
        template = c2.text_input("Template", placeholder="for steps whose log names none")
        skip_bad = st.checkbox("Store the good rows and list the rejected ones", value=False)
        submitted = st.form_submit_button("Ingest", type="primary")
    if submitted and not files:
        st.warning("Choose one or more files first.")
    if submitted and files:
        store = data.get_store()
        st.session_state[data.UPLOAD_OUTCOMES] = [_ingest_upload(store, upload, run or None, template or None, skip_bad)
                                      for upload in files]
    for outcome in st.session_state.get(data.UPLOAD_OUTCOMES, []):
        _show(outcome)
    st.subheader("Past ingests")
    history = data.ingest_history()
    if history.empty:
        st.info("Nothing ingested yet.")
    else:
        table(history, hide_index=True, width="stretch")


if __name__ == "__main__":  # Streamlit runs a page file as __main__
    render()
