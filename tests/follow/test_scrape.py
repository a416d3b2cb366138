"""`specmon watch --scrape`: engines' own Prometheus pages over real HTTP, read by the saved-page parser, stored as
raw samples and made into windows from the differences between scrapes. The pages are real engine output from
tests/data/engines (index.json says where each comes from); to play a running engine, only the numbers in them are
edited from one scrape to the next (counter values, gauge values, the data-parallel engine label)."""
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from paths import DATA
from waiting import until

from specmon.analysis.engine_segments import windows
from specmon.core.faults import SpecmonError
from specmon.follow import scrape
from specmon.follow.config import SourceConfig, load_config
from specmon.follow.positions import register
from specmon.ingest.formats.prometheus_text import NOTHING_WANTED, parse_body, parse_exposition
from specmon.store.database import Store

ENGINES = DATA / "engines"
VLLM_COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total")


class Pages:
    """A real HTTP server answering each GET with the next page of a sequence, and 503 once they are used up.
    hang_at: the first request for that page is held until `release` is set and then refused, so that a watcher
    can be killed while it waits for the page; the page is served to the next request."""

    def __init__(self, pages: list[str], hang_at: int | None = None):
        self.pages, self.served, self.hang_at = pages, 0, hang_at
        self.hanging, self.release = threading.Event(), threading.Event()
        lock, outer = threading.Lock(), self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                with lock:
                    i = outer.served
                    hang = i == outer.hang_at and not outer.hanging.is_set()
                    if hang:
                        outer.hanging.set()
                    elif i < len(outer.pages):
                        outer.served += 1
                if hang:
                    outer.release.wait(30)
                if hang or i >= len(outer.pages):
                    self.send_error(503, "no page now")
                    return
                body = outer.pages[i].encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve():
    servers: list[Pages] = []

    def start(pages: list[str], hang_at: int | None = None) -> Pages:
        servers.append(Pages(pages, hang_at))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def with_value(line: str, value: float, fmt: str = "{:.6e}") -> str:
    """The sample line with its value replaced (the rest of the line as the engine wrote it)."""
    return line.rsplit(" ", 1)[0] + " " + fmt.format(value)


def vllm_dp_pages(scrapes: int, restart_at: int) -> tuple[list[str], dict[str, list[int]]]:
    """vllm-prom-1.prom as `scrapes` scrapes of two data-parallel engines (engine="0" and engine="1"): both counters
    get each engine's value; the engines restart before scrape `restart_at` (the counters begin again from 0)."""
    real = (ENGINES / "vllm-prom-1.prom").read_text().splitlines()
    values = {e: [6491797 + i * (1000 + 17 * int(e)) if i < restart_at else (i - restart_at + 1) * (900 + 13 * int(e))
                  for i in range(scrapes)] for e in "01"}
    pages = []
    for i in range(scrapes):
        lines = []
        for line in real:
            if line.split("{")[0] in VLLM_COUNTERS:
                lines += [with_value(line.replace('engine="0"', f'engine="{e}"'), values[e][i]) for e in "01"]
            else:
                lines.append(line)
        pages.append("\n".join(lines) + "\n")
    return pages, values


def sglang_pages(scrapes: int) -> tuple[list[str], list[float]]:
    """sglang-prom-load-1.prom as `scrapes` scrapes: every gen_throughput gauge scaled by the scrape's number,
    every num_queue_reqs gauge set to it modulo 3. Returns the pages and dp_rank 3's gen_throughput per scrape."""
    real = (ENGINES / "sglang-prom-load-1.prom").read_text().splitlines()
    pages, rank3 = [], []
    for i in range(scrapes):
        lines = []
        for line in real:
            if line.startswith("sglang:gen_throughput"):
                value = float(line.rsplit(" ", 1)[1]) * (i + 1)
                lines.append(with_value(line, value, "{!r}"))
                if 'dp_rank="3"' in line:
                    rank3.append(value)
            elif line.startswith("sglang:num_queue_reqs"):
                lines.append(with_value(line, float(i % 3), "{!r}"))
            else:
                lines.append(line)
        pages.append("\n".join(lines) + "\n")
    return pages, rank3


def counted_samples(db: str) -> int:
    with Store(db) as s:
        return s.query("SELECT count(*) FROM counter_samples")[0][0]


