"""specmon's step-log contract (README, "The step log (what to log)"): one JSON object per verification step.

parse_step turns one decoded JSON object into a validated Step, or raises RowFault naming the field.
The JSON Schema of the same contract ships as specmon/schema/steplog.schema.json.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, repeat
from typing import NamedTuple, TypeGuard

import numpy as np
import orjson

from specmon.core import scalars, theory, times
from specmon.core.faults import RowFault
from specmon.core.limits import MAX_DRAFT_LEN, MAX_TOKEN_ID
from specmon.core.settings import DEFAULT_SUM_TOLERANCE

KNOWN_FIELDS = frozenset(
    {
        "request_id", "draft_tokens", "accepted", "ts", "template", "k", "temperature",
        "target_probs", "draft_probs", "target_logprobs", "draft_logprobs", "beta",
        "target_ms", "draft_ms", "emitted_tokens",
    }
)

# Epoch values above this are not seconds (they would be after the year 5138): most likely milliseconds.
_MAX_EPOCH_SECONDS = 1e11


@dataclass(slots=True)
class Step:
    request_id: str
    draft_tokens: list[int]
    accepted: int
    ts: datetime | None = None
    template: str | None = None
    k: int | None = None
    temperature: float | None = None
    beta_lo: list[float] | None = None  # per drafted position; equal to beta_hi where beta is exact
    beta_hi: list[float] | None = None
    p_token: list[float | None] | None = None  # p_i(x_i) and q_i(x_i) where the distributions say
    q_token: list[float | None] | None = None
    target_ms: float | None = None
    draft_ms: float | None = None
    emitted_tokens: list[int] | None = None
    pit_below: list[float] | None = None  # F_t(x_t - 1) and p_t(x_t) of each emitted token, for the PIT
    pit_mass: list[float] | None = None
    extra: str | None = None  # unknown fields, as JSON

    @property
    def g(self) -> int:
        return len(self.draft_tokens)

    @property
    def checked(self) -> int:
        """Positions the target checked: the accepted prefix plus the first rejection, if any."""
        return min(self.accepted + 1, len(self.draft_tokens))


def _type_name(v: object) -> str:
    return "null" if v is None else type(v).__name__


_is_int = scalars.is_integer  # the one rule of what an integer is (a JSON 2.0 is not one)


def _is_number(v: object) -> TypeGuard[int | float]:
    # an integer of any length (JSON's are kept exact) is a number where a double holds it
    return (type(v) is int and v.bit_length() < 1024) or (type(v) is float and math.isfinite(v))


def _int_list(obj: dict, field: str) -> list[int]:
    v = obj[field]
    if type(v) is not list:
        raise RowFault(field, f"expected a list of token ids, got {_type_name(v)}")
    if len(v) > MAX_DRAFT_LEN:
        raise RowFault(field, f"{len(v)} tokens; specmon reads steps of up to {MAX_DRAFT_LEN}")
    if v and set(map(type, v)) == {int} and 0 <= min(v) and max(v) <= MAX_TOKEN_ID:
        return v  # the common case, checked without a loop in Python; the loop below names the bad item
    for i, t in enumerate(v):
        if not _is_int(t) or not 0 <= t <= MAX_TOKEN_ID:
            raise RowFault(field, f"item {i} is {repr(t)[:40]}; token ids are integers from 0 to {MAX_TOKEN_ID}")
    return v


def _number(obj: dict, field: str, *, minimum: float = 0.0) -> float | None:
    v = obj.get(field)
    if v is None:
        return None
    if not _is_number(v) or v < minimum:
        raise RowFault(field, f"expected a finite number >= {minimum:g}, got {v!r}")
    return float(v)


def parse_ts(v: object) -> datetime:
    """An ISO-8601 string or epoch seconds, as a naive UTC datetime (naive ISO strings are taken as UTC)."""
    if type(v) is str:
        try:
            return times.parse_iso(v)
        except ValueError:
            raise RowFault("ts", f"{v[:60]!r} is not an ISO-8601 timestamp") from None
        except OverflowError:  # year 1 or 9999 shifted by its offset out of the calendar
            raise RowFault("ts", f"{v[:60]!r} in UTC falls outside the years 1 to 9999") from None
    if _is_number(v):
        if abs(v) > _MAX_EPOCH_SECONDS:
            raise RowFault("ts", f"{v!r} is not epoch seconds (milliseconds? divide by 1000)")
        try:
            return times.from_epoch(v)
        except (ValueError, OverflowError, OSError):
            raise RowFault("ts", f"{v!r} epoch seconds fall outside the years 1 to 9999") from None
    raise RowFault("ts", f"expected an ISO-8601 string or epoch seconds, got {_type_name(v)}")


def _per_position(obj: dict, field: str, rows_allowed: tuple[int, ...], what: str) -> list:
    """The field's list of per-position entries, of a length draft_tokens allows."""
    v = obj[field]
    if type(v) is not list:
        raise RowFault(field, f"expected a list of {what}, got {_type_name(v)}")
    if len(v) not in rows_allowed:
        want = " or ".join(str(n) for n in rows_allowed)
        raise RowFault(field, f"has {len(v)} positions; draft_tokens implies {want}")
    return v


