"""How numbers, intervals and predicted beta are written, for the CLI and the pages alike.

Pure text: no I/O. A terminal writes a missing value as "-" and an interval as "[lo,hi]"; a page as "—" and
"lo – hi"; the rule for what is shown (a point, else an interval, else nothing) is the same.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Style:
    missing: str
    interval: str  # a format with {lo} and {hi}


TERMINAL = Style("-", "[{lo},{hi}]")
PAGE = Style("—", "{lo} – {hi}")


def number(x: float | None, spec: str = ".3f", style: Style = TERMINAL) -> str:
    return style.missing if x is None else format(x, spec)


def interval(lo: float | None, hi: float | None, spec: str = ".3f", style: Style = TERMINAL,
             missing: str | None = None) -> str:
    """An interval, or `missing` (default: the style's) where either end is unknown."""
    if lo is None or hi is None:
        return style.missing if missing is None else missing
    return style.interval.format(lo=format(lo, spec), hi=format(hi, spec))


def beta(point: float | None, lo: float | None, hi: float | None, style: Style = TERMINAL,
         missing: str | None = None) -> str:
    """Predicted beta: the point where it is exact (dense distributions), else its interval (top-k logprobs), else
    `missing` (nothing logged)."""
    if point is not None:
        return number(point, ".3f", style)
    return interval(lo, hi, ".3f", style, missing)
