"""Definitions every segment summary shares, whether its figures come from step logs or from engine counts."""
from __future__ import annotations

import math

STATUSES = ("healthy", "at risk", "losing", "unknown")
CONFIDENCE = 0.95
# Time buckets for timelines: name -> interval (a fixed list, so no user text reaches the SQL).
BUCKETS = {"hour": "1 hour", "6 hours": "6 hours", "day": "1 day", "week": "7 days"}


def segment_status(alpha_lo: float, alpha_hi: float, break_even: float) -> str:
    """healthy: alpha's interval lies above alpha*; losing: below it; at risk: it straddles alpha*.

    break_even is nan where c > 1: then even perfect acceptance cannot pay for the drafts.
    """
    if math.isnan(break_even):
        return "losing"
    if alpha_lo > break_even:
        return "healthy"
    if alpha_hi < break_even:
        return "losing"
    return "at risk"
