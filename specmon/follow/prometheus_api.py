"""Prometheus' HTTP API (`specmon pull`, watched Prometheus sources): the speculative-decoding and load series as
samples; the metrics themselves are specmon.ingest.formats.prometheus_metrics', and saved pages (the text exposition
format) are read by specmon.ingest.formats.prometheus_text.

specmon keeps the raw samples of the speculative-decoding counters (vLLM's, and llama.cpp's that mirror them)
and takes differences between consecutive samples of the same series itself, so a saved page, a series of
pages and a pull from a Prometheus server all go through one piece of code (specmon.analysis.engine_segments's
counter_windows). A value below
the previous one is a restart: the counter began again from zero, so the window counts the new value.
SGLang's spec_accept_length and spec_accept_rate are gauges: kept as samples, never differenced or summed. The load
gauges (requests running and waiting) are kept as samples too; each window takes their mean over its two ends.
"""
from __future__ import annotations

import json
import math
import time
import urllib.parse
from datetime import datetime, timezone

from specmon.core import times
from specmon.core.faults import SpecmonError
from specmon.core.settings import PULL_REQUEST_TIMEOUT_S, PULL_TIMEOUT_S
from specmon.follow.http_client import http_request
from specmon.ingest.formats.prometheus_metrics import GAUGES, Sample, is_counter, metrics

# Bounds on what a Prometheus server can make `specmon pull` hold in memory.
MAX_REPLY_BYTES = 256 << 20

def _shape_error(where: str, what: str) -> SpecmonError:
    return SpecmonError(f"{where}: not a Prometheus query_range answer: {what}")


def _server_error(where: str, status: int, body: bytes) -> SpecmonError:
    """Prometheus' own words for a refused query (its JSON error, else the start of the body)."""
    try:
        reply = json.loads(body)
    except ValueError:
        reply = None
    if isinstance(reply, dict) and reply.get("error"):
        text = f"{reply.get('errorType') or 'error'}: {reply['error']}"
    else:
        text = body[:300].decode("utf-8", "replace").strip() or "(empty body)"
    return SpecmonError(f"{where}: Prometheus answered HTTP {status}: {text}")


def parse_query_range(body: bytes, where: str, metric: str) -> list[Sample]:
    """The samples of a query_range answer, every part of its shape checked: a status of success, data with
    resultType matrix, and per series a metric object of strings and values as [time, "number"] pairs. Values must
    be finite, and not negative but for SGLang's spec_accept gauges. Anything else is a SpecmonError naming the
    part that is wrong."""
    nonnegative = metric not in GAUGES  # counters, and the load gauges (requests, tokens/s)
    samples = []
    for i, series in enumerate(_matrix(body, where)):
        at = f"data.result[{i}]"
        labels, values = _series(series, where, at)
        for j, pair in enumerate(values):
            when, value = _sample(pair, where, f"{at}.values[{j}]", nonnegative, metric)
            samples.append(Sample(metric, labels, when, value))
    return samples


def _matrix(body: bytes, where: str) -> list:
    """data.result of a successful query_range answer whose resultType is matrix."""
    try:
        reply = json.loads(body)
    except ValueError as exc:
        raise _shape_error(where, f"not JSON ({exc})") from None
    if not isinstance(reply, dict):
        raise _shape_error(where, f"a JSON {type(reply).__name__}, expected an object")
    if reply.get("status") != "success":
        raise SpecmonError(f"{where}: Prometheus answered {reply.get('status')!r}: "
                           f"{reply.get('errorType')}: {reply.get('error')}")
    data = reply.get("data")
    if not isinstance(data, dict):
        raise _shape_error(where, "no 'data' object")
    if data.get("resultType") != "matrix":
        raise _shape_error(where, f"data.resultType is {data.get('resultType')!r}, expected 'matrix'")
    result = data.get("result")
    if not isinstance(result, list):
        raise _shape_error(where, "data.result is not a list")
    return result


def _series(series: object, where: str, at: str) -> tuple[dict[str, str], list]:
    """A series' labels (without __name__) and its values list."""
    if not isinstance(series, dict):
        raise _shape_error(where, f"{at} is not an object")
    labels = series.get("metric", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise _shape_error(where, f"{at}.metric is not an object of strings")
    values = series.get("values")
    if not isinstance(values, list):
        raise _shape_error(where, f"{at} has no 'values' list")
    return {k: v for k, v in labels.items() if k != "__name__"}, values


def _sample(pair: object, where: str, here: str, nonnegative: bool, metric: str) -> tuple[datetime, float]:
    """One [time, "number"] pair as a naive UTC time and a finite value (not negative unless an SGLang spec gauge)."""
    if not (isinstance(pair, list) and len(pair) == 2):
        raise _shape_error(where, f"{here} is not a [time, value] pair")
    ts, text = pair
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise _shape_error(where, f"{here}: time {ts!r} is not a number")
    try:
        when = times.from_epoch(ts)
    except (OverflowError, OSError, ValueError):
        raise _shape_error(where, f"{here}: time {ts!r} is out of range") from None
    try:
        value = float(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if value is None or not math.isfinite(value):
        raise _shape_error(where, f"{here}: value {text!r} is not a finite number in a string")
    if nonnegative and value < 0:
        raise _shape_error(where, f"{here}: counter value {text} is negative; a counter only counts up"
                           if is_counter(metric) else f"{here}: value {text} is negative; requests and tokens/s "
                                                      "are not")
    return when, value


def query_range(url: str, metric: str, start: datetime, end: datetime, step_s: float,
                timeout_s: float = PULL_REQUEST_TIMEOUT_S) -> list[Sample]:
    """The raw samples of one metric from Prometheus' /api/v1/query_range, within timeout_s seconds overall."""
    params = urllib.parse.urlencode({"query": metric, "start": start.replace(tzinfo=timezone.utc).timestamp(),
                                     "end": end.replace(tzinfo=timezone.utc).timestamp(), "step": step_s})
    full = f"{url.rstrip('/')}/api/v1/query_range?{params}"
    where = f"{url} (query {metric})"
    status, body = http_request(full, timeout_s, where, MAX_REPLY_BYTES)
    if status != 200:
        raise _server_error(where, status, body)
    return parse_query_range(body, where, metric)


def pull(url: str, start: datetime, end: datetime, step_s: float, *,
         timeout_s: float = PULL_REQUEST_TIMEOUT_S, total_timeout_s: float = PULL_TIMEOUT_S) -> list[Sample]:
    """The raw speculative-decoding and load samples Prometheus holds between start and end, every step_s seconds
    (one request per metric: prometheus_metrics.metrics()).

    Each request must finish within timeout_s and the whole pull (one request per metric) within
    total_timeout_s; otherwise a SpecmonError says which limit was reached."""
    give_up = time.monotonic() + total_timeout_s
    samples = []
    for metric in metrics():
        left = give_up - time.monotonic()
        if left <= 0:
            raise SpecmonError(f"{url}: the pull did not finish within {total_timeout_s:g} s (--total-timeout)")
        try:
            samples += query_range(url, metric, start, end, step_s, min(timeout_s, left))
        except SpecmonError:
            if time.monotonic() >= give_up:
                raise SpecmonError(f"{url}: the pull did not finish within {total_timeout_s:g} s "
                                   "(--total-timeout)") from None
            raise
    return samples
