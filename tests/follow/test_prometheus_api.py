"""`specmon pull` against real local HTTP servers that misbehave: every request has an overall deadline, the pull
as a whole has one, every reply's shape is checked, and a refused query shows Prometheus' own error text. No case
may end in a traceback."""
import base64
import json
import socket
import subprocess
import threading
import time
import urllib.request
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specmon.core.faults import SpecmonError
from specmon.follow import prometheus_api


class Server:
    """A local HTTP server whose every GET is answered by self.answer(handler)."""

    def __init__(self, answer):
        self.answer = answer
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                server.requests += 1
                try:
                    server.answer(self)
                except OSError:  # the client gave up: what the deadline is for
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(answer):
        servers.append(Server(answer))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def reply(status: int, body: bytes, content_type: str = "application/json"):
    def answer(h):
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return answer


def matrix(result) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


def series(values, metric=None):
    return {"metric": metric if metric is not None else {"__name__": "x", "engine": "0"}, "values": values}


END = datetime(2026, 11, 30, 12, 0)
START = END - timedelta(minutes=5)


def pull(url, **kw):
    return prometheus_api.pull(url, START, END, 60, **kw)


def test_a_well_formed_answer_gives_its_samples(serve):
    t = END.timestamp()
    s = serve(reply(200, matrix([series([[t - 60, "10"], [t, "25.5"]])])))
    samples = pull(s.url)
    # one request per metric, each answered with the same series
    assert s.requests == len(prometheus_api.metrics())  # the speculative-decoding series and the load series
    assert len(samples) == 2 * s.requests
    assert samples[0].labels == {"engine": "0"} and samples[1].value == 25.5
    assert samples[1].ts == datetime.utcfromtimestamp(t)


@pytest.mark.parametrize("body, expected", [
    (b"[1,2,3]", "a JSON list, expected an object"),
    (b'{"status":"success"}', "no 'data' object"),
    (b'{"status":"success","data":{"resultType":"vector","result":[]}}', "resultType is 'vector'"),
    (b'{"status":"success","data":{"resultType":"matrix","result":{}}}', "data.result is not a list"),
    (matrix([{"metric": {}}]), "data.result[0] has no 'values' list"),
    (matrix([series([[1e9, "abc"]])]), "data.result[0].values[0]: value 'abc' is not a finite number"),
    (matrix([series([[1e9, 5]])]), "value 5 is not a finite number in a string"),
    (matrix([series([[1e9, "NaN"]])]), "value 'NaN' is not a finite number"),
    (matrix([series([["1e9", "5"]])]), "time '1e9' is not a number"),
    (matrix([series([[1e30, "5"]])]), "time 1e+30 is out of range"),
    (matrix([series([[1e9, "5", 3]])]), "values[0] is not a [time, value] pair"),
    (matrix([series([[1e9, "-50"]])]), "counter value -50 is negative"),
    (matrix([series([], metric=["a"])]), "data.result[0].metric is not an object of strings"),
    (matrix(["x"]), "data.result[0] is not an object"),
    (b"<html>502 Bad Gateway</html>", "not JSON"),
    (b'{"status":"error","errorType":"bad_data","error":"boom"}', "Prometheus answered 'error': bad_data: boom"),
])
def test_a_reply_of_the_wrong_shape_is_named(serve, body, expected):
    s = serve(reply(200, body))
    with pytest.raises(SpecmonError) as err:
        pull(s.url)
    assert expected in str(err.value)
    assert str(err.value).startswith(f"{s.url} (query vllm:spec_decode_num_drafts_total)")


def test_a_refused_query_shows_prometheus_own_error_text(serve):
    text = (b'{"status":"error","errorType":"bad_data","error":"exceeded maximum resolution of 11,000 points per '
            b'timeseries. Try decreasing the query resolution (?step=XX)"}')
    s = serve(reply(400, text))
    with pytest.raises(SpecmonError, match=r"HTTP 400: bad_data: exceeded maximum resolution of 11,000 points"):
        pull(s.url)
    s = serve(reply(503, b"Service Unavailable: TSDB not ready\n", "text/plain"))
    with pytest.raises(SpecmonError, match="HTTP 503: Service Unavailable: TSDB not ready"):
        pull(s.url)


def test_an_answer_cut_short_is_named(serve):
    def short(h):
        h.send_response(200)
        h.send_header("Content-Length", "5000")
        h.end_headers()
        h.wfile.write(matrix([])[:20])
    s = serve(short)
    with pytest.raises(SpecmonError, match=r"Prometheus query failed \(IncompleteRead"):
        pull(s.url)


