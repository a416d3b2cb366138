"""The DuckDB store: the one object that owns a database file's connections, and its transactions.

No process holds the database file longer than one operation. DuckDB lets one process write a file, or several
read it, at a time; a dashboard that kept its connection open would lock every other specmon process out. So each
read opens a read-only connection, runs, and closes it; each write opens a read-write connection for one
transaction and closes it. An operation that finds the file locked by another process waits, a bounded and
configurable time (`SPECMON_LOCK_TIMEOUT`, default 60 s), saying once that it is waiting. Inside one process a
readers-writer lock keeps read-only and read-write connections from overlapping (DuckDB refuses mixed
configurations in one process). Long work (staging a large step log) happens in a separate staging file, so the
main file is locked only for the short transaction that publishes it. At exit the process waits until no
thread is inside DuckDB (locks.ConnectionGate), which a daemon thread would otherwise abort.
Every query is parameterised: nothing from user input is pasted into SQL.
"""
from __future__ import annotations

import errno
import glob
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from specmon.core import environment, settings
from specmon.core.faults import SpecmonError
from specmon.core.settings import DB_ENV, LOCK_TIMEOUT_ENV
from specmon.store.locks import CONNECTIONS, is_lock_conflict, pid_alive, process_lock
from specmon.store.schema import SCHEMA_VERSION, STAGING_DDL, migrate, schema_version


def default_db_path() -> str:
    """`SPECMON_DB` if set, else specmon.duckdb in the current directory."""
    return str(environment.value(DB_ENV))