def _watch(db: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specmon", "watch", "--db", db, "--interval", "0.2", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_a_watcher_killed_mid_scrape_stores_every_difference_once(tmp_path, serve):
    """Two engines scraped by a real `specmon watch --scrape` process, kill -9'd while it waits for a page, then
    restarted: every scrape is stored once, data-parallel engines stay apart, the engine restart is counted from
    zero, and SGLang's gauges are averaged over each window, never differenced."""
    scrapes, restart_at = 10, 7
    vllm_pages, values = vllm_dp_pages(scrapes, restart_at)
    sglang, rank3 = sglang_pages(6)
    vllm_server, sglang_server = serve(vllm_pages, hang_at=5), serve(sglang)
    db = str(tmp_path / "w.duckdb")
    args = ("--scrape", vllm_server.url, "--scrape", sglang_server.url)
    watcher = _watch(db, *args)
    until(vllm_server.hanging.is_set, timeout=60, what="the watcher asking for the sixth vLLM page")
    watcher.kill()  # kill -9 while it waits for the page, holding the database
    watcher.wait()
    vllm_server.release.set()
    watcher = _watch(db, *args)
    want = 2 * len(VLLM_COUNTERS) * scrapes + 9 * len(sglang)  # samples per vLLM page: 2 engines x 2 counters
    until(lambda: counted_samples(db) == want, timeout=60, what="every scrape stored")
    watcher.send_signal(signal.SIGTERM)
    out, _ = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, out

    with Store(db) as store:
        assert store.query("SELECT count(*) = count(DISTINCT (metric, series, ts)) FROM counter_samples")[0][0]
        vllm_run = vllm_server.url.split("/")[2]  # a scraped source's run is its host:port by default
        got = windows(store, vllm_run)
        assert sorted(got["labels"].unique()) == [f'{{"engine": "{e}", "model_name": "Qwen/Qwen3.6-35B-A3B-FP8"}}'
                                                  for e in "01"]
        for e, v in values.items():
            mine = got[got["labels"].str.contains(f'"engine": "{e}"')]
            assert len(mine) == scrapes - 1  # one window per pair of consecutive scrapes
            # the increase up to the restart, then everything the engine counted since it began again
            want_total = (v[restart_at - 1] - v[0]) + v[-1]
            assert mine["drafts"].sum() == want_total and mine["draft_tokens"].sum() == want_total
        sglang_windows = windows(store, sglang_server.url.split("/")[2])
        rank = sglang_windows[sglang_windows["labels"].str.contains('"dp_rank": "3"')].sort_values("end_ts")
        assert rank["generation_throughput"].tolist() == pytest.approx(
            [(a + b) / 2 for a, b in zip(rank3, rank3[1:], strict=False)])
        assert rank["waiting_requests"].tolist() == pytest.approx(
            [((i % 3) + ((i + 1) % 3)) / 2 for i in range(len(sglang) - 1)])


@pytest.mark.parametrize("page", sorted(p.name for p in ENGINES.glob("*.prom")))
def test_a_scraped_body_reads_as_the_saved_file(page):
    at = datetime(2026, 5, 7, 12, 0, 0)
    assert parse_body((ENGINES / page).read_bytes(), page, at) == parse_exposition(str(ENGINES / page), page, at)


def _poll(store: Store, source: SourceConfig) -> None:
    scrape.poll_scrape(store, source, lambda line: None)


def _next_page(text: str, scale: float) -> str:
    """The page with every sample value but the `_created` times multiplied by scale."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or "_created" in line.split("{")[0]:
            out.append(line)
        else:
            out.append(with_value(line, float(line.rsplit(" ", 1)[1]) * scale, "{!r}"))
    return "\n".join(out) + "\n"


def test_tensorrt_llm_counters_by_their_meaning_and_its_gauges_kept_raw(tmp_path, serve):
    first = (ENGINES / "trtllm-prom-1.prom").read_text()
    server = serve([first, _next_page(first, 3.0)])
    with Store(str(tmp_path / "t.duckdb")) as store:
        source = SourceConfig("scrape", server.url.replace("/metrics", "/prometheus/metrics"), run="trt")
        _poll(store, source)
        _poll(store, source)
        (w,) = windows(store, "trt").itertuples()
        assert (w.draft_tokens, w.accepted_tokens) == (2 * 2700.0, 2 * 1647.0)
        assert list(w.accepted_per_position) == [2 * 702.0, 2 * 540.0, 2 * 405.0] and w.k == 3
        assert w.labels == '{"engine_type": "trtllm", "model_name": "nemotron-nano-3"}'
        assert w.running_requests == (4.0 + 12.0) / 2
        gauges = store.query("SELECT value FROM counter_samples WHERE metric = 'trtllm_spec_decode_acceptance_length' "
                             "ORDER BY ts")
        assert [g[0] for g in gauges] == pytest.approx([2.83, 3 * 2.83])


def test_llama_server_counters_make_windows(tmp_path, serve):
    first = (ENGINES / "llamacpp-prom-1.prom").read_text()
    server = serve([first, _next_page(first, 1.5)])
    with Store(str(tmp_path / "t.duckdb")) as store:
        source = SourceConfig("scrape", server.url, run="llama")
        _poll(store, source)
        _poll(store, source)
        (w,) = windows(store, "llama").itertuples()
        assert (w.drafts, w.draft_tokens, w.accepted_tokens) == (432.0, 1728.0, 987.0)
        assert list(w.accepted_per_position) == [350.5, 276.5, 206.0, 154.0]


def trickle(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    while True:
        handler.wfile.write(b"#")
        handler.wfile.flush()
        time.sleep(0.05)


class _Answer(BaseHTTPRequestHandler):
    answer = staticmethod(trickle)

    def do_GET(self):  # noqa: N802 (http.server's name)
        try:
            type(self).answer(self)
        except OSError:  # the client hung up
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def answering():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def start(answer) -> str:
        _Answer.answer = staticmethod(answer)
        return f"http://127.0.0.1:{server.server_port}/metrics"
    yield start
    server.shutdown()
    server.server_close()


def test_a_page_must_come_whole_within_the_deadline(answering):
    with pytest.raises(SpecmonError, match=r"\(scrape\): no complete answer within 0.5 s \(a scrape's deadline\)"):
        scrape.fetch_page(answering(trickle), timeout_s=0.5)


def test_an_engine_that_is_not_there_is_named(tmp_path):
    with pytest.raises(SpecmonError, match=r"127.0.0.1:9/metrics \(scrape\): the scrape failed \(.*refused"):
        scrape.fetch_page("http://127.0.0.1:9/metrics")


def test_a_page_larger_than_the_bound_is_refused(answering, monkeypatch):
    monkeypatch.setattr(scrape, "MAX_PAGE_BYTES", 1000)

    def big(handler):
        handler.send_response(200)
        handler.end_headers()
        handler.wfile.write(b"vllm:num_requests_running 1\n" * 100)
    with pytest.raises(SpecmonError, match="larger than 1,000 bytes"):
        scrape.fetch_page(answering(big))


def test_a_refusal_a_page_without_metrics_and_a_bad_line_are_named(tmp_path, serve, answering):
    def missing(handler):
        handler.send_error(404, "Not Found")
    with pytest.raises(SpecmonError, match="answered HTTP 404"):
        scrape.fetch_page(answering(missing))

    real = (ENGINES / "vllm-prom-load-1.prom").read_text()
    bad = re.sub(r"(vllm:num_requests_running\{.*\}) 0\.0", r"\1 -1.0", real)
    server = serve(["process_cpu_seconds_total 1.5\n", bad, bad])
    with Store(str(tmp_path / "t.duckdb")) as store:
        source = SourceConfig("scrape", server.url, run="r")
        with pytest.raises(SpecmonError, match=re.escape(NOTHING_WANTED)):
            scrape.poll_scrape(store, source, print)
        with pytest.raises(SpecmonError, match=r"/metrics:11: field 'vllm:num_requests_running': value -1"):
            scrape.poll_scrape(store, source, print)
        skipped: list[str] = []
        source.skip_bad = True
        scrape.poll_scrape(store, source, skipped.append)
        assert store.query("SELECT count(*) FROM counter_samples")[0][0] == 3
        assert len(skipped) == 1 and "vllm:num_requests_running" in skipped[0]


def test_a_scrape_waits_for_its_own_interval(tmp_path, serve):
    page = (ENGINES / "vllm-prom-load-1.prom").read_text()
    server = serve([page, page])
    with Store(str(tmp_path / "t.duckdb")) as store:
        source = SourceConfig("scrape", server.url, run="r", interval_s=3600)
        register(store, source, stale_after_s=300)  # as the watcher does: the position has a row to go to
        scrape.poll_scrape(store, source, print)
        scrape.poll_scrape(store, source, print)
        assert server.served == 1


def test_the_configuration_names_scraped_engines(tmp_path):
    path = tmp_path / "watch.toml"
    path.write_text('[[scrape]]\nurl = "http://vllm:8000/metrics"\ninterval = 15\nrun = "prod"\nc = 0.1\n'
                    '[[scrape]]\nurl = "http://trt:8000/prometheus/metrics"\nbaseline_of = "prod"\n')
    first, second = load_config(str(path)).sources
    assert (first.kind, first.location, first.interval_s, first.run_name, first.c) == (
        "scrape", "http://vllm:8000/metrics", 15.0, "prod", 0.1)
    assert (second.interval_s, second.run_name, second.baseline_of) == (None, "trt:8000", "prod")
    path.write_text('[[scrape]]\npath = "/metrics"\n')
    with pytest.raises(SpecmonError, match=r"\[\[scrape\]\] #1: needs url"):
        load_config(str(path))
