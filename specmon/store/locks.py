"""Locks: many readers or one writer per database file within a process, whether another process still runs, and
the gate that lets the interpreter exit only once no thread is inside DuckDB.

DuckDB lets one process write a file, or several read it; inside one process it refuses read-only and read-write
connections to one file side by side, which the readers-writer lock here prevents.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

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


class _Interruptible(Protocol):
    def interrupt(self) -> Any: ...


def _reference_counts(items: list) -> list[int]:
    return [sys.getrefcount(item) for item in items]


_ONLY_IN_THE_LIST = _reference_counts([object()])[0]  # what an item nothing else refers to counts here


class ConnectionGate:
    """The DuckDB connections of this process, and a gate closed when the interpreter exits.

    A daemon thread (the dashboard's watcher, the outbox) may be inside DuckDB when the main thread ends: running a
    query, or destroying a connection object (its destructor lets go of the interpreter lock). Python stops such a
    thread the moment it takes the lock back, by unwinding its stack, and inside DuckDB's C++ that unwinding aborts
    the whole process (SIGABRT, "FATAL: exception not rethrown"). So:
    - a connection object is destroyed only inside an entry of the gate, or by the exiting main thread: on leaving
      its entry the gate keeps it, and lets it go once nothing else refers to it;
    - at exit the gate closes: a thread other than the main one that asks for a new entry waits there for good (a
      daemon: the process ends without it), and the exit waits for the open entries to end, interrupting their
      queries after grace_s.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open: dict[int, _Interruptible | None] = {}  # per entry: its connection once made
        self._retired: list[object] = []  # closed connections, kept until nothing else refers to them
        self._closed = False

    @contextmanager
    def entry(self) -> Iterator[Callable[[_Interruptible], None]]:
        """For the block that makes, uses and closes one connection; call the yielded function with the connection
        once it is made (an exit may interrupt it, and the gate keeps it after the block)."""
        key = object()
        main = threading.current_thread() is threading.main_thread()  # the exit itself: never held at the gate
        with self._cond:
            self._cond.wait_for(lambda: main or not self._closed)
            self._open[id(key)] = None
        unreferenced = self._sweep()
        del unreferenced  # destroyed here, inside the entry

        def made(conn: _Interruptible) -> None:
            with self._cond:
                self._open[id(key)] = conn

        try:
            yield made
        finally:
            with self._cond:
                conn = self._open.pop(id(key))
                if conn is not None:
                    self._retired.append(conn)
                del conn
                self._cond.notify_all()

    def _sweep(self) -> list[object]:
        """Take out the retired connections that nothing else refers to (the caller destroys them)."""
        with self._cond:
            counts = _reference_counts(self._retired)
            unreferenced = [c for c, n in zip(self._retired, counts, strict=True) if n <= _ONLY_IN_THE_LIST]
            self._retired = [c for c, n in zip(self._retired, counts, strict=True) if n > _ONLY_IN_THE_LIST]
        return unreferenced

    def close(self, grace_s: float = 5.0) -> None:
        """Let no thread make another entry; wait for the open ones to end, interrupting their queries after
        grace_s, and return after at most twice that (a thread that waits at the gate holding a connection is
        stopped outside DuckDB, which is safe)."""
        with self._cond:
            self._closed = True
            if not self._cond.wait_for(lambda: not self._open, grace_s):
                threading.excepthook = _quiet_about_interrupts(threading.excepthook)
                for conn in self._open.values():
                    if conn is not None:
                        conn.interrupt()
                self._cond.wait_for(lambda: not self._open, grace_s)
        del self._retired[:]  # destroyed by this thread; one a daemon still refers to goes with the interpreter


def _quiet_about_interrupts(hook: Callable[[Any], object]) -> Callable[[Any], object]:
    """A thread's exception hook that says nothing of a query the exit interrupted (the thread's own work is
    abandoned with the process, and the printing would be cut off by it)."""
    def quiet(args: Any) -> object:
        return None if type(args.exc_value).__name__ == "InterruptException" else hook(args)
    return quiet


CONNECTIONS = ConnectionGate()
atexit.register(CONNECTIONS.close)
