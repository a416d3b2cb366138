"""specmon's dashboard entry: `specmon serve` runs this file with Streamlit, and the checkout's app.py calls main().

Only navigation lives here. Page files are named by absolute paths next to this module, so they resolve from a
source checkout and from an installed wheel alike, whatever the working directory.
"""
from __future__ import annotations

import streamlit as st

from specmon.core.resources import PAGES
from specmon.ui.data import UPLOAD_OUTCOMES, follow_updates


def configure_page() -> None:
    """The browser tab's title and icon and the wide layout (each page run; the server's head start warms it)."""
    st.set_page_config(page_title="specmon", page_icon="⚡", layout="wide")


def main() -> None:
    configure_page()
    page = st.navigation([
        st.Page(PAGES / "overview.py", title="Overview", default=True),  # served at /
        st.Page(PAGES / "load.py", title="Load", url_path="load"),
        st.Page(PAGES / "acceptance.py", title="Acceptance", url_path="acceptance"),
        st.Page(PAGES / "economics.py", title="Economics", url_path="economics"),
        st.Page(PAGES / "drift.py", title="Drift", url_path="drift"),
        st.Page(PAGES / "ingest.py", title="Ingest", url_path="ingest"),
        st.Page(PAGES / "live.py", title="Live run", url_path="live"),
        st.Page(PAGES / "losslessness.py", title="Losslessness", url_path="losslessness"),
        st.Page(PAGES / "sources.py", title="Sources", url_path="sources"),
    ])
    if page.url_path != "ingest":  # an upload's outcome stays on the Ingest page until the user leaves it
        st.session_state.pop(UPLOAD_OUTCOMES, None)
    follow_updates()  # new data from any process reruns the page; watched sources' freshness on every page
    page.run()


if __name__ == "__main__":  # Streamlit runs its script as __main__, on every rerun
    main()
