"""Shared helpers for the benchmarks: machine description and peak memory of a child process."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import urllib.request


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