def _dense_rows(obj: dict, field: str, rows_allowed: tuple[int, ...], tol: float) -> np.ndarray:
    v = _per_position(obj, field, rows_allowed, "probability lists")
    if not v:
        return np.empty((0, 0))
    try:
        arr = np.array(v, dtype=np.float64)
    except (ValueError, TypeError):
        raise RowFault(field, "positions must be lists of numbers of one common length (the vocabulary)") from None
    if arr.ndim != 2:
        raise RowFault(field, "positions must be lists of numbers of one common length (the vocabulary)")
    bad = ~np.isfinite(arr)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise RowFault(field, f"position {i + 1} has a NaN or infinite probability at token {j}")
    if (arr < 0).any():
        i, j = np.argwhere(arr < 0)[0]
        raise RowFault(field, f"position {i + 1} has a negative probability {arr[i, j]:g} at token {j}")
    sums = arr.sum(axis=1)
    off = np.abs(sums - 1.0) > tol
    if off.any():
        i = int(np.argmax(off))
        raise RowFault(field, f"position {i + 1} sums to {sums[i]:.6g}, not 1 (tolerance {tol:g})")
    return arr


def _topk_objects(obj: dict, field: str, rows_allowed: tuple[int, ...]) -> list[dict]:
    """The field's per-position {token_id: logprob} objects, of a length draft_tokens allows (values unchecked)."""
    v = _per_position(obj, field, rows_allowed, "{token_id: logprob} objects")
    if set(map(type, v)) <= {dict}:
        return v  # the common case, checked without a loop in Python; the loop below names the bad position
    for i, d in enumerate(v):
        if type(d) is not dict:
            raise RowFault(field, f"position {i + 1} is {_type_name(d)}, expected a {{token_id: logprob}} object")
    return v


def _topk_rows(obj: dict, field: str, rows_allowed: tuple[int, ...], tol: float) -> list[dict[str, float]]:
    """Validate top-k logprob dicts and return them as {token: probability}."""
    v = _topk_objects(obj, field, rows_allowed)
    # All logprobs of the field at once: one numpy pass instead of a Python check per entry (the hot path).
    try:
        logprobs = np.array([x for d in v for x in d.values()], dtype=np.float64)
        ok = bool(np.isfinite(logprobs).all() and (logprobs <= 1e-6).all())
    except (TypeError, ValueError):
        ok = False
    if not ok:
        for i, d in enumerate(v):
            for tok, lp in d.items():
                if not _is_number(lp) or lp > 1e-6:
                    raise RowFault(field, f"position {i + 1}, token {tok}: logprob {lp!r} is not a finite number <= 0")
    probs = np.exp(logprobs).tolist()
    out = []
    start = 0
    for i, d in enumerate(v):
        row = dict(zip(d, probs[start:start + len(d)], strict=True))
        start += len(d)
        mass = sum(row.values())
        if mass > 1.0 + tol:
            raise RowFault(field, f"position {i + 1}: listed probabilities sum to {mass:.6g} > 1 (tolerance {tol:g})")
        out.append(row)
    return out


def parse_step(obj: object, sum_tol: float = DEFAULT_SUM_TOLERANCE) -> Step:
    """Validate one decoded step-log object. Raises RowFault(field, reason) at the first fault.

    The fields are checked in a fixed order (the required ones, the step's metadata, the dense distributions, the
    beta field, the top-k logprobs, the emitted tokens, the unknown fields), so a line with several faults always
    reports the same one."""
    return _parse(obj, sum_tol, _apply_topk)


