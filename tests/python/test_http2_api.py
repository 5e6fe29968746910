"""HTTP/2 on the API listener: curl with prior knowledge (h2c) and over TLS (ALPN h2), and the
`h2` package for what curl does not show: several publishes multiplexed on one connection
(served in the order their streams opened), a body without content-length, errors that end
only their stream, a dashboard feed that sends the other streams away, and bad input.
"""

import json
import socket
import subprocess
import time

import h2.config
import h2.connection
import h2.errors
import h2.events

from h2client import h1_sse

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def curl(*args, timeout=20):
    """(status line, headers+body text) of one curl request with its response head (-i)."""
    p = subprocess.run(
        ["curl", "-sS", "-i", "--max-time", "10", *args],
        capture_output=True,
        timeout=timeout,
    )
    assert p.returncode == 0, p.stderr
    first, _, rest = p.stdout.decode().partition("\r\n")
    return first.strip(), rest


def events(sock, buf, count, within=10):
    """The `data:` lines of the next `count` events on an event stream."""
    out = []
    deadline = time.time() + within
    while len(out) < count:
        assert time.time() < deadline, (out, buf)
        while b"\n\n" in buf and len(out) < count:
            event, _, buf = buf.partition(b"\n\n")
            data = [l[6:] for l in event.decode().split("\n") if l.startswith("data: ")]
            if data:
                out.append("\n".join(data))
        if len(out) < count:
            chunk = sock.recv(65536)
            assert chunk, out
            buf += chunk
    return out


class Client:
    """An HTTP/2 client connection (the `h2` package) on a plain socket."""

    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.authority = addr
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.flush()
        self.answers = {}
        self.ended = set()
        self.resets = {}
        self.goaway = None
        self.closed = False

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def headers(self, method, path, extra=(), end_stream=False):
        sid = self.conn.get_next_available_stream_id()
        fields = [(":method", method), (":path", path), (":scheme", "http"), (":authority", self.authority)]
        self.conn.send_headers(sid, fields + list(extra), end_stream=end_stream)
        self.flush()
        return sid

    def data(self, sid, body, end_stream=True):
        self.conn.send_data(sid, body, end_stream=end_stream)
        self.flush()

    def pump(self, until, within=10):
        """Reads until `until()` holds."""
        deadline = time.time() + within
        while not until():
            assert time.time() < deadline, (self.answers, self.resets, self.goaway)
            self.sock.settimeout(max(0.05, deadline - time.time()))
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            if not data:
                self.closed = True
                return
            for ev in self.conn.receive_data(data):
                sid = getattr(ev, "stream_id", None)
                if isinstance(ev, h2.events.ResponseReceived):
                    self.answers[sid] = {"headers": dict(ev.headers), "body": b""}
                elif isinstance(ev, h2.events.DataReceived):
                    self.answers[sid]["body"] += ev.data
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, sid)
                elif isinstance(ev, h2.events.StreamEnded):
                    self.ended.add(sid)
                elif isinstance(ev, h2.events.StreamReset):
                    self.resets[sid] = ev.error_code
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    self.goaway = ev
            self.flush()

    def status(self, sid):
        return int(self.answers[sid]["headers"][b":status"])

    def json(self, sid):
        return json.loads(self.answers[sid]["body"])


def seq(message_id):
    return int(message_id.rsplit("-", 1)[1])


def test_curl_publishes_with_prior_knowledge_and_a_subscriber_receives_it(server):
    sub, buf = h1_sse(server.clients, "h2t")
    status, rest = curl("--http2-prior-knowledge", "-XPOST", f"http://{server.api}/publish/h2t", "-d", "x")
    assert status == "HTTP/2 200", (status, rest)
    answer = json.loads(rest.partition("\r\n\r\n")[2])
    assert answer["topic"] == "h2t" and answer["subscribers"] == 1, answer
    assert events(sub, buf, 1) == ["x"]
    # HTTP/1.1 on the same port is unaffected.
    status, _ = curl("--http1.1", f"http://{server.api}/healthz")
    assert status == "HTTP/1.1 200 OK"


def test_healthz_and_metrics_over_h2c(server):
    status, rest = curl("--http2-prior-knowledge", f"http://{server.api}/healthz")
    assert status == "HTTP/2 200" and rest.endswith("\r\n\r\nok\n"), (status, rest)
    status, rest = curl("--http2-prior-knowledge", f"http://{server.api}/metrics")
    assert status == "HTTP/2 200" and "clarion_connections" in rest, (status, rest[:300])


