"""Reading JSON Lines of objects, with a fault for each line that is not one."""
from __future__ import annotations

from collections.abc import Iterator

import orjson

from specmon.faults import Fault


def objects(path: str, name: str) -> Iterator[tuple[int, dict | None, Fault | None]]:
    """(line number, object, None) for each non-blank line, or (line number, None, fault) where it is not a JSON
    object."""
    with open(path, "rb") as fh:
        for no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                yield no, None, Fault(name, no, "", f"invalid JSON ({exc})")
                continue
            if not isinstance(obj, dict):
                yield no, None, Fault(name, no, "", f"expected a JSON object, got {type(obj).__name__}")
                continue
            yield no, obj, None
