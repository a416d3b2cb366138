"""Pieces every page shares: the error guard, the demo banner, the segment picker."""
from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable

import pandas as pd
import streamlit as st

from specmon.core import display
from specmon.core.text import markdown_literal

log = logging.getLogger("specmon.ui")

# Plain symbols, not emoji: they render in any font (headless browsers and terminals often lack emoji fonts).
STATUS_BADGE = {"healthy": "✔ healthy", "at risk": "▲ at risk", "losing": "✖ losing", "unknown": "? unknown"}
STATUS_COLOURS = {"healthy": "#2e7d32", "at risk": "#ef6c00", "losing": "#c62828", "unknown": "#9e9e9e"}
EMPTY = ("No steps stored yet. Upload a step log on the **Ingest** page (or run `specmon ingest FILE`) "
         "to see acceptance here.")


def guarded(render: Callable[[], None]) -> Callable[[], None]:
    """Show a plain message instead of a traceback; the details go to the server log."""
    @functools.wraps(render)
    def page() -> None:
        try:
            render()
        except Exception:
            log.exception("page %s failed", render.__module__)
            st.error("Something went wrong while drawing this page. The server log has the details; "
                     "the data itself is unchanged.")
    return page


DEMO_NOTICE = ("**Demo data, not yours.** Nothing of your own is stored yet, so this is the synthetic demo log "
               "(a template change at v2 pushes acceptance below break-even) and load sweep (speculation stops "
               "paying between 16 and 32 running requests). It hides once you ingest a log.")


def sentence(text: str) -> str:
    """text with its first letter upper case, the rest as it is (str.capitalize lowers the rest: N* -> n*); a text
    that opens with a symbol in a formula ("k = 1 up to 8 ...") keeps it as it is: K is not k."""
    if re.match(r"[A-Za-z]\*?\s*[=<>]", text):
        return text
    return text[:1].upper() + text[1:]


def demo_banner(rows: list[dict]) -> None:
    """The demo notice, where the rows shown are the demo's (summaries show them only while the user has none)."""
    if rows and rows[0]["demo"]:
        st.warning(DEMO_NOTICE)


def md_text(value: object) -> str:
    """User text (a name, a file name, a note, a fault reason) for any Streamlit element that renders Markdown
    (markdown, alerts, captions, titles, metric and button labels, progress text): shown exactly as written."""
    return markdown_literal(str(value))


def segment_label(row: dict) -> str:
    return f"{row['run']} / {row['template'] or '(no template)'}"


def pick_segment(rows: list[dict], key: str) -> dict:
    """A select box over segments (its options are plain text); the choice is shared across pages through session
    state."""
    labels = [segment_label(r) for r in rows]
    current = st.session_state.get("segment")
    index = labels.index(current) if current in labels else 0
    choice = st.selectbox("Segment (run / template)", labels, index=index, key=key)
    st.session_state["segment"] = choice
    return rows[labels.index(choice)]


def fmt(x: float | None, spec: str = ".3f") -> str:
    return display.number(x, spec, display.PAGE)


# A cell a spreadsheet would read as a formula when the table is downloaded as CSV (formula injection): a run named
# =HYPERLINK(...) must stay text.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """The frame with every text cell that starts like a formula prefixed by an apostrophe, as spreadsheets
    themselves mark text (numbers stay numbers)."""
    out = df.copy()
    for column in out.columns:
        if out[column].dtype == object:
            out[column] = out[column].map(lambda v: "'" + v if isinstance(v, str) and v.startswith(_FORMULA_START)
                                          else v)
    return out


def table(df: pd.DataFrame, missing: str = "—", **options) -> None:
    """st.dataframe of a frame that may hold user text: its CSV download (the table's own toolbar) is safe to open
    in a spreadsheet. A missing value reads `missing` (a figure the data cannot give: "unknown"), not "None"."""
    st.dataframe(spreadsheet_safe(df), placeholder=missing, **options)
