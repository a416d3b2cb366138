"""Following a file like `tail -F`: only complete lines are read (a half-written last line waits for its newline); a
rename rotation is noticed by the inode behind the path changing (the rest of the old file is read first, found by
its inode in the same folder), a truncation by the file shrinking below the read position, and a new file behind a
reused inode by its first bytes changing. Pure file reading: where a source stands is kept by follow.positions."""
from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field

from specmon.core.faults import SpecmonError

# What a poll reads from one file: a backlog is taken in pieces of about this size, each its own transaction,
# so the database is free for the dashboard between them. A single line may be longer, up to MAX_LINE_BYTES
# (a step log with full distributions has lines of megabytes).
READ_BYTES = 1 << 20


MAX_LINE_BYTES = 64 << 20


# How long the first bytes of a file must be to identify it (a new file behind a reused inode).
_HEAD_BYTES = 64


@dataclass
class Position:
    """Where a followed source stands, as stored in watch_sources."""

    file_id: str | None = None
    head_sha: str | None = None
    offset: int = 0
    line_no: int = 0
    state: dict = field(default_factory=dict)


def file_identity(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


def head_digest(path: str) -> str | None:
    with open(path, "rb") as fh:
        head = fh.read(_HEAD_BYTES)
    return hashlib.sha256(head).hexdigest() if len(head) == _HEAD_BYTES else None


def find_by_inode(path: str, file_id: str) -> str | None:
    """Where a rotated file went: the entry of the same folder that has its inode (path.1, path-2026...)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        entries = os.scandir(folder)
    except OSError:
        return None
    with entries:
        for entry in entries:
            try:
                if entry.is_file() and file_identity(entry.stat()) == file_id:
                    return entry.path
            except OSError:
                continue
    return None


@dataclass
class Chunk:
    """Complete lines read from one file: bytes [start, end) of the file whose identity is file_id."""

    path: str
    file_id: str
    head_sha: str | None
    start: int
    end: int
    first_line: int
    data: bytes

    def lines(self):
        for i, raw in enumerate(self.data.splitlines(keepends=True)):
            yield self.first_line + i, raw

    def dedupe_key(self, source_key: str) -> str:
        """What makes storing this piece twice a no-op: the source, the file's identity and the byte range."""
        return f"watch:{source_key}:{self.file_id}:{self.head_sha}:{self.start}-{self.end}"

    @property
    def backlog(self) -> bool:
        """Whether the piece was cut at the read size, so more is probably waiting."""
        return self.end - self.start >= READ_BYTES // 2


def next_chunk(path: str, pos: Position) -> tuple[Chunk | None, Position]:
    """The next complete lines after pos, following rotation and truncation. Returns the chunk (None when there
    is nothing new) and the position to read from if there is nothing in it (a reset after a truncation)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        old = find_by_inode(path, pos.file_id) if pos.file_id else None
        if old:  # rotated away and not yet re-created: finish the old file
            return read_from(old, pos, os.stat(old)), pos
        raise SpecmonError(f"{path}: no such file (waiting for it to appear)") from None
    if os.path.isdir(path):
        raise SpecmonError(f"{path}: is a directory, not a log file")
    if not stat.S_ISREG(st.st_mode):
        raise SpecmonError(f"{path}: not a regular file (a pipe or a device): a watched log is a file that grows; "
                           "to store what a pipe carries, give it to specmon ingest")
    current = file_identity(st)
    if pos.file_id is not None and current != pos.file_id:
        old = find_by_inode(path, pos.file_id)
        if old:
            chunk = read_from(old, pos, os.stat(old))
            if chunk is not None:
                return chunk, pos  # drain what the old file still holds before switching
        pos = Position(state=pos.state)  # a new file: from its start, the reader's carry-over kept
    elif pos.file_id is not None and (st.st_size < pos.offset or (pos.head_sha and head_digest(path) != pos.head_sha)):
        pos = Position(state=pos.state)  # truncated (copytruncate), or another file behind the same inode
    return read_from(path, pos, st), pos


def read_from(path: str, pos: Position, st: os.stat_result) -> Chunk | None:
    if st.st_size <= pos.offset:
        return None
    with open(path, "rb") as fh:
        fh.seek(pos.offset)
        data = fh.read(READ_BYTES)
        while _last_line_end(data) < 0 and len(data) < MAX_LINE_BYTES:
            more = fh.read(READ_BYTES)
            if not more:
                return None  # a half-written line waits for its line end
            data += more
    cut = _last_line_end(data)
    if cut < 0:
        raise SpecmonError(f"{path}: line {pos.line_no + 1} is longer than {MAX_LINE_BYTES} bytes (at byte "
                           f"{pos.offset}); the source stops there")
    data = data[:cut + 1]
    return Chunk(path, file_identity(st), head_digest(path), pos.offset, pos.offset + len(data), pos.line_no + 1, data)


def _last_line_end(data: bytes) -> int:
    """Where the last complete line of data ends (-1: none yet): at LF, or at a lone CR, as the ingest reads lines
    (specmon.ingest.formats.textio). A CR that is the last byte read may be the first half of a CR LF written in
    two pieces, so it ends its line only once the next byte is there."""
    return max(data.rfind(b"\n"), data.rfind(b"\r", 0, len(data) - 1))


def position_after(chunk: Chunk, pos: Position, state: dict) -> Position:
    # lines as Chunk.lines counts them: a lone CR ends a line too, as in the ingest (specmon.ingest.formats.textio)
    return Position(chunk.file_id, chunk.head_sha or pos.head_sha, chunk.end, chunk.first_line - 1
                    + len(chunk.data.splitlines()), state)
