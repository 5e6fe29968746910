"""GRIP proxy mode, edge by edge, against a small standard-library backend whose answers each test
scripts: pass-through, holds, keep-alives, prev-id replay, format isolation, the
WebSocket-over-HTTP bridge, backend failures, Grip-Sig, the publish API's checks and shutdown.
(Tests with the ecosystem's own libraries and the comparison with real Pushpin are in
test_grip.py.)"""

import asyncio
import base64
import hashlib
import hmac
import http.server
import json
import re
import signal
import socket
import threading
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus


class Backend:
    """A threaded HTTP/1.1 backend. `routes[path_prefix] = fn(handler, body) -> (status,
    headers, body)`; every request is recorded as (method, path, headers, body)."""

    def __init__(self):
        self.routes = {}
        self.seen = []
        self.cond = threading.Condition()
        backend = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with backend.cond:
                    backend.seen.append((self.command, self.path, dict(self.headers), body))
                    backend.cond.notify_all()
                for prefix in sorted(backend.routes, key=len, reverse=True):
                    if self.path.startswith(prefix):
                        status, headers, out = backend.routes[prefix](self, body)
                        break
                else:
                    status, headers, out = 404, {}, b"no such backend route\n"
                self.send_response(status)
                for k, v in headers.items():
                    for one in v if isinstance(v, list) else [v]:
                        self.send_header(k, one)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_HEAD = handle_any

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def wait_for(self, pred, timeout=5):
        """The first recorded request matching pred(method, path, headers, body)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for r in self.seen:
                    if pred(*r):
                        return r
                left = deadline - time.monotonic()
                assert left > 0, f"no matching backend request in {self.seen!r}"
                self.cond.wait(left)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def backend():
    b = Backend()
    yield b
    b.close()


@pytest.fixture
def proxy(start_server, backend, tmp_path):
    """start(routes_text=None, *args) -> Server; routes default to everything under /app and
    WebSocket-over-HTTP under /app/ws."""

    def start(*args, routes=None):
        text = routes or (
            f"*,path_beg=/app/ws 127.0.0.1:{backend.port},over_http\n"
            f"*,path_beg=/app 127.0.0.1:{backend.port}\n"
        )
        path = tmp_path / "routes"
        path.write_text(text)
        return start_server("--grip-routes", path, *args)

    return start


def publish(server, *items, headers=None):
    body = json.dumps({"items": list(items)}).encode()
    return server.request(
        "POST", "/publish/", body, {"Content-Type": "application/json", **(headers or {})}
    )


class Raw:
    """A client socket that reads exact bytes."""

    def __init__(self, server):
        host, port = server.clients.rsplit(":", 1)
        self.s = socket.create_connection((host, int(port)), timeout=5)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def read_until(self, token, timeout=5):
        deadline = time.monotonic() + timeout
        while token not in self.buf:
            self.s.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.s.recv(65536)
            if not chunk:
                raise EOFError(self.buf)
            self.buf += chunk
        i = self.buf.index(token) + len(token)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def read_to_eof(self, timeout=5):
        self.s.settimeout(timeout)
        while chunk := self.s.recv(65536):
            self.buf += chunk
        out, self.buf = self.buf, b""
        return out

    def response(self):
        """(status, headers dict lowercased, body) of one Content-Length answer."""
        head = self.read_until(b"\r\n\r\n").decode("latin-1")
        lines = head.split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", 0))
        while len(self.buf) < n:
            self.buf += self.s.recv(65536)
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, headers, body

    def close(self):
        self.s.close()


def hold(mode, channel, **extra):
    headers = {"Grip-Hold": mode, "Grip-Channel": channel, "Content-Type": "text/plain"}
    headers.update(extra)
    return lambda h, body: (200, headers, b"")


def test_pass_through_keeps_status_headers_body_and_the_connection(proxy, backend):
    backend.routes["/app/echo"] = lambda h, body: (
        201,
        {"X-Custom": "yes", "Content-Type": "application/octet-stream"},
        h.command.encode() + b" " + h.path.encode() + b" " + body,
    )
    server = proxy()
    c = Raw(server)
    c.send(
        b"POST /app/echo?x=1 HTTP/1.1\r\nHost: example.test\r\nContent-Length: 3\r\n"
        b"Grip-Sig: forged\r\nX-Forwarded-For: 10.0.0.1\r\n\r\nabc"
    )
    status, headers, body = c.response()
    assert status == 201 and headers["x-custom"] == "yes"
    assert body == b"POST /app/echo?x=1 abc"
    # Same connection, next request: keep-alive works through the proxy.
    c.send(b"GET /app/echo HTTP/1.1\r\nHost: example.test\r\n\r\n")
    assert c.response()[2] == b"GET /app/echo "
    c.send(b"HEAD /app/echo HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n")
    assert c.read_to_eof().startswith(b"HTTP/1.1 201 Created\r\n")
    _, _, seen, _ = backend.wait_for(lambda m, p, h, b: m == "POST")
    assert "Grip-Sig" not in seen, "a client's Grip-Sig must never reach the backend"
    assert seen["X-Forwarded-For"] == "10.0.0.1, 127.0.0.1"
    assert seen["X-Forwarded-Proto"] == "http"
    assert seen["Host"] == "example.test"


def test_pipelined_requests_are_answered_in_order(proxy, backend):
    backend.routes["/app/n"] = lambda h, body: (time.sleep(0.2), (200, {}, h.path.encode()))[1]
    server = proxy()
    c = Raw(server)
    # Three requests in one write: each waits for the one before it to be answered.
    c.send(b"".join(b"GET /app/n%d HTTP/1.1\r\nHost: h\r\n\r\n" % i for i in range(3)))
    assert [c.response()[2] for _ in range(3)] == [b"/app/n0", b"/app/n1", b"/app/n2"]


def test_routes_fall_back_to_clarion_endpoints_and_404(proxy, backend):
    backend.routes["/app"] = lambda h, b: (200, {}, b"backend\n")
    server = proxy(routes=f"example.test,path_beg=/app 127.0.0.1:{backend.port}\n")
    c = Raw(server)
    c.send(b"GET /app/x HTTP/1.1\r\nHost: Example.Test:8080\r\n\r\n")
    assert c.response()[2] == b"backend\n"
    c.send(b"GET /app/x HTTP/1.1\r\nHost: other.test\r\n\r\n")
    status, _, body = c.response()
    assert status == 404 and b"not found" in body
    # Clarion's own SSE endpoint still serves what no route takes.
    c.send(b"GET /sse?topic=t HTTP/1.1\r\nHost: other.test\r\n\r\n")
    assert b"text/event-stream" in c.read_until(b"\r\n\r\n")


@pytest.mark.parametrize(
    "answer, why",
    [
        ((200, {"Grip-Hold": "forever", "Grip-Channel": "c"}, b""), "GRIP instructions"),
        ((200, {"Grip-Hold": "stream", "Grip-Channel": "bad channel!"}, b""), "channel"),
        ((200, {"Grip-Hold": "stream"}, b""), "GRIP instructions"),
        (
            (200, {"Content-Type": "application/grip-instruct"}, b'{"hold": {"channels": []}}'),
            "grip-instruct",
        ),
    ],
)
def test_invalid_instructions_are_502_and_the_reason_is_logged(proxy, backend, answer, why):
    backend.routes["/app"] = lambda h, b: answer
    server = proxy()
    c = Raw(server)
    c.send(b"GET /app/x HTTP/1.1\r\nHost: h\r\n\r\n")
    # Pushpin's words to the client (no backend detail leaks); the reason goes to the log.
    assert c.response() == (
        502,
        {"content-type": "text/plain", "content-length": "32"},
        b"Error while proxying to origin.\n",
    )
    code, log = server.stop()
    assert code == 0 and "GRIP: invalid backend answer" in log and why in log, log


def test_backend_down_slow_and_refused_bodies(proxy, backend):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    backend.routes["/app/slow"] = lambda h, b: (time.sleep(3), (200, {}, b"late"))[1]
    server = proxy(
        "--grip-backend-timeout",
        "1",
        routes=f"*,path_beg=/down 127.0.0.1:{dead}\n*,path_beg=/app 127.0.0.1:{backend.port}\n"
        f"*,path_beg=/fallback 127.0.0.1:{dead} 127.0.0.1:{backend.port}\n",
    )
    backend.routes["/fallback"] = lambda h, b: (200, {}, b"second target\n")
    c = Raw(server)
    c.send(b"GET /down HTTP/1.1\r\nHost: h\r\n\r\n")
    status, _, body = c.response()
    assert status == 502 and body == b"Error while proxying to origin.\n"
    c.send(b"GET /fallback HTTP/1.1\r\nHost: h\r\n\r\n")
    assert c.response()[2] == b"second target\n"
    c.send(b"GET /app/slow HTTP/1.1\r\nHost: h\r\n\r\n")
    status, _, body = c.response()
    assert status == 504 and body == b"Timeout while proxying to origin.\n"
    # A chunked body is decoded and forwarded with its length.
    backend.routes["/app/echo"] = lambda h, body: (200, {}, body)
    c = Raw(server)
    c.send(b"POST /app/echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
    time.sleep(0.1)
    c.send(b"2\r\nde\r\n0\r\n\r\n")
    assert c.response()[2] == b"abcde"
    c.send(b"POST /app/echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    assert c.response()[0] == 400
    c = Raw(server)
    c.send(b"POST /app/x HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999\r\n\r\n")
    assert c.response()[0] == 413
    assert server.metrics()["clarion_grip_backend_errors_total"] >= 2


def jwt_claims(token, key):
    head, payload, sig = token.split(".")
    mac = hmac.new(key, f"{head}.{payload}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64encode(mac).rstrip(b"=").decode() == sig, "bad signature"
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_grip_sig_signs_requests_with_the_configured_or_route_key(proxy, backend):
    backend.routes["/"] = lambda h, b: (200, {}, b"ok")
    server = proxy(
        "--grip-sig-key",
        "s3cret",
        routes=f"*,path_beg=/own,sig_key=base64:{base64.b64encode(b'other').decode()},sig_iss=me "
        f"127.0.0.1:{backend.port}\n* 127.0.0.1:{backend.port}\n",
    )
    c = Raw(server)
    for path in (b"/a", b"/own"):
        c.send(b"GET " + path + b" HTTP/1.1\r\nHost: h\r\n\r\n")
        assert c.response()[0] == 200
    _, _, h, _ = backend.wait_for(lambda m, p, h, b: p == "/a")
    claims = jwt_claims(h["Grip-Sig"], b"s3cret")
    assert claims["iss"] == "pushpin" and claims["exp"] > time.time() + 600
    _, _, h, _ = backend.wait_for(lambda m, p, h, b: p == "/own")
    assert jwt_claims(h["Grip-Sig"], b"other")["iss"] == "me"


def test_stream_hold_chunked_for_http11_and_close_delimited_for_http10(proxy, backend):
    backend.routes["/app/s"] = lambda h, b: (
        200,
        {"Grip-Hold": "stream", "Grip-Channel": "s", "Content-Type": "text/plain", "X-A": "1"},
        b"start\n",
    )
    server = proxy()
    c11, c10 = Raw(server), Raw(server)
    c11.send(b"GET /app/s HTTP/1.1\r\nHost: h\r\n\r\n")
    c10.send(b"GET /app/s HTTP/1.0\r\nHost: h\r\n\r\n")
    head = c11.read_until(b"\r\n\r\n").lower()
    assert b"transfer-encoding: chunked" in head and b"x-a: 1" in head
    assert b"grip-" not in head and b"content-length" not in head
    assert c11.read_until(b"start\n\r\n") == b"6\r\nstart\n\r\n"
    head10 = c10.read_until(b"\r\n\r\n").lower()
    assert b"chunked" not in head10 and b"connection: close" in head10
    assert c10.read_until(b"start\n") == b"start\n"
    assert server.metrics()["clarion_grip_held"] == 2
    for text in ("one\n", "two\n"):
        assert publish(server, {"channel": "s", "formats": {"http-stream": {"content": text}}})[0] == 200
    assert c11.read_until(b"two\n\r\n") == b"4\r\none\n\r\n4\r\ntwo\n\r\n"
    assert c10.read_until(b"two\n") == b"one\ntwo\n"
    publish(server, {"channel": "s", "formats": {"http-stream": {"action": "close"}}})
    # HTTP/1.1: the last chunk, and the connection serves the next request (as Pushpin does);
    # HTTP/1.0: the end of a close-delimited body is the end of the connection.
    assert c11.read_until(b"0\r\n\r\n") == b"0\r\n\r\n"
    assert c10.read_to_eof() == b""
    backend.routes["/app/plain"] = lambda h, b: (200, {}, b"next\n")
    c11.send(b"GET /app/plain HTTP/1.1\r\nHost: h\r\n\r\n")
    assert c11.response()[2] == b"next\n"
    assert server.metrics()["clarion_grip_held"] == 0


def test_prev_id_replays_what_history_holds_after_it(proxy, backend):
    backend.routes["/app/s"] = lambda h, b: (
        200,
        {"Grip-Hold": "stream", "Grip-Channel": "r; prev-id=b", "Content-Type": "text/plain"},
        b"",
    )
    server = proxy()
    for i in "abc":
        item = {"channel": "r", "id": i, "formats": {"http-stream": {"content": f"{i}\n"}}}
        publish(server, item)
    c = Raw(server)
    c.send(b"GET /app/s HTTP/1.1\r\nHost: h\r\n\r\n")
    c.read_until(b"\r\n\r\n")
    assert c.read_until(b"c\n\r\n") == b"2\r\nc\n\r\n"
    publish(server, {"channel": "r", "id": "d", "formats": {"http-stream": {"content": "d\n"}}})
    assert c.read_until(b"d\n\r\n") == b"2\r\nd\n\r\n"


def test_keep_alive_data_when_quiet(proxy, backend):
    backend.routes["/app/s"] = lambda h, b: (
        200,
        {
            "Grip-Hold": "stream",
            "Grip-Channel": "k",
            "Grip-Keep-Alive": "ka\\n; format=cstring; timeout=1",
        },
        b"",
    )
    server = proxy()
    c = Raw(server)
    c.send(b"GET /app/s HTTP/1.1\r\nHost: h\r\n\r\n")
    c.read_until(b"\r\n\r\n")
    t0 = time.monotonic()
    assert c.read_until(b"ka\n\r\n", timeout=4) == b"3\r\nka\n\r\n"
    assert time.monotonic() - t0 < 3.5


def test_response_hold_answered_by_publish_or_by_the_backend_at_timeout(proxy, backend):
    backend.routes["/app/p"] = lambda h, b: (
        200,
        {"Grip-Hold": "response", "Grip-Channel": "p", "Grip-Timeout": "1", "X-From": "backend"},
        b"nothing yet\n",
    )
    server = proxy()
    c = Raw(server)
    c.send(b"GET /app/p HTTP/1.1\r\nHost: h\r\n\r\n")
    backend.wait_for(lambda m, p, h, b: p == "/app/p")
    time.sleep(0.2)
    item = {
        "channel": "p",
        "formats": {
            "http-response": {"code": 202, "headers": {"X-Pub": "1"}, "body": "published\n"}
        },
    }
    assert publish(server, item)[0] == 200
    status, headers, body = c.response()
    assert (status, headers["x-pub"], body) == (202, "1", b"published\n")
    # Same connection, a new hold: this one times out with the backend's own answer.
    t0 = time.monotonic()
    c.send(b"GET /app/p HTTP/1.1\r\nHost: h\r\n\r\n")
    status, headers, body = c.response()
    assert (status, headers["x-from"], body) == (200, "backend", b"nothing yet\n")
    assert 0.5 < time.monotonic() - t0 < 4
    assert "grip-hold" not in headers


def test_a_format_reaches_only_connections_held_in_that_mode(proxy, backend):
    backend.routes["/app/s"] = hold("stream", "f")
    backend.routes["/app/p"] = hold("response", "f")
    backend.routes["/app/ws"] = ws_backend(backend, subscribe="f")
    server = proxy()
    stream, poll = Raw(server), Raw(server)
    stream.send(b"GET /app/s HTTP/1.1\r\nHost: h\r\n\r\n")
    stream.read_until(b"\r\n\r\n")
    poll.send(b"GET /app/p HTTP/1.1\r\nHost: h\r\n\r\n")

    async def run():
        async with connect(f"ws://{server.clients}/app/ws") as ws:
            await asyncio.wait_for(ws.recv(), 5)  # "welcome": the subscription is in place
            # Native subscribers of the channel see the ws-message content.
            async with connect(f"ws://{server.clients}/ws?topic=f") as native:
                await asyncio.sleep(0.2)
                publish(server, {"channel": "f", "formats": {"ws-message": {"content": "to-ws"}}})
                assert await asyncio.wait_for(ws.recv(), 5) == "to-ws"
                assert await asyncio.wait_for(native.recv(), 5) == "to-ws"
            publish(server, {"channel": "f", "formats": {"http-stream": {"content": "to-stream\n"}}})
            assert stream.read_until(b"to-stream\n\r\n").endswith(b"to-stream\n\r\n")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(ws.recv(), 0.5)
            publish(server, {"channel": "f", "formats": {"http-response": {"body": "to-poll\n"}}})
            assert poll.response()[2] == b"to-poll\n"

    asyncio.run(run())
    # The stream saw only its own format: nothing but its chunk arrived.
    assert stream.buf == b""


def events(body):
    out, i = [], 0
    while i < len(body):
        line_end = body.index(b"\r\n", i)
        line = body[i:line_end].decode()
        i = line_end + 2
        if " " in line:
            name, size = line.split(" ")
            n = int(size, 16)
            out.append((name, body[i : i + n]))
            i += n + 2
        else:
            out.append((line, b""))
    return out


def encode(evs):
    out = b""
    for name, content in evs:
        out += f"{name} {len(content):x}\r\n".encode() + content + b"\r\n" if content is not None else f"{name}\r\n".encode()
    return out


def ws_backend(backend, subscribe=None, extra_headers=None, on_text=None):
    """A WebSocket-over-HTTP endpoint: accepts with the grip extension, says welcome,
    subscribes to `subscribe`; TEXT events go to on_text(text) -> list of events to answer."""

    def handle(h, body):
        evs = events(body)
        out = []
        headers = {"Content-Type": "application/websocket-events", "Sec-WebSocket-Extensions": "grip"}
        headers.update(extra_headers or {})
        for name, content in evs:
            if name == "OPEN":
                out.append(("OPEN", None))
                if subscribe:
                    ctl = json.dumps({"type": "subscribe", "channel": subscribe}).encode()
                    out.append(("TEXT", b"c:" + ctl))
                out.append(("TEXT", b"m:welcome"))
            elif name == "TEXT" and on_text:
                out.extend(on_text(content.decode()))
        return 200, headers, encode(out)

    return handle


def test_websocket_bridge_events_meta_and_close(proxy, backend):
    def on_text(text):
        if text == "detach":
            return [("TEXT", b'c:{"type":"detach"}'), ("TEXT", b"m:detached")]
        if text == "bye":
            return [("CLOSE", b"\x0f\xa0done")]  # 4000 "done"
        if text == "unsub":
            return [("TEXT", b'c:{"type":"unsubscribe","channel":"w"}'), ("TEXT", b"m:unsubscribed")]
        return [("TEXT", b"m:echo " + text.encode()), ("TEXT", b"not prefixed: dropped")]

    backend.routes["/app/ws"] = ws_backend(
        backend, subscribe="w", extra_headers={"Set-Meta-User": "alice"}, on_text=on_text
    )

    async def run():
        async with connect(
            f"ws://{server.clients}/app/ws/room", subprotocols=["chat", "other"]
        ) as ws:
            assert await ws.recv() == "welcome"
            await ws.send("hi")
            assert await asyncio.wait_for(ws.recv(), 5) == "echo hi"
            await ws.ping(b"pp")
            publish(server, {"channel": "w", "formats": {"ws-message": {"content": "pub"}}})
            assert await asyncio.wait_for(ws.recv(), 5) == "pub"
            await ws.send("unsub")
            assert await asyncio.wait_for(ws.recv(), 5) == "unsubscribed"
            publish(server, {"channel": "w", "formats": {"ws-message": {"content": "missed"}}})
            await ws.send("bye")
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd.code == 4000 and closed.value.rcvd.reason == "done"

    server = proxy()
    asyncio.run(run())
    opens = [r for r in backend.seen if r[1] == "/app/ws/room" and r[3] == b"OPEN\r\n"]
    assert len(opens) == 1
    _, _, open_headers, _ = opens[0]
    assert open_headers["Content-Type"] == "application/websocket-events"
    conn_id = open_headers["Connection-Id"]
    later = [r for r in backend.seen if r[2].get("Connection-Id") == conn_id and r[3] != b"OPEN\r\n"]
    assert later and all(r[2].get("Meta-User") == "alice" for r in later)
    assert any(b"TEXT 2\r\nhi\r\n" in r[3] for r in later)
    assert any(b"PING 2\r\npp\r\n" in r[3] for r in later)


def test_websocket_bridge_refusal_detach_and_disconnect(proxy, backend):
    backend.routes["/app/ws/no"] = lambda h, b: (403, {"Content-Type": "text/plain"}, b"go away\n")
    backend.routes["/app/ws/yes"] = ws_backend(
        backend,
        extra_headers={"Keep-Alive-Interval": "1"},
        on_text=lambda t: [("TEXT", b'c:{"type":"detach"}')] if t == "detach" else [],
    )
    server = proxy()

    async def run():
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"ws://{server.clients}/app/ws/no"):
                pass
        assert refused.value.response.status_code == 403
        assert refused.value.response.body == b"go away\n"
        ws = await connect(f"ws://{server.clients}/app/ws/yes")
        assert await ws.recv() == "welcome"
        await ws.send("detach")
        backend.wait_for(lambda m, p, h, b: b"TEXT 6\r\ndetach" in b)
        await asyncio.sleep(0.3)
        await ws.send("after detach")
        await asyncio.sleep(0.3)
        ws.transport.abort()
        # Without detach, a client that vanishes without a close handshake is reported.
        other = await connect(f"ws://{server.clients}/app/ws/yes")
        assert await other.recv() == "welcome"
        other.transport.abort()

    asyncio.run(run())
    _, _, h, _ = backend.wait_for(lambda m, p, h, b: b == b"DISCONNECT\r\n")
    detached_id = backend.wait_for(lambda m, p, h, b: b"detach" in b)[2]["Connection-Id"]
    assert h["Connection-Id"] != detached_id
    # A detached connection's messages, keep-alives and end never reach the backend.
    time.sleep(1.5)
    assert [r[3] for r in backend.seen if r[2]["Connection-Id"] == detached_id] == [
        b"OPEN\r\n",
        b"TEXT 6\r\ndetach\r\n",
    ]


def test_a_client_gone_during_open_is_reported(proxy, backend):
    def slow_open(h, body):
        time.sleep(0.5)
        return 200, {"Content-Type": "application/websocket-events"}, b"OPEN\r\n"

    backend.routes["/app/ws/slow"] = slow_open
    server = proxy()
    c = Raw(server)
    c.send(
        b"GET /app/ws/slow HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    _, _, opened, _ = backend.wait_for(lambda m, p, h, b: b == b"OPEN\r\n")
    c.close()
    _, _, gone, _ = backend.wait_for(lambda m, p, h, b: b == b"DISCONNECT\r\n")
    assert gone["Connection-Id"] == opened["Connection-Id"]


def test_websocket_keep_alive_interval_sends_empty_requests(proxy, backend):
    backend.routes["/app/ws"] = ws_backend(backend, extra_headers={"Keep-Alive-Interval": "1"})
    server = proxy()

    async def run():
        async with connect(f"ws://{server.clients}/app/ws") as ws:
            assert await ws.recv() == "welcome"
            await asyncio.to_thread(
                backend.wait_for, lambda m, p, h, b: p == "/app/ws" and b == b"", 5
            )

    asyncio.run(run())


def test_publish_api_checks_and_authentication(start_server, tmp_path, backend):
    routes = tmp_path / "routes"
    routes.write_text(f"* 127.0.0.1:{backend.port}\n")
    server = start_server("--grip-routes", routes, "--api-key", "k3y")
    item = {"channel": "c", "formats": {"http-stream": {"content": "x"}}}
    assert publish(server, item)[0] == 401
    ok = {"Authorization": "Bearer k3y"}
    assert publish(server, item, headers=ok)[0] == 200
    hdr = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=")
    claims = base64.urlsafe_b64encode(
        json.dumps({"iss": "pub", "exp": int(time.time()) + 60}).encode()
    ).rstrip(b"=")
    sig = base64.urlsafe_b64encode(
        hmac.new(b"k3y", hdr + b"." + claims, hashlib.sha256).digest()
    ).rstrip(b"=")
    jwt = (hdr + b"." + claims + b"." + sig).decode()
    assert publish(server, item, headers={"Authorization": f"Bearer {jwt}"})[0] == 200
    basic = base64.b64encode(b"user:k3y").decode()
    assert publish(server, item, headers={"Authorization": f"Basic {basic}"})[0] == 200
    status, _, body = publish(
        server, {"channel": "c", "formats": {"http-stream": {"action": "hint"}}}, headers=ok
    )
    assert status == 400 and b"hint" in body
    status, _, body = publish(
        server, {"channel": "no spaces", "formats": {"http-stream": {"content": "x"}}}, headers=ok
    )
    assert status == 400 and b"channel" in body
    status, _, body = server.request("POST", "/publish/", b"{not json", ok)
    assert status == 400


def test_shutdown_ends_streams_and_answers_polls(proxy, backend):
    backend.routes["/app/s"] = hold("stream", "z")
    backend.routes["/app/p"] = lambda h, b: (
        200,
        {"Grip-Hold": "response", "Grip-Channel": "z", "Grip-Timeout": "60"},
        b"timeout body\n",
    )
    server = proxy()
    stream, poll = Raw(server), Raw(server)
    stream.send(b"GET /app/s HTTP/1.1\r\nHost: h\r\n\r\n")
    stream.read_until(b"\r\n\r\n")
    poll.send(b"GET /app/p HTTP/1.1\r\nHost: h\r\n\r\n")
    deadline = time.monotonic() + 5
    while server.metrics()["clarion_grip_held"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    server.proc.send_signal(signal.SIGTERM)
    assert stream.read_to_eof() == b"0\r\n\r\n"
    status, _, body = poll.response()
    assert (status, body) == (200, b"timeout body\n")
    assert server.proc.wait(timeout=15) == 0


FORGED = {
    "Meta-User": "admin",
    "Meta_Role": "root",
    "Connection-Id": "victim-conn-42",
    "Connection_Id": "victim-conn-43",
    "Grip_Sig": "forged-sig",
    "Grip-Last": "forged-last",
}


def test_a_client_cannot_forge_what_clarion_tells_the_backend(proxy, backend):
    # Every request the backend gets, with every header value (duplicates included).
    got = []

    def recorded(route):
        def handle(h, body):
            got.append((h.path, body, list(h.headers.items())))
            return route(h, body)

        return handle

    backend.routes["/app/ws"] = recorded(
        ws_backend(backend, extra_headers={"Set-Meta-User": "alice"}, on_text=lambda t: [("TEXT", b"m:ok")])
    )
    backend.routes["/app/plain"] = recorded(lambda h, body: (200, {}, b"plain"))
    server = proxy()

    async def run():
        headers = {**FORGED, "Content-Type": "text/evil", "Accept": "evil/accept"}
        async with connect(f"ws://{server.clients}/app/ws/room", additional_headers=headers) as ws:
            assert await ws.recv() == "welcome"
            await ws.send("hi")
            assert await asyncio.wait_for(ws.recv(), 5) == "ok"

    asyncio.run(run())
    backend.wait_for(lambda m, p, h, b: p == "/app/ws/room" and (b"CLOSE" in b or b"DISCONNECT" in b))
    raw = Raw(server)
    raw.send(
        b"GET /app/plain HTTP/1.1\r\nHost: x\r\n"
        + b"".join(f"{k}: {v}\r\n".encode() for k, v in FORGED.items())
        + b"Content-Type: text/mine\r\nContent-Length: 0\r\n\r\n"
    )
    assert raw.response()[0] == 200
    raw.close()

    bridge = [r for r in got if r[0] == "/app/ws/room"]
    plain = [r for r in got if r[0] == "/app/plain"]
    assert len(bridge) >= 3 and len(plain) == 1, [(p, b) for p, b, _ in got]
    for path, body, items in got:
        values = [v for _, v in items]
        for forged in FORGED.values():
            assert forged not in values, (path, body, items)
        names = [k.lower().replace("_", "-") for k, _ in items]
        assert names.count("connection-id") == (1 if path == "/app/ws/room" else 0), items
        assert names.count("content-type") <= 1, items
    for _, _, items in bridge:
        h = dict((k.lower(), v) for k, v in items)
        assert h["content-type"] == h["accept"] == "application/websocket-events", items
        assert h.get("meta-user") in (None, "alice"), items
    assert dict((k.lower(), v) for k, v in plain[0][2])["content-type"] == "text/mine"


def test_two_host_headers_are_refused(proxy, backend):
    server = proxy()
    for addr in (server.clients, server.api):
        host, port = addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"GET /app/x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
            answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert b"more than one Host header field" in answer, answer
    assert not [r for r in backend.seen if r[1] == "/app/x"]
