"""Processes specmon starts end with the process that started them, even when that one is killed outright (SIGKILL,
the OOM killer): a server child, or the workers of a calibration pool, which would otherwise wait for work forever.
Standard library only, so `specmon serve` imports it without waiting for numpy or DuckDB."""
from __future__ import annotations

import signal


def die_with_parent() -> None:
    """In a child, before it runs: ask Linux to SIGTERM it when the thread that started it ends, as it does when its
    process dies of anything (PR_SET_PDEATHSIG). Elsewhere nothing: the callers also end their children themselves
    wherever a signal can be caught."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        pass
