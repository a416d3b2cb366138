"""specmon's dashboard: `streamlit run app.py`. Pages live in specmon/ui; this file only wires navigation."""
import streamlit as st

from specmon.ui import overview

st.set_page_config(page_title="specmon", page_icon="⚡", layout="wide")
st.navigation([st.Page(overview.render, title="Overview", url_path="overview", default=True)]).run()
