"""specmon's dashboard: `streamlit run app.py`. Page files live in specmon/ui; this file only wires navigation."""
import streamlit as st

from specmon.ui.data import follow_updates

st.set_page_config(page_title="specmon", page_icon="⚡", layout="wide")
page = st.navigation([
    st.Page("specmon/ui/overview.py", title="Overview", default=True),  # served at /
    st.Page("specmon/ui/acceptance.py", title="Acceptance", url_path="acceptance"),
    st.Page("specmon/ui/economics_page.py", title="Economics", url_path="economics"),
    st.Page("specmon/ui/drift_page.py", title="Drift", url_path="drift"),
    st.Page("specmon/ui/upload.py", title="Ingest", url_path="ingest"),
    st.Page("specmon/ui/live_page.py", title="Live run", url_path="live"),
    st.Page("specmon/ui/lossless_page.py", title="Losslessness", url_path="losslessness"),
    st.Page("specmon/ui/sources.py", title="Sources", url_path="sources"),
])
follow_updates()  # new data from any process reruns the page; watched sources' freshness on every page
page.run()
