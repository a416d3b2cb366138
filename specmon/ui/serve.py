"""`specmon serve`: the Streamlit server in this process, or as a child beside a watcher, and never left behind.

Streamlit runs in this process unless a watcher runs beside it; then Streamlit runs as a child in a session of its
own (so that ingesting never holds the dashboard's interpreter): SIGTERM, SIGINT and SIGHUP are passed on to it and
waited for, and the child is asked (Linux PR_SET_PDEATHSIG) to end with its parent even when that is killed
outright, so no server is left holding the port or the database. Only the standard library is imported here, so the
dashboard starts without waiting for numpy, DuckDB or pandas.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from specmon.core import resources
from specmon.core.settings import DB_ENV, METRICS_RUNS_ENV
from specmon.store.processes import die_with_parent

if TYPE_CHECKING:
    from specmon.store.database import Store


@contextmanager
def _signals_caught(handled: tuple[signal.Signals, ...],
                    then: Callable[[int], None] | None = None) -> Iterator[list[int]]:
    """Within the block, the signals in `handled` are recorded in the list it yields (and passed to `then`) instead
    of ending this process; the previous handlers come back after it."""
    caught: list[int] = []

    def record(signum: int, frame: object) -> None:
        caught.append(signum)
        if then:
            then(signum)

    previous = {s: signal.signal(s, record) for s in handled}
    try:
        yield caught
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_child(cmd: list[str], env: dict, grace_s: float = 20.0,
              on_signal: Callable[[], None] | None = None) -> int:
    """Run a long-lived child (the Streamlit server) and leave none behind: SIGTERM, SIGINT and SIGHUP are
    forwarded to it (and on_signal is called), it is waited for (killed after grace_s), and it dies with this
    process in any case.

    The child gets a session of its own, so a Ctrl-C in the terminal reaches it once, through this process."""
    child = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=die_with_parent)

    def forward(signum: int) -> None:
        child.send_signal(signum)
        if on_signal:
            on_signal()

    with _signals_caught((signal.SIGTERM, signal.SIGINT, signal.SIGHUP), forward) as caught:
        try:
            # Waited for in short steps, not one blocking wait: Python runs a signal's handler in the main thread,
            # and a signal the kernel hands to another thread (the watcher's) does not interrupt a blocking wait,
            # so the handler would not run until the child ended by itself.
            while True:
                try:
                    code = child.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    continue
        finally:
            if child.poll() is None:  # left by an exception before the child ended
                child.terminate()
            try:
                code = child.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                child.kill()
                code = child.wait()
    return 128 + caught[0] if caught else code  # ended by the signal, however the child reported it


def _streamlit_flags(overrides: dict[str, object]) -> list[str]:
    """The shipped Streamlit settings (specmon/ui/streamlit.toml), then `overrides`, as `streamlit run` flags.

    Streamlit reads .streamlit/config.toml only from the working directory and the home folder, which an installed
    specmon cannot count on, so serve passes its settings on the command line.
    """
    with open(resources.STREAMLIT_CONFIG, "rb") as f:
        settings = {f"{section}.{key}": value for section, table in tomllib.load(f).items()
                    for key, value in table.items()}
    settings.update(overrides)
    return [f"--{name}={str(value).lower() if isinstance(value, bool) else value}" for name, value in settings.items()]


def _serve_here(flags: list[str]) -> int:
    """Streamlit in this process (a second interpreter would start it a quarter of a second later). Its server
    shuts down on SIGTERM or SIGINT and raises the signal again once stopped: that is recorded here and becomes
    the exit status, as for any process ended by a signal."""
    from streamlit.web import cli as streamlit_cli

    with _signals_caught((signal.SIGTERM, signal.SIGINT)) as caught:
        streamlit_cli.main.main(args=["run", str(resources.SERVER), *flags], prog_name="streamlit",
                                standalone_mode=False)
    return 128 + caught[-1] if caught else 0  # the server raises them again last first: [-1] came first


def serve(db: str | None, address: str, port: int, watch_config: str | None, log: Callable[[str], None],
          open_store: Callable[[], Store], metrics_runs: int | None = None) -> int:
    """Run the dashboard until it ends, with `specmon watch --config watch_config` beside it where given; the
    exit status (128 + the signal that ended it). open_store opens the database as the command line does.
    The dashboard also serves specmon's own Prometheus series at /metrics (metrics_runs: how many runs)."""
    if db:
        os.environ[DB_ENV] = db  # for the server, here or in the child
    if metrics_runs is not None:
        os.environ[METRICS_RUNS_ENV] = str(metrics_runs)
    flags = _streamlit_flags({"server.address": address, "server.port": port, "server.headless": True})
    if not watch_config:
        return _serve_here(flags)
    # With a watcher, the server runs as a child, so that ingesting never holds the dashboard's interpreter.
    cmd = [sys.executable, "-m", "streamlit", "run", str(resources.SERVER), *flags]

    from specmon.follow.config import load_config
    from specmon.follow.watcher import Watcher

    config = load_config(watch_config)  # a bad file is an error before anything starts
    watcher = Watcher(open_store(), config, log=log)
    thread = threading.Thread(target=watcher.run, name="specmon-watch", daemon=True)
    thread.start()
    try:
        return run_child(cmd, dict(os.environ), on_signal=watcher.stop)
    finally:
        watcher.stop()  # the dashboard ended: finish the batch in hand
        thread.join(timeout=60)
