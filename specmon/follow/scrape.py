"""`specmon watch --scrape URL`: an engine's own Prometheus page (vLLM's, SGLang's and llama-server's /metrics,
TensorRT-LLM's /prometheus/metrics), read every interval.

Each scrape is parsed by the saved-page reader's own parser (prometheus_text.parse_body) and stored as raw samples,
with the source's position (the time of the last scrape) in the same transaction. Samples without a timestamp of
their own take the scrape time. Windows are made at analysis time from the differences between consecutive scrapes
of each series (engine_segments.counter_windows: a counter that falls is an engine restart), so a watcher killed
at any moment neither loses counts (the next scrape's totals cover the gap) nor stores them twice.
"""
from __future__ import annotations

from datetime import datetime

from specmon.core.faults import SpecmonError
from specmon.core.times import utc_now
from specmon.follow.config import Log, SourceConfig
from specmon.follow.http_client import http_request
from specmon.follow.polls import PollResult, SourceStopped
from specmon.follow.positions import load_position, save_position
from specmon.follow.tail import Position
from specmon.ingest.formats.prometheus_text import NOTHING_WANTED, parse_body
from specmon.ingest.pipeline import ingest_samples
from specmon.store.database import Store

# An engine's page is a few hundred lines; these bound what a slow or broken endpoint can make one poll cost.
SCRAPE_TIMEOUT_S = 10.0
MAX_PAGE_BYTES = 16 << 20


def fetch_page(url: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> tuple[bytes, datetime]:
    """The page's body and the time it arrived (naive UTC), within timeout_s seconds overall."""
    where = f"{url} (scrape)"
    status, body = http_request(url, timeout_s, where, MAX_PAGE_BYTES,
                                "scrape the engine's metrics endpoint itself (/metrics, /prometheus/metrics)",
                                asked="the scrape", deadline="a scrape's deadline")
    if status != 200:
        text = body[:200].decode("utf-8", "replace").strip() or "(empty body)"
        raise SpecmonError(f"{where}: the engine answered HTTP {status}: {text}")
    return body, utc_now()


def poll_scrape(store: Store, source: SourceConfig, log: Log) -> PollResult:
    """Scrape the page once its interval has passed since the last stored scrape; store its samples with the new
    position. A bad line stops the source (retried after back-off) unless skip_bad, when it is named in the log."""
    last = load_position(store, source).state.get("last_ts")
    if last and source.interval_s and (utc_now() - datetime.fromisoformat(last)).total_seconds() < source.interval_s:
        return PollResult()
    body, at = fetch_page(source.location)
    samples, faults = parse_body(body, source.location, at)
    if faults and not source.skip_bad:
        raise SourceStopped(f"{faults[0]} (the source stops here; fix the engine's page or scrape it with skip_bad)")
    for fault in faults:
        log(f"skipped {fault}")
    if not samples:
        raise SpecmonError(f"{source.location}: {NOTHING_WANTED} in the page")
    new_pos = Position(state={"last_ts": at.isoformat()})
    result = ingest_samples(
        store, samples, f"{source.location} at {at:%Y-%m-%dT%H:%M:%S.%f}", source.run_name, source.template,
        in_transaction=lambda cur, r: save_position(cur, source, new_pos, r.steps, at),
        baseline_of=source.baseline_of)
    if result.status == "already ingested":  # a page carrying its own timestamps, unchanged since the last scrape
        with store.transaction() as cur:
            save_position(cur, source, new_pos, 0, at)
        return PollResult()
    return PollResult(result.steps, faults)
