"""Waiting on real processes: poll a condition until it holds, or fail saying what never happened."""
import time


def until(condition, timeout: float = 60.0, what: str = "condition", every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
