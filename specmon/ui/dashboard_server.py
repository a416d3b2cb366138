"""What `specmon serve` runs: Streamlit's App around the dashboard script (app.py), with a start-up hook.

A page's first run imports pandas, Altair and specmon's queries (about half a second); the hook imports them in the
background as the server starts, so they load while the browser is still fetching and starting Streamlit's
frontend, not after it asks for the first page. `streamlit run app.py` works as well, without the head start.
"""
from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import streamlit as st

from specmon.resources import APP


def _import_first_page() -> None:
    import specmon.ui.overview  # noqa: F401  (the default page, and through it the shared data module)


@asynccontextmanager
async def _head_start(_app: st.App) -> AsyncIterator[None]:
    threading.Thread(target=_import_first_page, name="specmon-imports", daemon=True).start()
    yield


app = st.App(APP, lifespan=_head_start)
