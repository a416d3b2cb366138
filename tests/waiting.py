"""Waiting on real processes: poll a condition until it holds, or fail saying what never happened."""
import time
from pathlib import Path


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie (a dead child nobody has reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def until(condition, timeout: float = 60.0, what: str = "condition", every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