def parse_steps(objs: Sequence[object], sum_tol: float = DEFAULT_SUM_TOLERANCE) -> list[Step | RowFault]:
    """parse_step of each object, or the RowFault it raises: the same Steps and the same faults, but the top-k
    logprobs of all the objects are checked and turned into p_i(x_i), q_i(x_i) and beta's bounds in a few numpy
    passes (the bulk of the work for top-k logs) instead of position by position. An object that fails anywhere
    is parsed again by parse_step alone, so its fault is the one parse_step reports first."""
    batch = _TopkBatch(sum_tol)
    out: list[Step | RowFault] = []
    for obj in objs:
        batch.index = len(out)
        try:
            out.append(_parse(obj, sum_tol, batch.defer))
        except RowFault:
            out.append(_exact(obj, sum_tol))
    for i in batch.finish(out):
        out[i] = _exact(objs[i], sum_tol)
    return out


def _exact(obj: object, sum_tol: float) -> Step | RowFault:
    try:
        return parse_step(obj, sum_tol)
    except RowFault as fault:
        return fault


def _parse(obj: object, sum_tol: float, topk_stage: Callable[[dict, Step, float], None]) -> Step:
    if type(obj) is not dict:
        raise RowFault("", f"expected a JSON object per line, got {_type_name(obj)}")
    step = _required(obj)
    _read_metadata(obj, step)
    p_dense, q_dense = _dense_pair(obj, step.draft_tokens, sum_tol)
    _apply_dense(step, p_dense, q_dense)
    if step.beta_lo is None:
        _read_beta_field(obj, step)
    topk_stage(obj, step, sum_tol)
    if obj.get("emitted_tokens") is not None:
        _read_emitted(obj, step, p_dense)
    step.extra = _unknown_fields(obj)
    return step


def _required(obj: dict) -> Step:
    """The three fields every step has: request_id, draft_tokens and accepted (0..g)."""
    for field in ("request_id", "draft_tokens", "accepted"):
        if field not in obj:
            raise RowFault(field, "required field is missing")
    request_id = obj["request_id"]
    if type(request_id) is not str or not request_id:
        raise RowFault("request_id", f"expected a non-empty string, got {request_id!r}")
    draft = _int_list(obj, "draft_tokens")
    g = len(draft)
    accepted = obj["accepted"]
    if not _is_int(accepted):
        raise RowFault("accepted", f"expected an integer, got {_type_name(accepted)} {accepted!r}")
    if not 0 <= accepted <= g:
        raise RowFault("accepted", f"{accepted} is outside 0..g (g = {g}, the length of draft_tokens)")
    return Step(request_id, draft, accepted)


def _read_metadata(obj: dict, step: Step) -> None:
    """ts, template, k and the sampling temperature and timings, each optional."""
    if obj.get("ts") is not None:
        step.ts = parse_ts(obj["ts"])
    template = obj.get("template")
    if template is not None:
        if type(template) is not str:
            raise RowFault("template", f"expected a string, got {_type_name(template)}")
        step.template = template
    k = obj.get("k")
    if k is not None:
        if not _is_int(k) or not 1 <= k <= MAX_DRAFT_LEN:
            raise RowFault("k", f"expected an integer from 1 to {MAX_DRAFT_LEN}, got {str(k)[:40]}")
        if step.g > k:
            raise RowFault("k", f"k = {k} but {step.g} tokens were drafted")
        step.k = k
    step.temperature = _number(obj, "temperature")
    step.target_ms = _number(obj, "target_ms")
    step.draft_ms = _draft_ms(obj)


def _draft_ms(obj: dict) -> float | None:
    """draft_ms as one number, or a list of per-token times that is summed."""
    draft_ms = obj.get("draft_ms")
    if type(draft_ms) is list:
        if not all(_is_number(x) and x >= 0 for x in draft_ms):
            raise RowFault("draft_ms", "expected a number or a list of numbers >= 0")
        return float(sum(draft_ms))
    return _number(obj, "draft_ms")


