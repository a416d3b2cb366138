"""specmon's dashboard from a checkout: `streamlit run app.py`. The entry itself is specmon/ui/app.py."""
from specmon.ui.app import main

main()
