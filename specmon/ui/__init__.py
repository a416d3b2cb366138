"""The Streamlit dashboard: page functions that only lay out what specmon's modules compute."""