def test_streams_multiplexed_on_one_connection_are_all_served_in_the_order_they_opened(server):
    sub, buf = h1_sse(server.clients, "mux")
    c = Client(server.api)
    sids = []
    # Five requests opened at once, their bodies sent afterwards, last stream first; the third
    # has no content-length (its body is passed on as chunks).
    for i in range(5):
        extra = [("content-type", "text/plain")]
        if i != 2:
            extra.append(("content-length", str(len(f"m{i}"))))
        sids.append(c.headers("POST", "/publish/mux", extra))
    for i in reversed(range(5)):
        if i == 2:
            c.data(sids[i], b"m", end_stream=False)
            c.data(sids[i], b"2")
        else:
            c.data(sids[i], f"m{i}".encode())
    c.pump(lambda: all(s in c.ended for s in sids))
    assert [c.status(s) for s in sids] == [200] * 5, c.answers
    ids = [seq(c.json(s)["id"]) for s in sids]
    assert ids == sorted(ids), ids
    assert events(sub, buf, 5) == ["m0", "m1", "m2", "m3", "m4"]
    # The connection goes on serving.
    again = c.headers("GET", "/healthz", end_stream=True)
    c.pump(lambda: again in c.ended)
    assert c.status(again) == 200 and c.answers[again]["body"] == b"ok\n"


def test_401_without_the_key_and_413_over_max_publish_size_end_only_their_stream(start_server):
    s = start_server("--api-key", "k", "--max-publish-size", "10")
    status, _ = curl("--http2-prior-knowledge", "-XPOST", f"http://{s.api}/publish/t", "-d", "x")
    assert status == "HTTP/2 401"
    auth = ["-H", "Authorization: Bearer k"]
    status, rest = curl("--http2-prior-knowledge", *auth, "-XPOST", f"http://{s.api}/publish/t", "-d", "y" * 100)
    assert status == "HTTP/2 413" and "max_publish_size" in rest, (status, rest)
    status, _ = curl("--http2-prior-knowledge", *auth, "-XPOST", f"http://{s.api}/publish/t", "-d", "small")
    assert status == "HTTP/2 200"
    # On one connection: a 401 with a body, a 413 declared, a 413 found while reading chunks,
    # then a publish that goes through.
    c = Client(s.api)
    key = [("authorization", "Bearer k")]
    no_key = c.headers("POST", "/publish/t", [("content-length", "3")])
    c.data(no_key, b"abc")
    declared = c.headers("POST", "/publish/t", key + [("content-length", "100")])
    c.data(declared, b"z" * 100)
    chunked = c.headers("POST", "/publish/t", key)
    c.data(chunked, b"z" * 40)
    ok = c.headers("POST", "/publish/t", key + [("content-length", "2")])
    c.data(ok, b"ok")
    c.pump(lambda: ok in c.ended)
    assert [c.status(x) for x in (no_key, declared, chunked, ok)] == [401, 413, 413, 200], c.answers
    assert c.json(ok)["topic"] == "t"


class Frames:
    """A client that sends with the `h2` package but reads frames itself: the package takes
    any GOAWAY for the end of the connection, while a graceful one lets open streams finish."""

    def __init__(self, addr):
        self.c = Client(addr)
        self.buf = b""
        self.got = []
        self.closed = False

    def read(self, until, within=10):
        deadline = time.time() + within
        while not until():
            assert time.time() < deadline, self.got
            self.c.sock.settimeout(max(0.05, deadline - time.time()))
            try:
                data = self.c.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                return
            self.buf += data
            whole = frames(self.buf)
            used = sum(9 + len(f[3]) for f in whole)
            self.buf = self.buf[used:]
            self.got += whole

    def data(self, sid):
        return b"".join(f[3] for f in self.got if f[0] == 0x0 and f[2] == sid)

    def rst(self, sid):
        codes = [int.from_bytes(f[3][:4], "big") for f in self.got if f[0] == 0x3 and f[2] == sid]
        return codes[0] if codes else None

    def goaway(self):
        codes = [int.from_bytes(f[3][4:8], "big") for f in self.got if f[0] == 0x7]
        return codes[0] if codes else None

    def goaway_last_stream(self):
        return next(int.from_bytes(f[3][:4], "big") & 0x7FFFFFFF for f in self.got if f[0] == 0x7)


def test_a_dashboard_feed_sends_the_other_streams_to_a_new_connection(server):
    f = Frames(server.api)
    feed = f.c.headers("GET", "/dashboard/feed", end_stream=True)
    f.read(lambda: b"event: window" in f.data(feed))
    # The feed lasts until the tab closes: a graceful GOAWAY takes the client's next requests
    # to a new connection, which serves them.
    f.read(lambda: f.goaway() is not None)
    assert f.goaway() == 0
    status, _ = curl("--http2-prior-knowledge", f"http://{server.api}/healthz")
    assert status == "HTTP/2 200"
    # The feed goes on (a stats event a second) on the old connection.
    seen = len(f.data(feed))
    f.read(lambda: b"event: stats" in f.data(feed)[seen:], within=5)
    # Closing the tab (resetting the stream) ends the connection and frees its thread.
    f.c.conn.reset_stream(feed, h2.errors.ErrorCodes.CANCEL)
    f.c.flush()
    f.read(lambda: f.closed, within=5)


