"""Locks: many readers or one writer per database file within a process, and whether another process still runs.

DuckDB lets one process write a file, or several read it; inside one process it refuses read-only and read-write
connections to one file side by side, which the readers-writer lock here prevents.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from specmon.core.faults import SpecmonError


def is_lock_conflict(exc: Exception) -> bool:
    return "lock" in str(exc).lower()


def pid_alive(pid: int) -> bool:
    """Whether a process runs (a leftover file named after a dead one can be removed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's
        return True
    return True


class ReadersWriterLock:
    """Many readers or one writer, within this process (DuckDB refuses read-only and read-write connections to
    one file side by side in a process)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writer)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def write(self, timeout: float | None = None) -> Iterator[None]:
        with self._cond:
            if not self._cond.wait_for(lambda: not self._writer and not self._readers, timeout):
                raise SpecmonError("the database is busy in this process")
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


_LOCKS: dict[str, ReadersWriterLock] = {}
_LOCKS_GUARD = threading.Lock()


def process_lock(path: str) -> ReadersWriterLock:
    key = os.path.realpath(path) if path != ":memory:" else path  # one lock per file, however it is spelled
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, ReadersWriterLock())
