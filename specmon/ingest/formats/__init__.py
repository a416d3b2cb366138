"""One module per input format; each tells its input apart (sniff) and reads it into the store (Reader).

What a format module defines is in specmon.ingest.formats.base. Modules are found here by their SNIFF_ORDER, so adding a
format is adding its module (and its tests); ingest needs no change.
"""
from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from types import ModuleType

import orjson

from specmon.ingest.formats import textio

_SNIFF_BYTES = 1 << 20  # a block of the content that every format is tried on


@cache
def modules() -> tuple[ModuleType, ...]:
    """The format modules, in the order detection tries them."""
    found = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    return tuple(sorted((m for m in found if hasattr(m, "SNIFF_ORDER")), key=lambda m: m.SNIFF_ORDER))


def names() -> tuple[str, ...]:
    return tuple(f for m in modules() for f in m.FORMATS)


def module(fmt: str) -> ModuleType:
    return next(m for m in modules() if fmt in m.FORMATS)


class Unrecognised(Exception):
    """No format claims the file: args[0] says what the file looks like and what specmon expected."""


class Empty(Exception):
    """The file holds nothing (no bytes, or only blank lines)."""


def detect(path: str) -> str:
    """The file's format, from its content (decompressed where it is gzip, without a BOM) from its first line that
    is not blank: every format is tried on the first block of it, and the formats whose lines may come anywhere
    (SCAN_ANYWHERE: a server log after its start-up lines) and those whose scan_after(first block) says so (a
    Prometheus page after its comments and other series) on each block after it, as far as the file goes. Linear
    in the file's size: each block is read and tried once. Raises Empty or Unrecognised."""
    found = textio.blocks(path, _SNIFF_BYTES)
    head = next(found, b"")
    if not head.strip():
        if textio.is_gzip(path) and not textio.head(path, 1):
            with open(path, "rb") as fh:
                if len(fh.read(64)) > 20:  # more than an empty gzip stream's header and trailer
                    raise Unrecognised("a gzip file that cannot be decompressed")
        raise Empty()
    for m in modules():
        fmt = m.sniff(head)
        if fmt:
            return fmt
    anywhere = [m for m in modules() if getattr(m, "SCAN_ANYWHERE", False)
                or getattr(m, "scan_after", lambda _: False)(head)]
    for block in found:
        for m in anywhere:
            fmt = m.sniff(block)
            if fmt:
                return fmt
    raise Unrecognised(describe(head))


_EXPECTED = ("specmon reads step logs (JSON Lines: one object per line with request_id, draft_tokens, accepted), "
             "the flat form (CSV or Parquet with request_id, step, position, draft_token, accepted), load sweeps "
             "(CSV or JSON Lines with run, k, concurrency, output_tokens_per_s), vLLM, llama.cpp or SGLang logs and "
             "JSON responses, and Prometheus pages")


def _separator(first: bytes) -> str | None:
    """The name of the separator of a header line of several names split by semicolons or tabs, else None."""
    text = first.decode("utf-8", "replace").strip()
    for sep, name in ((";", "semicolons"), ("\t", "tabs")):
        names = [n.strip().strip('"') for n in text.split(sep)]
        if len(names) > 1 and all(n and len(n) <= 64 and n.replace("_", "").replace(" ", "").isalnum() for n in names):
            return name
    return None


def describe(head: bytes) -> str:
    """What a file that no format claims looks like, and what specmon expected instead."""
    from specmon.ingest.formats.flat import csv_header_names

    if b"\x00" in head[:4096] or head[:4096].decode("utf-8", "replace").count("\ufffd") > 16:
        seen = "binary data (not text, gzip or Parquet)"
    else:
        first = next((line for line in head.splitlines() if line.strip()), b"").strip()
        try:
            value = orjson.loads(first)
        except orjson.JSONDecodeError:
            value = ...
        if first[:1] == b"[":
            seen = "a JSON array; step logs are JSON Lines, one object per line, not one array"
        elif value is not ... and not isinstance(value, dict):
            seen = f"lines of JSON values ({type(value).__name__}), not JSON objects"
        elif names := csv_header_names(head):
            seen = f"a CSV file with the columns {', '.join(names[:8])}, none of the flat form's"
        elif (sep := _separator(first)) is not None:
            seen = (f"a table separated by {sep} (its header: {first.decode('utf-8', 'replace')[:80]!r}); specmon "
                    "reads comma-separated CSV: convert it, e.g. with python -c \"import pandas as pd, sys; "
                    "pd.read_csv(sys.argv[1], sep=None, engine='python').to_csv(sys.argv[2], index=False)\" IN OUT")
        else:
            seen = "a text file without speculative-decoding lines (a server log with speculative decoding " \
                   "off, or logging below INFO?)"
    return f"this looks like {seen}; {_EXPECTED}"