def connect(path: str, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open a DuckDB file with specmon's session settings (UTC timestamps, a memory cap). Raises DuckDB's
    IOException when another process holds a conflicting lock (Store waits and retries)."""
    if path != ":memory:" and not read_only:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = duckdb.connect(path, read_only=read_only)
    conn.execute("SET TimeZone = 'UTC'")
    conn.execute("SET memory_limit = ?", [environment.value(settings.MEMORY_LIMIT_ENV)])
    # DuckDB draws a progress bar on stdout for queries over two seconds, into `--json` output and pipes
    conn.execute("SET enable_progress_bar = false")
    return conn


@contextmanager
def query_progress(conn: duckdb.DuckDBPyConnection, progress: Callable[[int, int], None] | None, total: int,
                   every_s: float = 0.5) -> Iterator[None]:
    """While the block runs its queries on `conn`, report DuckDB's own estimate of how far the running query has
    got, as a share of `total` (progress(done, total), from a polling thread, never moving backwards), so that a
    load done by one long query still shows progress. The estimate is DuckDB's: for a file scan, the share of the
    file read."""
    if progress is None:
        yield
        return
    conn.execute("SET enable_progress_bar = true")  # DuckDB tracks progress only with its bar on;
    conn.execute("SET enable_progress_bar_print = false")  # the bar itself is never drawn (see connect)
    stop = threading.Event()

    def poll() -> None:
        best = 0
        while not stop.wait(every_s):
            share = conn.query_progress()  # percent; -1 while no query runs or it cannot tell
            done = int(total * min(share, 100.0) / 100) if share > 0 else 0
            if done > best:
                best = done
                progress(best, total)

    poller = threading.Thread(target=poll, name="specmon-query-progress", daemon=True)
    poller.start()
    try:
        yield
    finally:
        stop.set()
        poller.join()
        conn.execute("SET enable_progress_bar = false")



def storage_fault(path: str, exc: BaseException) -> SpecmonError | None:
    """What a failure of the database's storage means for the user, naming the file and what to do; None for any
    other error (a bug, or a fault in a file being read, is not passed off as the database's). DuckDB reports a
    full disk, a damaged file or a folder it cannot write as several exception classes, so the message tells them
    apart, and a damaged or unwritable file counts only when the message names the database (or the files beside
    it: its write-ahead log, staging files)."""
    text = str(exc)
    first = text.splitlines()[0] if text else type(exc).__name__
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC or "No space left on device" in text:
        where = exc.filename if isinstance(exc, OSError) and exc.filename else path
        return SpecmonError(f"the disk holding {where} is full ({first}); the write that hit it stored nothing: "
                            f"free space there, or give --db a database on another disk, and run it again")
    if not isinstance(exc, duckdb.Error) or os.path.basename(path) not in text:
        return None
    if "not a valid DuckDB database" in text or "Could not read enough bytes" in text or "Corrupt" in text:
        return SpecmonError(f"{path}: the database file is damaged or is not a DuckDB database ({first}); restore "
                            f"it from a copy, or move it aside and start a new one (specmon ingest --db NEW FILE)")
    if "Permission denied" in text or "Read-only file system" in text:
        folder = os.path.dirname(os.path.abspath(path))
        return SpecmonError(f"{path}: cannot write the database or the files it keeps beside it in {folder} "
                            f"({first}); make that folder writable, or give --db a database in a writable folder")
    return None


@contextmanager
def storage_errors(path: str) -> Iterator[None]:
    """Inside the block, a failure of the database's storage becomes a SpecmonError saying what to do."""
    try:
        yield
    except (duckdb.Error, OSError) as exc:
        fault = storage_fault(path, exc)
        if fault is None:
            raise
        raise fault from None


def _say_waiting(message: str) -> None:
    print(f"specmon: {message}", file=sys.stderr, flush=True)


class Store:
    """A specmon database file. Holds no connection between operations: reads and writes each open one.

    lock_timeout: how long an operation waits for another process's lock (default $SPECMON_LOCK_TIMEOUT or 60 s);
    on_wait: told once per operation that it is waiting (default: one line on stderr). create=False: a file that
    does not exist is an error (a read command given a mistyped path must not leave a new database behind).
    A full disk, a damaged file or a folder that cannot be written is a SpecmonError naming the file and what to
    do, from any operation (storage_fault).
    """

    def __init__(self, path: str | None = None, *, lock_timeout: float | None = None,
                 on_wait: Callable[[str], None] | None = None, create: bool = True):
        self.path = path or default_db_path()
        if os.path.isdir(self.path):
            raise SpecmonError(f"{self.path}: is a directory, not a database file")
        if not create and self.path != ":memory:" and not os.path.exists(self.path):
            raise SpecmonError(f"no database at {self.path}: ingest a file into it first (specmon ingest --db "
                               f"{self.path} FILE) or load the demo data into it (specmon demo --db {self.path})")
        if lock_timeout is None:
            lock_timeout = float(environment.value(LOCK_TIMEOUT_ENV))  # type: ignore[arg-type]
        self.lock_timeout = lock_timeout
        self.on_wait = on_wait or _say_waiting
        self._lock = process_lock(self.path)
        self._memory = duckdb.connect(":memory:") if self.path == ":memory:" else None
        self._writes = 0
        self._local = threading.local()
        if self._memory is not None or not self._schema_is_current():
            with self._connection(read_only=False) as conn:
                migrate(conn, self.path)
        self._sweep_staging()

    def _schema_is_current(self) -> bool:
        """Whether the file exists at this specmon's schema, read on a read-only connection: opening the file
        for writing only to find nothing to migrate would cost every command a write lock and a connection."""
        if not os.path.exists(self.path) or os.path.getsize(self.path) == 0:
            return False
        with self._connection(read_only=True) as conn:
            return schema_version(conn) == SCHEMA_VERSION

    # -- connections ---------------------------------------------------------------------------------------
    def _open(self, read_only: bool, timeout: float | None = None) -> duckdb.DuckDBPyConnection:
        """Connect, waiting while another process holds a conflicting lock (timeout: this long and silently, for
        a write that may be skipped; default lock_timeout, saying so)."""
        if self._memory is not None:
            return self._memory.cursor()
        read_only = read_only and os.path.exists(self.path)
        deadline = time.monotonic() + (self.lock_timeout if timeout is None else timeout)
        delay, told = 0.01, False
        while True:
            try:
                return connect(self.path, read_only=read_only)
            except duckdb.IOException as exc:
                if not is_lock_conflict(exc):
                    raise storage_fault(self.path, exc) or SpecmonError(
                        f"{self.path}: cannot open the database ({exc})") from None
                if time.monotonic() >= deadline:
                    raise SpecmonError(
                        f"{self.path}: still locked by another process after {self.lock_timeout:g} s "
                        f"({str(exc).splitlines()[0]}); raise {LOCK_TIMEOUT_ENV} or --lock-timeout to wait longer"
                    ) from None
                if not told and timeout is None:
                    self.on_wait(f"waiting for the database {self.path} (another process is writing it; "
                                 f"up to {self.lock_timeout:g} s)")
                    told = True
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
            except (duckdb.Error, OSError) as exc:
                raise storage_fault(self.path, exc) or SpecmonError(
                    f"{self.path}: cannot open the database ({str(exc).splitlines()[0]})") from None

    @contextmanager
    def _connection(self, read_only: bool, timeout: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        with (self._lock.read() if read_only else self._lock.write(timeout)), storage_errors(self.path), \
                CONNECTIONS.entry() as made:
            conn = self._open(read_only, timeout)
            made(conn)
            try:
                yield conn
            finally:
                conn.close()

    @property
    def generation(self) -> tuple:
        """Changes after every committed write, by any process: a cache key for query results (the file's and
        its write-ahead log's modification times and sizes, and this process's write count)."""
        stamp: list[int] = [self._writes]
        for p in (self.path, self.path + ".wal"):
            try:
                st = os.stat(p)
                stamp += [st.st_mtime_ns, st.st_size]
            except OSError:
                stamp += [0, 0]
        return tuple(stamp)

    @contextmanager
    def _shared(self, read_only: bool, timeout: float | None = None) -> Iterator[None]:
        """Operations inside the block, on this thread, share one connection (opening one costs tens of
        milliseconds, and a page, an analysis or a watcher's poll makes a dozen). A read-write block may read; a
        read-only block may not write."""
        held = getattr(self._local, "conn", None)
        if held is not None:
            if not read_only and self._local.read_only:
                raise RuntimeError("a write inside Store.reading(): end the reading block first")
            yield
            return
        with self._connection(read_only, timeout) as conn:
            self._local.conn, self._local.read_only = conn, read_only
            try:
                yield
            finally:
                self._local.conn = None

    def reading(self):
        """A block of reads on one read-only connection (the file is shared with other readers meanwhile)."""
        return self._shared(read_only=True)

    def writing(self):
        """A block of reads and transactions on one read-write connection: the file is this process's until
        the block ends, so keep it short (a watcher's poll)."""
        return self._shared(read_only=False)

    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection for a few read queries; closed (and the file released) on leaving the block, unless it
        is the one of an enclosing `reading()` or `writing()` block."""
        shared = getattr(self._local, "conn", None)
        if shared is not None:
            yield shared
            return
        with self._connection(read_only=True) as conn:
            yield conn

    def query_df(self, sql: str, params: list | None = None):
        """Run one read query and return a pandas DataFrame."""
        with self.cursor() as cur:
            return cur.execute(sql, params or []).df()

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        with self.cursor() as cur:
            return cur.execute(sql, params or []).fetchall()

    @contextmanager
    def transaction(self, attach: dict[str, str] | None = None,
                    timeout: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A write transaction: everything inside commits together or not at all. `attach` maps an alias to a
        DuckDB file opened read-only beside the database for the transaction (a load's staging file). timeout:
        give up (SpecmonError) after this many seconds without saying so, for a write that may be skipped (a cache);
        default: wait lock_timeout, saying so."""
        with self._shared(read_only=False, timeout=timeout):
            cur = self._local.conn
            for alias, path in (attach or {}).items():
                cur.execute(f"ATTACH ? AS {alias} (READ_ONLY)", [path])
            try:
                cur.execute("BEGIN TRANSACTION")
                try:
                    yield cur
                    cur.execute("COMMIT")
                    self._writes += 1
                except BaseException:
                    try:
                        cur.execute("ROLLBACK")
                    except duckdb.TransactionException:  # a COMMIT that failed (a full disk) rolled back already
                        pass
                    raise
            finally:
                for alias in attach or {}:
                    cur.execute(f"DETACH {alias}")

    # -- staging files -------------------------------------------------------------------------------------
    def _staging_pattern(self, pid: int | str) -> str:
        return f"{self.path}.stage-{pid}-*.duckdb"

    @contextmanager
    def staging(self) -> Iterator[tuple[str, duckdb.DuckDBPyConnection]]:
        """A fresh staging file of this process with the staging tables, as (path, connection). The connection
        closes when the block ends; the file stays until `discard_staging` (publish it with transaction(attach=))."""
        base = self.path if self._memory is None else os.path.join(os.environ.get("TMPDIR", "/tmp"), "specmon")
        path = f"{base}.stage-{os.getpid()}-{uuid.uuid4().hex}.duckdb"
        with storage_errors(self.path), CONNECTIONS.entry() as made:
            conn = connect(path)
            made(conn)
            try:
                conn.execute(STAGING_DDL)
                yield path, conn
            finally:
                conn.close()

    @staticmethod
    def discard_staging(path: str) -> None:
        for p in (path, path + ".wal"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def _sweep_staging(self) -> None:
        """Remove staging files left by loads whose process died (kill -9): they were never published."""
        for p in glob.glob(self._staging_pattern("*")):
            pid = p[len(self.path) + len(".stage-"):].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                self.discard_staging(p)

    def close(self) -> None:
        """Nothing is held between operations; kept so `with Store(...)` reads naturally."""
        if self._memory is not None:
            self._memory.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def is_empty(self) -> bool:
        return not self.query("SELECT count(*) FROM runs")[0][0]