def _dense_pair(obj: dict, draft: list[int], tol: float) -> tuple[np.ndarray | None, np.ndarray | None]:
    """target_probs (g or g + 1 rows) and draft_probs (g rows) where logged, checked against the drafted tokens
    and against each other's vocabulary."""
    g = len(draft)
    p_dense = q_dense = None
    if obj.get("target_probs") is not None:
        p_dense = _dense_rows(obj, "target_probs", (g, g + 1), tol)
    if obj.get("draft_probs") is not None:
        q_dense = _dense_rows(obj, "draft_probs", (g,), tol)
    for name, rows in (("target_probs", p_dense), ("draft_probs", q_dense)):
        if rows is not None and g and rows.shape[1] <= max(draft):
            raise RowFault(name, f"vocabulary of {rows.shape[1]} tokens, but draft token {max(draft)} was drafted")
    if p_dense is not None and q_dense is not None and g and p_dense.shape[1] != q_dense.shape[1]:
        raise RowFault("draft_probs", f"vocabulary of {q_dense.shape[1]}, target_probs has {p_dense.shape[1]}")
    return p_dense, q_dense


def _apply_dense(step: Step, p_dense: np.ndarray | None, q_dense: np.ndarray | None) -> None:
    """p_i(x_i) and q_i(x_i) from the dense rows; beta exactly where both distributions are logged."""
    g, draft = step.g, step.draft_tokens
    idx = np.arange(g)
    if p_dense is not None and g:
        step.p_token = p_dense[idx, draft].tolist()
    if q_dense is not None and g:
        step.q_token = q_dense[idx, draft].tolist()
    if p_dense is not None and q_dense is not None:
        b = np.asarray(theory.beta(p_dense[:g], q_dense)).tolist() if g else []
        step.beta_lo = step.beta_hi = b


def _read_beta_field(obj: dict, step: Step) -> None:
    """A logged per-position beta (used where the dense pair does not give it)."""
    b = obj.get("beta")
    if b is None:
        return
    if type(b) is not list or len(b) != step.g:
        raise RowFault("beta", f"expected a list of {step.g} numbers (one per drafted token)")
    if not all(_is_number(x) and 0.0 <= x <= 1.0 for x in b):
        raise RowFault("beta", "every value must be a number in [0, 1]")
    step.beta_lo = step.beta_hi = [float(x) for x in b]


def _apply_topk(obj: dict, step: Step, tol: float) -> None:
    """Top-k logprobs: p_i(x_i) and q_i(x_i) where the dense rows did not give them, and beta's sharp bounds
    where nothing gave beta."""
    g, draft = step.g, step.draft_tokens
    p_top = q_top = None
    if obj.get("target_logprobs") is not None:
        p_top = _topk_rows(obj, "target_logprobs", (g, g + 1), tol)
    if obj.get("draft_logprobs") is not None:
        q_top = _topk_rows(obj, "draft_logprobs", (g,), tol)
    if p_top is not None and step.p_token is None:
        step.p_token = [p_top[i].get(str(t)) for i, t in enumerate(draft)]
    if q_top is not None and step.q_token is None:
        step.q_token = [q_top[i].get(str(t)) for i, t in enumerate(draft)]
    if p_top is not None and q_top is not None and step.beta_lo is None:
        bounds = [theory.beta_bounds_from_topk_probs(p_top[i], q_top[i]) for i in range(g)]
        step.beta_lo = [b[0] for b in bounds]
        step.beta_hi = [b[1] for b in bounds]


def _read_emitted(obj: dict, step: Step, p_dense: np.ndarray | None) -> None:
    """The tokens the step emitted: the accepted draft tokens, then at most one correction or bonus token."""
    emitted = _int_list(obj, "emitted_tokens")
    accepted = step.accepted
    if len(emitted) > accepted + 1:
        raise RowFault("emitted_tokens",
                       f"{len(emitted)} tokens, but a step emits at most accepted + 1 = {accepted + 1}")
    if emitted[:accepted] != step.draft_tokens[: min(accepted, len(emitted))]:
        raise RowFault("emitted_tokens", "must begin with the accepted draft tokens")
    step.emitted_tokens = emitted
    if p_dense is not None:
        _pit_terms(step, emitted, p_dense)


