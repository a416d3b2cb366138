"""What `specmon serve` runs: Streamlit's App around the dashboard script (app.py), with a start-up hook.

A page's first run imports pandas, Altair and specmon's queries (about half a second), reads the watched sources'
health (every page shows it), runs the Overview's summary query and pays for first uses in Streamlit and Altair
(about 0.15 s); the hook does all of it in the background as the server starts, so it happens while the browser
is still fetching and starting Streamlit's frontend, not after it asks for the first page (the queries' results
go into the app's cache, where the page finds them).
The server also answers /metrics: specmon's own Prometheus series (specmon.verdicts.metrics), on the dashboard's port.
`streamlit run app.py` works as well, without the head start or /metrics.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import streamlit as st
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from specmon.core.resources import APP

_HEAD_START = "specmon-head-start"


def prepare_first_page() -> None:
    # A head start only: the page imports, queries and draws all of this again and shows what failed. So nothing
    # here may end in a traceback, not even an import cut short because a signal is ending the server meanwhile
    # (an import that registers an exit handler then raises RuntimeError).
    try:
        from specmon.ui import data
        from specmon.ui.app import configure_page
        from specmon.ui.views import overview  # the default page, and through it the shared data module

        # Streamlit's first uses in a process: recognising the icon as an emoji loads its emoji catalogue, and the
        # first element walks the whole call stack (a check for a REPL). Outside a page run both are drawn nowhere.
        configure_page()
        st.empty()
        data.sources()  # in the order the page asks for them
        rows = data.summaries()
        if rows:
            overview.acceptance_chart(rows).to_dict()  # Altair's first chart builds its schema validator
    except Exception:  # noqa: BLE001
        pass


def _not_from_the_head_start(record: logging.LogRecord) -> bool:
    """Streamlit's cache warns that a thread outside a page run has no page: this one has none by design."""
    return record.threadName != _HEAD_START


_METRICS: list = []  # the /metrics registry, made on the first scrape (it opens the database)


def _scrape() -> tuple[bytes, str]:
    from specmon.core import environment
    from specmon.core.settings import METRICS_RUNS_ENV
    from specmon.store.database import Store
    from specmon.verdicts import metrics

    if not _METRICS:
        _METRICS.append(metrics.registry(Store(), int(environment.value(METRICS_RUNS_ENV))))  # type: ignore[call-overload]
    return metrics.exposition(_METRICS[0])


async def _metrics(_request: Request) -> Response:
    """specmon's own Prometheus series (specmon.verdicts.metrics), read in a worker thread: the analysis must not hold
    the server's event loop."""
    body, content_type = await run_in_threadpool(_scrape)
    return Response(body, media_type=content_type)


@asynccontextmanager
async def _head_start(_app: st.App) -> AsyncIterator[None]:
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(_not_from_the_head_start)
    threading.Thread(target=prepare_first_page, name=_HEAD_START, daemon=True).start()
    yield


app = st.App(APP, lifespan=_head_start, routes=[Route("/metrics", _metrics)])