def test_a_feed_refuses_the_streams_opened_behind_it(server):
    f = Frames(server.api)
    conn = f.c.conn
    fields = [(":method", "GET"), (":scheme", "http"), (":authority", server.api)]
    # Sent together, so that the three usually wait behind the feed when it starts.
    conn.send_headers(1, fields + [(":path", "/dashboard/feed")], end_stream=True)
    behind = [3, 5, 7]
    for b in behind:
        conn.send_headers(b, fields + [(":path", "/healthz")], end_stream=True)
    f.c.flush()
    f.read(lambda: f.goaway() is not None and b"event: window" in f.data(1))

    def refused(b):
        # Reset as never processed, or above the GOAWAY's last stream (never taken).
        return f.rst(b) == h2.errors.ErrorCodes.REFUSED_STREAM or b > f.goaway_last_stream()

    f.read(lambda: all(refused(b) for b in behind), within=5)
    assert not any(f.data(b) for b in behind), f.got


def raw(addr, data, within=5):
    """Sends `data` on a new connection; everything read until the server closes it."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=within) as sock:
        sock.sendall(data)
        got = b""
        deadline = time.time() + within
        while time.time() < deadline:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return got
            if not chunk:
                return got
            got += chunk
        raise AssertionError(f"still open after {within}s: {got!r}")


def frames(data):
    """(type, flags, stream, payload) of the whole frames in `data`."""
    out, pos = [], 0
    while pos + 9 <= len(data):
        n = int.from_bytes(data[pos:pos + 3], "big")
        out.append((data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF,
                    data[pos + 9:pos + 9 + n]))
        pos += 9 + n
    return out


def goaway_code(data):
    codes = [int.from_bytes(f[3][4:8], "big") for f in frames(data) if f[0] == 0x7]
    return codes[0] if codes else None


def test_bad_input_ends_only_its_connection_with_a_goaway(server):
    keep = Client(server.api)
    # A broken preface: closed without an answer.
    got = raw(server.api, b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + b"\0" * 20)
    assert got == b"", got
    # Garbage after the preface: SETTINGS, then GOAWAY with PROTOCOL_ERROR (or FRAME_SIZE_ERROR).
    got = raw(server.api, PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\xff" * 64)
    assert goaway_code(got) in (0x1, 0x6), frames(got)
    # A stream on an even (server) id: PROTOCOL_ERROR.
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    headers_on_2 = b"\x00\x00\x01\x01\x05\x00\x00\x00\x02\x82"
    got = raw(server.api, PREFACE + settings + headers_on_2)
    assert goaway_code(got) == 0x1, frames(got)
    # The others are served, on the connection already open and on new ones.
    sid = keep.headers("GET", "/healthz", end_stream=True)
    keep.pump(lambda: sid in keep.ended)
    assert keep.status(sid) == 200
    status, _ = curl("--http2-prior-knowledge", f"http://{server.api}/healthz")
    assert status == "HTTP/2 200"
    assert server.metrics()["clarion_h2_errors_total"] >= 2


def test_a_tls_api_negotiates_h2_by_alpn(start_server, cert):
    s = start_server("--tls-listen", "127.0.0.1:0", "--tls-cert", cert / "cert.pem", "--tls-key",
                     cert / "key.pem", "--tls-api")
    port = s.api.rsplit(":", 1)[1]
    status, rest = curl("--http2", "-k", f"https://localhost:{port}/healthz")
    assert status == "HTTP/2 200" and rest.endswith("ok\n"), (status, rest)
    status, rest = curl("--http2", "-k", "-XPOST", f"https://localhost:{port}/publish/tls", "-d", "x")
    assert status == "HTTP/2 200" and '"topic":"tls"' in rest, rest
    status, _ = curl("--http1.1", "-k", f"https://localhost:{port}/healthz")
    assert status == "HTTP/1.1 200 OK"


def test_with_http2_off_the_api_speaks_http1_only(start_server, cert):
    s = start_server("--http2", "false")
    got = raw(s.api, PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    assert got == b"" or got.startswith(b"HTTP/1.1 "), got
    status, _ = curl("--http1.1", f"http://{s.api}/healthz")
    assert status == "HTTP/1.1 200 OK"
    # Nor is h2 offered over TLS.
    t = start_server("--http2", "false", "--tls-listen", "127.0.0.1:0", "--tls-cert", cert / "cert.pem",
                     "--tls-key", cert / "key.pem", "--tls-api")
    port = t.api.rsplit(":", 1)[1]
    status, _ = curl("--http2", "-k", f"https://localhost:{port}/healthz")
    assert status == "HTTP/1.1 200 OK"
