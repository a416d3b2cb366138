"""Opening input files the same way for every reader: gzip read transparently, a UTF-8 BOM dropped, lines bounded.

A line ends at LF, CR or CRLF (bytes.splitlines' ends): a log written through a terminal or from Windows, or one
whose progress output ends lines with a lone CR, splits into the lines an editor shows, numbered as it numbers them.
"""
from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator

GZIP_MAGIC = b"\x1f\x8b"
BOM = b"\xef\xbb\xbf"


def is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def open_binary(path: str) -> gzip.GzipFile | io.BufferedReader:
    """The file's bytes, decompressed where it is gzip (told by its magic bytes, whatever its name)."""
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def head(path: str, size: int) -> bytes:
    """Up to `size` first bytes of the content (decompressed), without a BOM; b"" where gzip is corrupt. Read in
    chunks, so a small file never costs a buffer of `size`."""
    chunks, got = [], 0
    with open_binary(path) as fh:  # a file that cannot be opened is the caller's error to report
        try:
            while got < size and (chunk := fh.read(min(1 << 20, size - got))):
                chunks.append(chunk)
                got += len(chunk)
        except (OSError, EOFError, zlib.error):  # a corrupt gzip stream
            return b""
    data = b"".join(chunks)
    return data[len(BOM):] if data.startswith(BOM) else data


class Unreadable(Exception):
    """The file's bytes cannot be read as what it claims to be (a corrupt gzip stream)."""


_CHUNK = 1 << 20


def lines(path: str, max_bytes: int) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, bytes with its line end, too_long) for each line; a line longer than max_bytes is cut there and
    the rest of it skipped without being held in memory. Raises Unreadable for a corrupt gzip stream."""
    try:
        with open_binary(path) as fh:
            yield from _numbered(_split(fh, max_bytes))
    except (OSError, EOFError, zlib.error) as exc:
        raise Unreadable(f"cannot be read ({exc})") from None


def _numbered(split: Iterator[tuple[bytes, bool]]) -> Iterator[tuple[int, bytes, bool]]:
    for raw, too_long in split:  # the first line, without its BOM
        yield 1, raw.removeprefix(BOM), too_long
        break
    for no, (raw, too_long) in enumerate(split, start=2):
        yield no, raw, too_long


def _split(fh: io.BufferedIOBase, max_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """The stream's lines, read a chunk at a time: a line not yet ended is carried into the next chunk (a CR at a
    chunk's end too, in case an LF follows), or cut once longer than max_bytes."""
    rest = b""
    skipping = False  # inside a line already cut: its remainder is dropped up to its end
    while chunk := fh.read(_CHUNK):
        parts = (rest + chunk if rest else chunk).splitlines(keepends=True)
        rest = parts.pop()
        if rest.endswith(b"\n"):
            parts.append(rest)
            rest = b""
        first = 0
        if skipping and parts:
            first, skipping = 1, False  # parts[0] is the rest of the line cut before
        for part in parts[first:] if first else parts:
            if len(part) > max_bytes and len(part.rstrip(b"\r\n")) > max_bytes:
                yield part[:max_bytes], True
            else:
                yield part, False
        if skipping:
            rest = rest[-1:] if rest.endswith(b"\r") else b""  # still inside the cut line (its CR may end it)
        elif len(rest.rstrip(b"\r")) > max_bytes:
            yield rest[:max_bytes], True
            skipping, rest = True, rest[-1:] if rest.endswith(b"\r") else b""
    if rest and not skipping:
        yield (rest[:max_bytes], True) if len(rest.rstrip(b"\r")) > max_bytes else (rest, False)


def blocks(path: str, size: int) -> Iterator[bytes]:
    """The content (decompressed, without a BOM) in blocks of about `size` bytes that end at line ends (a line
    longer than a block is split), from its first line that is not blank: detection reads a file with a page of
    blank lines or of start-up lines before its first recognisable one as far as it needs to, each byte once.
    Stops at a corrupt gzip stream."""
    try:
        with open_binary(path) as fh:
            pending, started, first = b"", False, True
            while chunk := fh.read(size):
                if first:
                    chunk, first = chunk.removeprefix(BOM), False
                if not started:
                    chunk = chunk.lstrip()
                    if not chunk:
                        continue
                    started = True
                data = pending + chunk if pending else chunk
                end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
                if end == 0 and len(data) < 2 * size:
                    pending = data
                    continue
                end = end or len(data)
                pending = data[end:]
                yield data[:end]
            if pending:
                yield pending
    except (OSError, EOFError, zlib.error):  # a corrupt gzip stream
        return
