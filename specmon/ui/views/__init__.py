"""The dashboard's pages, one file each; Streamlit runs them by path (st.navigation in specmon/ui/app.py)."""