def _pit_terms(step: Step, emitted: list[int], p_dense: np.ndarray) -> None:
    """F_t(x_t - 1) and p_t(x_t) of each emitted token under its target row, for the PIT."""
    # The emitted token at index j was drawn from target row j (accepted draft, correction or bonus).
    emitted = emitted[: p_dense.shape[0]]
    if not emitted:
        return
    if max(emitted) >= p_dense.shape[1]:
        raise RowFault("emitted_tokens", f"token {max(emitted)} is outside the vocabulary of {p_dense.shape[1]}")
    rows = p_dense[: len(emitted)]
    j = np.arange(len(emitted))
    mass = rows[j, emitted]
    step.pit_below = (np.cumsum(rows, axis=1)[j, emitted] - mass).tolist()
    step.pit_mass = mass.tolist()


def _unknown_fields(obj: dict) -> str | None:
    """Fields the contract does not name, kept as one JSON object with sorted keys."""
    unknown = obj.keys() - KNOWN_FIELDS
    if not unknown:
        return None
    kept = {key: obj[key] for key in sorted(unknown)}
    try:
        return orjson.dumps(kept).decode()
    except orjson.JSONEncodeError as exc:  # orjson stops at 254 levels, and at integers beyond 64 bits
        if "Integer" not in str(exc) or _deeper_than(kept, 250):
            raise RowFault(sorted(unknown)[0], "unknown fields nested too deep to keep (over 250 levels)") from None
    # kept exactly as written: an integer of any length is JSON text, not a float
    return json.dumps(kept, separators=(",", ":"), ensure_ascii=False)