def test_an_answer_too_large_to_hold_is_refused(serve, monkeypatch):
    monkeypatch.setattr(prometheus_api, "MAX_REPLY_BYTES", 1000)
    s = serve(reply(200, matrix([series([[1e9, "1"]] * 500)])))
    with pytest.raises(SpecmonError, match="the answer is larger than 1,000 bytes"):
        pull(s.url)


def trickle(every_s: float, headers_too: bool):
    """Answer a byte at a time, each well within a per-read timeout, never finishing."""
    def answer(h):
        if headers_too:
            for b in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n":
                h.wfile.write(bytes([b]))
                h.wfile.flush()
                time.sleep(every_s)
        h.send_response(200)
        h.send_header("Content-Length", "1000000")
        h.end_headers()
        while True:
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(every_s)
    return answer


@pytest.mark.parametrize("headers_too", [False, True])
def test_a_trickling_server_meets_the_request_deadline(serve, headers_too):
    s = serve(trickle(0.2, headers_too))
    began = time.monotonic()
    with pytest.raises(SpecmonError, match=r"no complete answer within 1 s \(--timeout\)"):
        pull(s.url, timeout_s=1.0)
    assert time.monotonic() - began < 10  # bounded by the deadline, not by the server; generous for a busy machine


def test_a_slow_server_meets_the_pull_deadline(serve):
    def slow(h):
        time.sleep(0.6)
        reply(200, matrix([]))(h)
    s = serve(slow)
    with pytest.raises(SpecmonError, match=r"did not finish within 1.5 s \(--total-timeout\)"):
        pull(s.url, timeout_s=5.0, total_timeout_s=1.5)
    assert s.requests < len(prometheus_api.metrics())


def run_cli(specmon_cmd, tmp_path, url, *extra):
    return subprocess.run([*specmon_cmd, "pull", "--db", str(tmp_path / "p.duckdb"), "--prometheus", url, *extra],
                          capture_output=True, text=True, timeout=60)


def test_the_cli_reports_without_a_traceback(serve, specmon_cmd, tmp_path):
    r = run_cli(specmon_cmd, tmp_path, serve(reply(200, b"[1,2,3]")).url)
    assert r.returncode == 2 and "a JSON list, expected an object" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(specmon_cmd, tmp_path, serve(trickle(0.2, False)).url, "--timeout", "1")
    assert r.returncode == 2 and "no complete answer within 1 s" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(specmon_cmd, tmp_path, serve(reply(200, matrix([]))).url, "--since", "0s")
    assert r.returncode == 2 and "--since: '0s' is not a duration" in r.stderr
    r = run_cli(specmon_cmd, tmp_path, "ftp://127.0.0.1:1")
    assert r.returncode == 2 and "not an http:// or https:// URL" in r.stderr
    r = run_cli(specmon_cmd, tmp_path, serve(reply(200, matrix([]))).url, "--timeout", "0")
    assert r.returncode == 2 and "must be more than 0" in r.stderr


def test_a_closed_port_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SpecmonError, match="Prometheus query failed"):
        pull(f"http://127.0.0.1:{port}")


def forwarding(seen: list[str], auth: list[str | None]):
    """An answer that makes a Server a real HTTP proxy: it takes absolute-URL GETs, fetches them and relays the
    answer, noting each URL and the credentials it was shown."""
    def answer(h):
        seen.append(h.path)
        auth.append(h.headers.get("Proxy-Authorization"))
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(h.path) as resp:
            body = resp.read()
            h.send_response(resp.status)
            h.send_header("Content-Type", resp.headers.get("Content-Type", "application/json"))
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return answer


def test_a_pull_goes_through_the_proxy_the_environment_names(serve, monkeypatch):
    t = END.timestamp()
    s = serve(reply(200, matrix([series([[t, "7"]])])))
    seen, auth = [], []
    proxy = serve(forwarding(seen, auth))
    monkeypatch.setenv("http_proxy", proxy.url.replace("http://", "http://ops:s3cret@"))
    samples = pull(s.url)
    assert len(samples) == s.requests and samples[0].value == 7.0
    assert len(seen) == s.requests
    assert all(p.startswith(f"{s.url}/api/v1/query_range?") for p in seen)
    assert set(auth) == {"Basic " + base64.b64encode(b"ops:s3cret").decode()}


def test_no_proxy_keeps_a_host_off_the_proxy(serve, monkeypatch):
    s = serve(reply(200, matrix([])))
    seen: list[str] = []
    proxy = serve(forwarding(seen, []))
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    assert pull(s.url) == []
    assert seen == [] and proxy.requests == 0 and s.requests > 0
