"""HTTP with an overall deadline, for everything specmon asks of another server: Prometheus queries, engine
scrapes and the outbox's deliveries.

A per-read timeout alone lets a server that trickles a byte at a time hold the caller for as long as it likes, so
each request has one deadline for all of it (see http_request).
"""
from __future__ import annotations

import base64
import http.client
import socket
import threading
import urllib.parse
import urllib.request

from specmon.core.faults import SpecmonError


def http_request(url: str, timeout_s: float, where: str, max_bytes: int,
                 too_large: str = "pull a shorter --since or a longer --step", asked: str = "Prometheus query",
                 deadline: str = "--timeout", json_body: bytes | None = None) -> tuple[int, bytes]:
    """GET url (or POST json_body to it) with an overall deadline: connecting, sending, the headers and the whole
    answer within timeout_s seconds, and an answer of at most max_bytes. Any status is returned with the answer.
    Errors name `where` (the server and the query) rather than the whole URL, and say what was asked, the setting
    behind the deadline and what to do about a larger answer.

    A per-read timeout alone lets a server that trickles a byte at a time hold the caller forever, so a timer
    shuts the socket down at the deadline, which ends any read in progress."""
    limit = max_bytes
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecmonError(f"{where}: not an http:// or https:// URL")
    try:
        conn, target, headers = _connection(parts, timeout_s)
    except ValueError as exc:  # a port that is not a number
        raise SpecmonError(f"{where}: not a usable URL ({exc})") from None
    expired = threading.Event()
    sock: list[socket.socket] = []  # the connection's socket; http.client forgets it once a reply will close

    def cut() -> None:
        expired.set()
        for s in sock:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout_s, cut)
    timer.daemon = True
    timer.start()
    try:
        conn.connect()
        sock.append(conn.sock)
        if expired.is_set():  # the deadline passed while connecting, before there was a socket to cut
            raise TimeoutError
        if json_body is None:
            conn.request("GET", target, headers=headers)
        else:
            conn.request("POST", target, body=json_body, headers={**headers, "Content-Type": "application/json"})
        resp = conn.getresponse()
        body = _read_at_most(resp, limit + 1)
        if resp.length and len(body) <= limit:  # http.client counts down the bytes a Content-Length promised
            raise http.client.IncompleteRead(body, resp.length)
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise SpecmonError(f"{where}: no complete answer within {timeout_s:g} s ({deadline})") from None
        raise SpecmonError(f"{where}: {asked} failed ({exc or type(exc).__name__})") from None
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():  # cut short where the body has no length of its own, so it looked complete
        raise SpecmonError(f"{where}: no complete answer within {timeout_s:g} s ({deadline})")
    if len(body) > limit:
        raise SpecmonError(f"{where}: the answer is larger than {limit:,} bytes; {too_large}")
    return resp.status, body


def _connection(parts: urllib.parse.SplitResult, timeout_s: float) -> tuple[http.client.HTTPConnection, str, dict]:
    """The connection, request target and headers for a request to `parts`, through the proxy that the environment
    names for its scheme (HTTP_PROXY / HTTPS_PROXY, unless NO_PROXY covers the host), as curl and pip do: plain
    http is sent to the proxy with the absolute URL, https is tunnelled with CONNECT."""
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    headers = {"Accept": "application/json"}
    secure = parts.scheme == "https"
    conn_class = http.client.HTTPSConnection if secure else http.client.HTTPConnection
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return conn_class(parts.hostname or "", parts.port, timeout=timeout_s), path, headers
    via = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if not via.hostname:
        raise ValueError(f"the proxy {proxy!r} the environment names has no host")
    auth = {}
    if via.username is not None:
        token = f"{urllib.parse.unquote(via.username)}:{urllib.parse.unquote(via.password or '')}"
        auth = {"Proxy-Authorization": "Basic " + base64.b64encode(token.encode()).decode()}
    conn = conn_class(via.hostname, via.port or 80, timeout=timeout_s)
    if secure:
        conn.set_tunnel(parts.hostname or "", parts.port or 443, headers=auth)
        return conn, path, headers
    return conn, urllib.parse.urlunsplit(parts._replace(fragment="")), {**headers, **auth}


def _read_at_most(resp: http.client.HTTPResponse, limit: int) -> bytes:
    """The body, or its first `limit` bytes, read in pieces so that memory grows only with what arrives."""
    chunks, size = [], 0
    while size < limit and (chunk := resp.read1(min(1 << 20, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
