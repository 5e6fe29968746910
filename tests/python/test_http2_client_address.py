"""The client's address and scheme over HTTP/2 (issue 55, item 2): an HTTP/2 stream has no
socket of its own, so what a backend is told about the client comes from the stream's
connection. A GRIP backend gets the client's address as the last `X-Forwarded-For` entry (after
a forged one the client sent) and the scheme it connected with (`https`/`wss` over TLS), and the
connect hook gets `remote_addr`, over h2c and TLS h2 alike, for requests and RFC 8441
WebSockets."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import h2client
from h2client import Client
from test_tls import make_dev_cert, tls_args


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    return make_dev_cert(tmp_path_factory.mktemp("h2addr"))


@pytest.fixture(params=["h2c", "tls"])
def mode(request):
    return request.param


class Recorder:
    """A backend that keeps (method, path, headers, body) of every request and answers GRIP
    requests (a WebSocket-over-HTTP OPEN for POST /ws/..., plain text otherwise) and connect
    hooks (allow)."""

    def __init__(self):
        self.seen = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _record(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                outer.seen.append((self.command, self.path, dict(self.headers), body))
                return body

            def _answer(self, body, headers):
                self.send_response(200)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._record()
                self._answer(b"plain\n", {"Content-Type": "text/plain"})

            def do_POST(self):
                self._record()
                if self.path.startswith("/hooks/"):
                    self._answer(b'{"allow":true}', {"Content-Type": "application/json"})
                else:
                    self._answer(b"OPEN\r\n", {"Content-Type": "application/websocket-events",
                                               "Sec-WebSocket-Extensions": "grip"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, pred, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for item in list(self.seen):
                if pred(*item):
                    return item
            time.sleep(0.02)
        raise AssertionError(f"no such request; seen {[(m, p) for m, p, _, _ in self.seen]}")

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder():
    r = Recorder()
    yield r
    r.close()


def connect(s, dev, mode):
    c = Client(s.tls, ca=dev["ca"]) if mode == "tls" else Client(s.clients)
    c.pump(lambda: h2client.SETTINGS_ENABLE_CONNECT_PROTOCOL in c.remote_settings, what="SETTINGS")
    return c


def open_ws(c, path):
    headers = [("sec-websocket-version", "13")]
    sid = c.request(path, method="CONNECT", headers=headers, end_stream=False)
    c.pump(lambda: sid in c.headers or sid in c.resets, what="the CONNECT answer")
    return sid


def test_grip_backend_gets_the_client_address_and_scheme_over_h2(start_server, dev, mode, recorder, tmp_path):
    routes = tmp_path / "routes"
    routes.write_text(
        f"*,path_beg=/ws/ 127.0.0.1:{recorder.port},over_http\n* 127.0.0.1:{recorder.port}\n"
    )
    s = start_server(*tls_args(dev), "--grip-routes", routes)
    c = connect(s, dev, mode)
    secure = mode == "tls"

    sid = c.request("/plain", headers=[("x-forwarded-for", "6.6.6.6")])
    c.pump(lambda: sid in c.ended, what="the plain answer")
    assert c.status(sid) == 200
    _, _, h, _ = recorder.wait(lambda m, p, h, b: p == "/plain")
    assert h["X-Forwarded-For"] == "6.6.6.6, 127.0.0.1", h
    assert h["X-Forwarded-Proto"] == ("https" if secure else "http"), h

    sid = open_ws(c, "/ws/room")
    assert c.status(sid) == 200, c.headers[sid]
    _, _, h, _ = recorder.wait(lambda m, p, h, b: m == "POST" and p == "/ws/room")
    assert h["X-Forwarded-For"] == "127.0.0.1", h
    assert h["X-Forwarded-Proto"] == ("wss" if secure else "ws"), h
    c.close()


def test_connect_hook_gets_the_client_address_over_h2(start_server, dev, mode, recorder):
    base = f"http://127.0.0.1:{recorder.port}"
    s = start_server(*tls_args(dev), "--hook-connect-url", f"{base}/hooks/connect")
    c = connect(s, dev, mode)

    sid = c.request("/sse?topic=sse-topic")
    c.pump(lambda: sid in c.headers, what="the SSE answer")
    assert c.status(sid) == 200
    _, _, _, body = recorder.wait(lambda m, p, h, b: b"sse-topic" in b)
    assert json.loads(body)["remote_addr"] == "127.0.0.1", body

    sid = open_ws(c, "/ws?topic=ws-topic")
    assert c.status(sid) == 200
    _, _, _, body = recorder.wait(lambda m, p, h, b: b"ws-topic" in b)
    req = json.loads(body)
    assert (req["remote_addr"], req["transport"]) == ("127.0.0.1", "ws"), req
    c.close()
