"""Engines' per-request JSON responses: vLLM's metrics.speculative_decoding and llama-server's timings.

One response per line (JSON Lines), or one whole JSON document (a saved, pretty-printed response, a list of
them, or a bare llama-server `timings` object). Every size a response claims (num_spec_tokens, the length of
per_step_accepted or acceptance_histogram, the values in per_step_accepted) is checked against its bound before
anything of that size is built.
"""
from __future__ import annotations

import math
from datetime import datetime

from specmon.core import times
from specmon.core.faults import Fault, RowFault
from specmon.core.limits import MAX_COUNT, MAX_ENGINE_K
from specmon.ingest.formats import jsonlines
from specmon.ingest.formats.engine_window import EngineWindow, WindowReader

FORMATS = ("engine-json",)
SOURCE = "engine"
SNIFF_ORDER = 10
# Epoch seconds of 0001-01-02 and 9999-12-30: a `created` outside cannot be a date.
_MIN_EPOCH, _MAX_EPOCH = -62135510400, 253402041600


def _count(name: str, v: object, bound: int = MAX_COUNT) -> int:
    if type(v) is float and v.is_integer():
        v = int(v)
    if type(v) is not int or not 0 <= v <= bound:
        raise RowFault(name, f"expected an integer count from 0 to {bound}, got {v!r}"[:200])
    return v


def _rate(name: str, v: object) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 1:
        raise RowFault(name, f"expected a rate between 0 and 1, got {v!r}"[:200])
    return float(v)


def _created(obj: dict) -> datetime | None:
    v = obj.get("created")
    if v is None:
        return None
    if type(v) not in (int, float) or not math.isfinite(v) or not _MIN_EPOCH <= v <= _MAX_EPOCH:
        raise RowFault("created", f"expected epoch seconds of a date, got {v!r}"[:200])
    return times.from_epoch(v)


def _vllm_request(spec: dict, no: int, ts: datetime | None, labels: dict) -> EngineWindow:
    f = "speculative_decoding."
    steps = _count(f + "num_spec_steps", spec.get("num_spec_steps"))
    drafted = _count(f + "num_draft_tokens", spec.get("num_draft_tokens"))
    accepted = _count(f + "num_accepted_draft_tokens", spec.get("num_accepted_draft_tokens"))
    if accepted > drafted:
        raise RowFault(f + "num_accepted_draft_tokens", f"{accepted} accepted of {drafted} drafted tokens")
    k = _count(f + "num_spec_tokens", spec["num_spec_tokens"], MAX_ENGINE_K) \
        if spec.get("num_spec_tokens") is not None else None
    per_pos = None
    if spec.get("per_step_accepted") is not None:
        acc = spec["per_step_accepted"]
        if type(acc) is not list:
            raise RowFault(f + "per_step_accepted", "expected a list of counts")
        acc = [_count(f + "per_step_accepted", a, k or MAX_ENGINE_K) for a in acc]
        width = k or max(acc, default=0)
        # Steps whose accepted prefix reached position i, for i = 1..width, from a histogram of prefix lengths.
        hist = [0] * (width + 1)
        for a in acc:
            hist[a] += 1
        per_pos = [float(sum(hist[i:])) for i in range(1, width + 1)]
    elif spec.get("acceptance_histogram") is not None:
        hist = spec["acceptance_histogram"]  # hist[n]: steps that accepted exactly n
        if type(hist) is not list or not 1 <= len(hist) <= MAX_ENGINE_K + 1:
            raise RowFault(f + "acceptance_histogram", f"expected a list of 1 to {MAX_ENGINE_K + 1} counts")
        hist = [_count(f + "acceptance_histogram", h) for h in hist]
        per_pos = [float(sum(hist[i:])) for i in range(1, len(hist))]
    mean_len = spec.get("mean_acceptance_length")
    if mean_len is not None and (type(mean_len) not in (int, float) or not math.isfinite(mean_len)):
        raise RowFault(f + "mean_acceptance_length", f"expected a number, got {mean_len!r}"[:200])
    return EngineWindow("vllm", "vllm-request", no, ts, None, float(steps), float(drafted), float(accepted),
                        per_pos, k or (len(per_pos) if per_pos else None),
                        float(mean_len) if mean_len is not None else None,
                        _rate(f + "draft_acceptance_rate", spec.get("draft_acceptance_rate")), labels)


def _llama_timings(t: dict, no: int, ts: datetime | None, labels: dict) -> EngineWindow | None:
    if "draft_n" not in t:  # absent, not 0, when nothing was drafted
        return None
    drafted = _count("timings.draft_n", t["draft_n"])
    accepted = _count("timings.draft_n_accepted", t.get("draft_n_accepted", 0))
    if accepted > drafted:
        raise RowFault("timings.draft_n_accepted", f"{accepted} accepted of {drafted} drafted tokens")
    return EngineWindow("llama.cpp", "llama-timings", no, ts, draft_tokens=float(drafted),
                        accepted_tokens=float(accepted), labels=labels)


def window(obj: dict, no: int) -> EngineWindow | None:
    """The window of one response (None: a llama-server response where nothing was drafted)."""
    ts = _created(obj)
    labels = {key: str(obj[key])[:200] for key in ("id", "model")
              if key in obj and not isinstance(obj[key], (dict, list))}
    if "id" in labels:
        labels["request_id"] = labels.pop("id")
    metrics = obj.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else obj.get("speculative_decoding")
    if spec is not None:
        if not isinstance(spec, dict):
            raise RowFault("speculative_decoding", "expected an object")
        return _vllm_request(spec, no, ts, labels)
    if isinstance(obj.get("timings"), dict):
        return _llama_timings(obj["timings"], no, ts, labels)
    if "draft_n" in obj and "predicted_n" in obj:  # a bare timings object, as llama-server's docs show it
        return _llama_timings(obj, no, ts, labels)
    raise RowFault("", "neither metrics.speculative_decoding (vLLM) nor timings (llama-server) in this response")


def read(path: str, name: str) -> tuple[list[EngineWindow], list[Fault]]:
    """The windows of every response in the file."""
    windows, faults = [], []
    for no, obj, fault in jsonlines.responses(path, name):
        if fault is not None:
            faults.append(fault)
        if obj is None:
            continue
        try:
            w = window(obj, no)
        except RowFault as exc:
            faults.append(Fault(name, no, exc.field, exc.reason))
            continue
        if w is not None:
            windows.append(w)
    return windows, faults


def sniff(head: bytes) -> str | None:
    """Engine responses: JSON whose first object mentions their figures."""
    text = head.decode("utf-8", "replace").lstrip()
    if text[:1] not in ("{", "["):
        return None
    first = text[:4096]
    found = "speculative_decoding" in first or '"timings"' in first or ('"draft_n"' in first and
                                                                          '"predicted_n"' in first)
    return FORMATS[0] if found else None


class Reader(WindowReader):
    NOTHING = "no vLLM speculative_decoding metrics or llama-server timings with drafts in these responses"

    def read(self) -> tuple[list[EngineWindow], list[Fault]]:
        return read(self.job.path, self.job.name)
