"""Opening input files the same way for every reader: gzip read transparently, a UTF-8 BOM dropped, lines bounded."""
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


def lines(path: str, max_bytes: int) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, bytes, too_long) for each line; a line longer than max_bytes is cut there and the rest of it
    skipped without being held in memory. Raises Unreadable for a corrupt gzip stream."""
    try:
        with open_binary(path) as fh:
            no = 0
            while raw := fh.readline(max_bytes + 1):
                no += 1
                if no == 1 and raw.startswith(BOM):
                    raw = raw[len(BOM):]
                if len(raw) > max_bytes and not raw.endswith(b"\n"):
                    while (rest := fh.readline(1 << 16)) and not rest.endswith(b"\n"):
                        pass
                    yield no, raw[:max_bytes], True
                else:
                    yield no, raw, False
    except (OSError, EOFError, zlib.error) as exc:
        raise Unreadable(f"cannot be read ({exc})") from None
