"""The environment variables specmon reads, declared in one table, each read and checked in one place: a value that
cannot be what its variable means is an error that names the variable and says what it takes, never a traceback
or a silent fallback."""
from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from specmon.core.faults import SpecmonError
from specmon.core.settings import (
    DB_ENV,
    DEFAULT_DB,
    DEFAULT_LOCK_TIMEOUT_S,
    DEFAULT_METRICS_RUNS,
    LOCK_TIMEOUT_ENV,
    MEMORY_LIMIT,
    MEMORY_LIMIT_ENV,
    METRICS_RUNS_ENV,
    REFRESH_ENV,
)

# DuckDB's notation for memory_limit: a size with its unit, or a share of the machine's memory.
_SIZE = re.compile(r"\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*|\s*\d+(\.\d+)?\s*%\s*", re.IGNORECASE)


def _seconds(lo: float, hi: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"expected a number of seconds from {lo:g} to {hi:g}") from None
        if not math.isfinite(value) or not lo <= value <= hi:
            raise ValueError(f"expected a number of seconds from {lo:g} to {hi:g}")
        return value
    return parse


def _memory(text: str) -> str:
    if not _SIZE.fullmatch(text):
        raise ValueError("expected a size in DuckDB's notation, like 512MB, 4GB or 50%")
    return text.strip()


def _path(text: str) -> str:
    if not text.strip() or "\x00" in text:
        raise ValueError("expected the path of a database file")
    return text


def _count(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError("expected a whole number of at least 1")
    return int(text)


@dataclass(frozen=True)
class Variable:
    name: str
    parse: Callable[[str], object]
    default: object
    meaning: str


VARIABLES = {v.name: v for v in (
    Variable(DB_ENV, _path, DEFAULT_DB, "the database file where --db names none"),
    Variable(LOCK_TIMEOUT_ENV, _seconds(0, 1e6), DEFAULT_LOCK_TIMEOUT_S,
             "how long a command waits while another process writes the database"),
    Variable(MEMORY_LIMIT_ENV, _memory, MEMORY_LIMIT, "DuckDB's memory cap for every specmon connection"),
    Variable(REFRESH_ENV, _seconds(0.1, 3600), 2.0, "how often an open dashboard page looks for new data"),
    Variable(METRICS_RUNS_ENV, _count, DEFAULT_METRICS_RUNS, "how many runs specmon's /metrics exports"),
)}


def value(name: str) -> object:
    """The variable's value, its default where it is unset or empty; SpecmonError naming it where it is wrong."""
    var = VARIABLES[name]
    text = os.environ.get(name)
    if text is None or text == "":
        return var.default
    try:
        return var.parse(text)
    except ValueError as exc:
        raise SpecmonError(f"{name}={text[:60]!r}: {exc} ({var.meaning}); unset it for the default "
                           f"{var.default}") from None
