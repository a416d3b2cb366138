"""Times, read one way everywhere: specmon stores naive datetimes that mean UTC.

A naive ISO-8601 time (no zone) is UTC, never the machine's local time; an aware one is converted to UTC; epoch
seconds are UTC by definition. Pure: no I/O, nothing imported from the rest of specmon.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

_DURATION_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def utc_now() -> datetime:
    """Now, as a naive UTC datetime."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def as_utc(ts: datetime) -> datetime:
    """A datetime as naive UTC: an aware one converted, a naive one taken to be UTC already."""
    return ts.astimezone(timezone.utc).replace(tzinfo=None) if ts.tzinfo else ts


def parse_iso(text: str) -> datetime:
    """An ISO-8601 time ('Z' or an offset, or none: UTC) as naive UTC; ValueError if it is not one."""
    return as_utc(datetime.fromisoformat(text))


def from_epoch(seconds: float) -> datetime:
    """Epoch seconds as naive UTC."""
    return datetime.fromtimestamp(seconds, tz=timezone.utc).replace(tzinfo=None)


def parse_timestamp(value: str | float) -> datetime:
    """A timestamp as a log gives it: an ISO-8601 string (naive is UTC) or epoch seconds; ValueError or TypeError
    if it is neither (a bool is not a number here)."""
    if isinstance(value, bool):
        raise TypeError("a boolean is not a time")
    if isinstance(value, int | float):
        return from_epoch(value)
    return parse_iso(value)


def parse_duration(text: str) -> timedelta | None:
    """'30s', '1m', '6h', '2d', '1w' as a timedelta; None if the text is not such a duration."""
    if text[:-1].replace(".", "", 1).isdigit() and text[-1:] in _DURATION_UNITS:
        return timedelta(**{_DURATION_UNITS[text[-1]]: float(text[:-1])})
    return None


def parse_since(text: str) -> datetime | None:
    """A duration before now ('6h', '2d', '30m', '1w') or an ISO-8601 time, as naive UTC; None if it is neither."""
    ago = parse_duration(text)
    if ago is not None:
        return utc_now() - ago
    try:
        return parse_iso(text)
    except ValueError:
        return None