def _deeper_than(value: object, levels: int) -> bool:
    """Whether lists and objects nest more than `levels` deep in the value (walked without recursion)."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth >= levels:
                return True
            stack.extend((item, depth + 1) for item in (v.values() if isinstance(v, dict) else v))
    return False


class _Deferred(NamedTuple):
    at: int  # its place in parse_steps' output
    step: Step
    p_top: list[dict] | None
    q_top: list[dict] | None


class _TopkBatch:
    """Top-k logprobs of many steps, checked and turned into probabilities and bounds together (parse_steps).

    defer() records a step's logprob objects (their shape is checked at once, with parse_step's messages); finish()
    checks every logprob (a finite number <= 0) and every position's listed mass (<= 1 + tol) in one pass, fills
    p_token, q_token and beta's bounds as _apply_topk does, and returns the steps it could not vouch for (a bad
    value, or a mass within rounding of the tolerance), for parse_step to decide one by one."""

    def __init__(self, sum_tol: float) -> None:
        self.sum_tol = sum_tol
        self.index = 0  # the position in parse_steps' output of the step being parsed
        self.entries: list[_Deferred] = []

    def defer(self, obj: dict, step: Step, sum_tol: float) -> None:
        g = step.g
        p_top = q_top = None
        if obj.get("target_logprobs") is not None:
            p_top = _topk_objects(obj, "target_logprobs", (g, g + 1))
        if obj.get("draft_logprobs") is not None:
            q_top = _topk_objects(obj, "draft_logprobs", (g,))
        if p_top is not None or q_top is not None:
            self.entries.append(_Deferred(self.index, step, p_top, q_top))

    def finish(self, out: list[Step | RowFault]) -> list[int]:
        """Complete the deferred steps still in `out` (the others failed later on); return those to redo."""
        entries = [e for e in self.entries if isinstance(out[e.at], Step)]
        if not entries:
            return []
        rows = [d for e in entries for side in (e.p_top, e.q_top) if side for d in side]
        counts = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        try:
            logprobs = np.fromiter(chain.from_iterable(map(dict.values, rows)), dtype=np.float64,
                                   count=int(counts.sum()))
        except (TypeError, ValueError):  # a value that is no number: parse_step names it
            return [e.at for e in entries]
        row_of = np.repeat(np.arange(len(rows)), counts)
        bad_value = ~(np.isfinite(logprobs) & (logprobs <= 1e-6))
        probs = np.exp(np.where(bad_value, -np.inf, logprobs))
        # A mass within 1e-9 of the limit is left to parse_step's own sum, which decides it exactly.
        mass = np.bincount(row_of, weights=probs, minlength=len(rows))
        bad_row = (np.bincount(row_of, weights=bad_value, minlength=len(rows)) > 0) | (mass > 1.0 + self.sum_tol - 1e-9)
        rows_per_entry = np.array([len(e.p_top or ()) + len(e.q_top or ()) for e in entries])
        redo = set(np.repeat(np.arange(len(entries)), rows_per_entry)[bad_row].tolist())
        good = [n for n in range(len(entries)) if n not in redo]
        _fill_tokens([entries[n] for n in good])
        flat = _FlatRows(probs, counts, np.cumsum(rows_per_entry) - rows_per_entry)
        _fill_bounds([entries[n] for n in good], flat, good)
        return sorted(entries[n].at for n in redo)


class _FlatRows(NamedTuple):
    """Every logprob row of a _TopkBatch as probabilities, row after row (each entry's target rows, then its
    draft rows), with each row's length and each entry's first row."""
    probs: np.ndarray
    counts: np.ndarray
    first_row: np.ndarray

    def select(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The probabilities of the given rows, one after the other, and the rows' lengths."""
        counts = self.counts[rows]
        starts = (np.cumsum(self.counts) - self.counts)[rows]
        return self.probs[_ranges(starts, counts)], counts


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices starts[i] .. starts[i] + lengths[i] - 1 of every i, concatenated."""
    total = int(lengths.sum())
    run_start = np.cumsum(lengths) - lengths
    return np.repeat(starts - run_start, lengths) + np.arange(total)


def _fill_tokens(entries: list[_Deferred]) -> None:
    """p_i(x_i) and q_i(x_i) from the logprobs, where the dense rows did not give them (None where unlisted)."""
    for field in ("p_token", "q_token"):
        todo = [(e.step, e.p_top if field == "p_token" else e.q_top) for e in entries]
        todo_known = [(step, top) for step, top in todo if top is not None and getattr(step, field) is None]
        if not todo_known:
            continue
        n = sum(step.g for step, _ in todo_known)
        looked_up = chain.from_iterable(
            map(dict.get, top[: step.g], map(str, step.draft_tokens), repeat(math.nan)) for step, top in todo_known)
        probs = np.exp(np.fromiter(looked_up, dtype=np.float64, count=n)).tolist()
        start = 0
        for step, _ in todo_known:
            values = probs[start:start + step.g]
            start += step.g
            setattr(step, field, [None if v != v else v for v in values])  # NaN: the token is not listed


def _fill_bounds(entries: list[_Deferred], flat: _FlatRows, numbers: list[int]) -> None:
    """beta's sharp bounds at every position of the steps that log both sides' logprobs and no beta otherwise;
    numbers[i]: entries[i]'s place in `flat`."""
    todo = [(e, n) for e, n in zip(entries, numbers, strict=True)
            if e.p_top is not None and e.q_top is not None and e.step.beta_lo is None]
    if not todo:
        return
    g = np.array([e.step.g for e, _ in todo])
    first = flat.first_row[[n for _, n in todo]]
    p_rows = _ranges(first, g)  # the target rows of the drafted positions (not the bonus row)
    q_rows = _ranges(first + np.array([len(e.p_top or ()) for e, _ in todo]), g)
    p, p_counts = flat.select(p_rows)
    q, q_counts = flat.select(q_rows)
    p_dicts = [d for e, _ in todo for d in (e.p_top or ())[: e.step.g]]
    q_dicts = [d for e, _ in todo for d in e.q_top or ()]
    q_at_p = _probs_across(p_dicts, q_dicts, len(p))
    p_at_q = _probs_across(q_dicts, p_dicts, len(q))
    lo, hi = theory.beta_bounds_topk_flat(p, q_at_p, p_counts, q, p_at_q, q_counts)
    lo_list, hi_list = lo.tolist(), hi.tolist()
    start = 0
    for e, _ in todo:
        e.step.beta_lo, e.step.beta_hi = lo_list[start:start + e.step.g], hi_list[start:start + e.step.g]
        start += e.step.g


def _probs_across(rows: list[dict], other: list[dict], n: int) -> np.ndarray:
    """For each entry of rows, the probability the paired row of `other` lists for its token (NaN where none)."""
    looked_up = chain.from_iterable(map(o.get, d, repeat(math.nan)) for d, o in zip(rows, other, strict=True))
    return np.exp(np.fromiter(looked_up, dtype=np.float64, count=n))
