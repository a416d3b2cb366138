"""Shared helpers for the benchmarks: machine description, peak memory of a child process, and results kept as cells
of JSON (run one by one, joined from several runs)."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable


def machine() -> str:
    import duckdb
    import numpy

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB; Python {platform.python_version()}, "
            f"numpy {numpy.__version__}, duckdb {duckdb.__version__}")


def run_cells(header: dict, cells: Iterable[Callable[[], dict]], out: str | None) -> dict:
    """header with its "cells": each cell's figures with its wall seconds, printed as a JSON line as it ends (a long
    run shows its progress), and the whole written to out where given."""
    result = {**header, "cells": []}
    for cell in cells:
        t0 = time.time()
        figures = cell()
        figures["wall_s"] = round(time.time() - t0, 1)
        result["cells"].append(figures)
        print(json.dumps(figures), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def merge_cells(paths: list[str], out: str) -> None:
    """The results at paths joined into one at out: the first's header, every result's cells."""
    parts = []
    for path in paths:
        with open(path) as f:
            parts.append(json.load(f))
    with open(out, "w") as f:
        json.dump({**parts[0], "cells": [cell for part in parts for cell in part["cells"]]}, f, indent=1)


def episode_starts(alarms: list[int], gap: int) -> list[int]:
    """The first alarm of each episode: alarms within `gap` points of the previous alarm continue its episode (as
    the detector, the webhooks and the Drift page count them)."""
    return [t for i, t in enumerate(alarms) if i == 0 or t - alarms[i - 1] > gap]


def run_child(code: str) -> dict:
    """Run Python code in a fresh process; it must print one JSON object. Adds wall seconds and peak RSS."""
    # VmHWM, the peak of this process's own memory: ru_maxrss would also count the parent's peak, which Linux
    # carries over into a child that Python starts with vfork and exec.
    wrapper = code + ("\nimport json as _j\nprint(_j.dumps({'peak_rss_mb': int(next(l.split()[1] for l in "
                      "open('/proc/self/status') if l.startswith('VmHWM:'))) / 1024}))")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", wrapper], check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    result = {}
    for line in out.splitlines():
        if line.startswith("{"):
            result.update(json.loads(line))
    result["wall_s"] = wall
    return result


def wait_healthy(url: str, pause_s: float = 0.1) -> None:
    """Block until a Streamlit server at url answers its health endpoint."""
    while True:
        try:
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
            return
        except OSError:
            time.sleep(pause_s)
