"""Reading JSON Lines of objects (plain or gzip, with or without a BOM), with a fault for each line that is not one."""
from __future__ import annotations

from collections.abc import Iterator

import orjson

from specmon.core.faults import Fault
from specmon.core.limits import MAX_JSON_LINE_BYTES
from specmon.ingest.formats import textio


def describe(value: object) -> str:
    """What a decoded JSON value is, in words, for messages."""
    return {list: "a JSON array", str: "a JSON string", bool: "true/false", type(None): "null", int: "a number",
            float: "a number", dict: "a JSON object"}.get(type(value), type(value).__name__)


def objects(path: str, name: str) -> Iterator[tuple[int, dict | None, Fault | None]]:
    """(line number, object, None) for each non-blank line, or (line number, None, fault) where it is not a JSON
    object. Raises textio.Unreadable for a corrupt gzip stream."""
    for no, raw, too_long in textio.lines(path, MAX_JSON_LINE_BYTES):
        if too_long:
            yield no, None, Fault(name, no, "", f"line longer than {MAX_JSON_LINE_BYTES} bytes (dense "
                                                "distributions belong in the flat form's Parquet)")
            continue
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            yield no, None, Fault(name, no, "", f"invalid JSON ({exc})")
            continue
        if not isinstance(obj, dict):
            yield no, None, Fault(name, no, "", f"expected a JSON object, got {describe(obj)}")
            continue
        yield no, obj, None


def responses(path: str, name: str) -> Iterator[tuple[int, dict | None, Fault | None]]:
    """Like objects, but a file that is one JSON document (a pretty-printed object, or a list of objects) is read
    whole: its objects all carry line 1."""
    try:
        head = textio.head(path, MAX_JSON_LINE_BYTES + 1)
        first = head.split(b"\n", 1)[0]
        try:
            orjson.loads(first)
            whole = False
        except orjson.JSONDecodeError:
            whole = head.lstrip()[:1] in (b"{", b"[")
        if not whole:
            yield from objects(path, name)
            return
    except textio.Unreadable as exc:
        yield 0, None, Fault(name, 0, "", str(exc))
        return
    if len(head) > MAX_JSON_LINE_BYTES:
        yield 1, None, Fault(name, 1, "", f"one JSON document of more than {MAX_JSON_LINE_BYTES} bytes")
        return
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        yield 1, None, Fault(name, 1, "", f"invalid JSON ({exc})")
        return
    items = doc if isinstance(doc, list) else [doc]
    for i, obj in enumerate(items):
        if isinstance(obj, dict):
            yield 1, obj, None
        else:
            yield 1, None, Fault(name, 1, f"[{i}]" if isinstance(doc, list) else "",
                                 f"expected a JSON object, got {describe(obj)}")
