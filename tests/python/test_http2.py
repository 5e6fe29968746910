"""HTTP/2 on the client listeners, h2c with prior knowledge and TLS with ALPN h2: every
transport as a stream (SSE, NDJSON, long-poll, plain GETs, WebSockets over RFC 8441), many
streams on one connection, curl, bad input answered with the right GOAWAY or RST_STREAM while
other connections stream on, per-stream flow control with the slow-consumer limit, shutdown,
and `--http2 false`."""

import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import time
import zlib

import pytest

import h2client
from h2client import Client, Raw, frame, messages, sse_events
from test_tls import make_dev_cert, tls_args


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    return make_dev_cert(tmp_path_factory.mktemp("h2tls"))


@pytest.fixture(params=["h2c", "tls"])
def mode(request):
    return request.param


def serve(start_server, dev, *extra):
    return start_server(*tls_args(dev), *extra)


def connect(s, dev, mode, **kw):
    if mode == "tls":
        return Client(s.tls, ca=dev["ca"], **kw)
    return Client(s.clients, **kw)


def wait_metric(s, name, pred, timeout=5.0):
    """Polls /metrics until `pred(value)` holds for `name`; returns the value."""
    deadline = time.monotonic() + timeout
    while True:
        value = s.metrics().get(name, 0.0)
        if pred(value):
            return value
        assert time.monotonic() < deadline, f"{name} = {value}"
        time.sleep(0.05)


def open_sse(c, path="/sse?topic=t", headers=()):
    sid = c.request(path, headers=headers)
    c.pump(lambda: sid in c.headers, what="the SSE answer")
    assert c.status(sid) == 200
    assert c.headers[sid]["content-type"].startswith("text/event-stream")
    return sid


def h1_read_until(sock, needle, timeout=5.0):
    sock.settimeout(timeout)
    buf = b""
    while needle not in buf:
        chunk = sock.recv(65536)
        assert chunk, buf
        buf += chunk
    return buf


# 1. Every transport as a stream, over h2c and TLS.


def test_sse_stream_gets_publishes_in_order_with_ids(start_server, dev, mode):
    s = serve(start_server, dev)
    c = connect(s, dev, mode)
    sid = open_sse(c)
    sent = [(s.publish("t", f"m{i}")["id"], f"m{i}") for i in range(5)]
    c.pump(lambda: len(messages(c.body[sid])) >= 5, what="5 events")
    assert messages(c.body[sid]) == sent
    assert sid not in c.ended and sid not in c.resets


def test_sse_resume_with_last_event_id_gets_exactly_the_missed(start_server, dev, mode):
    s = serve(start_server, dev)
    c = connect(s, dev, mode)
    first = open_sse(c)
    seen = s.publish("t", "seen")["id"]
    c.pump(lambda: messages(c.body[first]) == [(seen, "seen")], what="the first event")
    c.reset(first)
    wait_metric(s, "clarion_h2_streams", lambda v: v == 0)
    missed = [(s.publish("t", f"missed{i}")["id"], f"missed{i}") for i in range(3)]
    again = open_sse(c, headers=[("last-event-id", seen)])
    live = s.publish("t", "live")["id"]
    c.pump(lambda: len(messages(c.body[again])) >= 4, what="the missed and the live event")
    c.read_for(0.2)
    assert messages(c.body[again]) == missed + [(live, "live")]


def test_sse_retry_and_keepalive_comments_arrive(start_server, dev, mode):
    s = serve(start_server, dev, "--sse-keepalive", 1, "--sse-retry", 1500)
    c = connect(s, dev, mode)
    sid = open_sse(c)
    c.pump(lambda: any(":" in e for e in sse_events(c.body[sid])), timeout=6, what="a keep-alive")
    events = sse_events(c.body[sid])
    assert events[0] == {"retry": "1500"}, events
    assert any(e == {":": ":"} for e in events), events


def test_ndjson_stream_is_not_chunk_coded(start_server, dev, mode):
    s = serve(start_server, dev)
    c = connect(s, dev, mode)
    sid = c.request("/stream?topic=t")
    c.pump(lambda: sid in c.headers, what="the stream's answer")
    assert c.status(sid) == 200
    assert c.headers[sid]["content-type"].startswith("application/x-ndjson")
    assert "transfer-encoding" not in c.headers[sid]
    ids = [s.publish("t", json.dumps({"n": i}))["id"] for i in range(3)]
    c.pump(lambda: bytes(c.body[sid]).count(b"\n") >= 3, what="3 lines")
    # Chunked coding would put a hex size line before each chunk: every line must be JSON.
    lines = c.lines(sid)
    assert [(l["type"], l["topic"], l["id"], json.loads(l["data"])) for l in lines] == [
        ("message", "t", ids[i], {"n": i}) for i in range(3)
    ]


def test_long_poll_is_answered_on_publish_and_its_stream_ends(start_server, dev, mode):
    s = serve(start_server, dev)
    c = connect(s, dev, mode)
    sid = c.request("/poll?topic=t&timeout=20")
    wait_metric(s, 'clarion_connections{transport="poll"}', lambda v: v == 1)
    c.read_for(0.1)
    assert sid not in c.headers
    mid = s.publish("t", "hello")["id"]
    c.pump(lambda: sid in c.ended, what="END_STREAM")
    assert c.status(sid) == 200
    answer = json.loads(bytes(c.body[sid]))
    assert [(m["id"], m["data"]) for m in answer["messages"]] == [(mid, "hello")]
    assert answer["cursor"] == mid


def test_plain_get_gets_status_and_body(start_server, dev, mode):
    s = serve(start_server, dev)
    c = connect(s, dev, mode)
    status, headers, body = c.get("/no/such/path")
    assert status == 404
    assert body and int(headers["content-length"]) == len(body)
    # The connection serves the next request.
    status, _, _ = c.get("/sse")
    assert status == 400


def test_answers_larger_than_the_default_windows_arrive_whole(start_server, dev, mode):
    # 300 KB messages through 64 KB windows: every stream resumes on the client's
    # WINDOW_UPDATEs, and the long-poll's content-length answer ends with END_STREAM.
    s = serve(start_server, dev, "--max-message-size", 400_000, "--max-backlog", 1_000_000)
    c = connect(s, dev, mode)
    sse, ndjson = c.request("/sse?topic=big"), c.request("/stream?topic=big")
    poll = c.request("/poll?topic=big&timeout=20")
    c.pump(lambda: sse in c.headers and ndjson in c.headers, what="the answers")
    wait_metric(s, 'clarion_connections{transport="poll"}', lambda v: v == 1)
    sent = [(s.publish("big", f"{i}" + "y" * 300_000)["id"], f"{i}" + "y" * 300_000) for i in range(3)]
    done = lambda: len(messages(c.body[sse])) == 3 and bytes(c.body[ndjson]).count(b"\n") == 3
    c.pump(lambda: done() and (poll in c.ended or poll in c.resets), timeout=10, what="all of it")
    assert poll not in c.resets, c.resets
    assert messages(c.body[sse]) == sent
    assert [(l["id"], l["data"]) for l in c.lines(ndjson)] == sent
    answer = json.loads(bytes(c.body[poll]))
    assert [(m["id"], m["data"]) for m in answer["messages"]] == sent[:1]
    assert len(c.body[poll]) == int(c.headers[poll]["content-length"])


# 2. Many streams on one connection.


def test_100_sse_streams_on_one_connection_all_get_a_publish(start_server, dev, mode):
    s = serve(start_server, dev)
    c = connect(s, dev, mode)
    sids = [c.request("/sse?topic=many") for _ in range(100)]
    c.pump(lambda: all(sid in c.headers for sid in sids), what="100 answers")
    assert {c.status(sid) for sid in sids} == {200}
    m = s.metrics()
    assert m['clarion_protocol_connections{protocol="h2"}'] == 1
    assert m["clarion_h2_streams"] == 100
    assert m["clarion_h2_streams_total"] == 100
    mid = s.publish("many", "to all")["id"]
    assert s.publish("many", "again")["subscribers"] == 100
    c.pump(lambda: all(len(messages(c.body[sid])) == 2 for sid in sids), what="the publish on all")
    assert {tuple(messages(c.body[sid])[0]) for sid in sids} == {(mid, "to all")}


# 3. WebSockets over HTTP/2 (RFC 8441).


def ws_frame(opcode, payload=b"", rsv1=False):
    """A masked client frame."""
    first = 0x80 | (0x40 if rsv1 else 0) | opcode
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", first, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", first, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, n)
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def ws_frames(buf):
    """The complete server frames in `buf`: [(rsv1, opcode, payload)] (server frames are not masked)."""
    out, at = [], 0
    while len(buf) - at >= 2:
        b0, b1 = buf[at], buf[at + 1]
        assert not b1 & 0x80, "a masked server frame"
        n, head = b1 & 0x7F, 2
        if n == 126:
            if len(buf) - at < 4:
                break
            n, head = struct.unpack("!H", buf[at + 2 : at + 4])[0], 4
        elif n == 127:
            if len(buf) - at < 10:
                break
            n, head = struct.unpack("!Q", buf[at + 2 : at + 10])[0], 10
        if len(buf) - at < head + n:
            break
        assert b0 & 0x80, "fragmented server frame"
        out.append((bool(b0 & 0x40), b0 & 0x0F, bytes(buf[at + head : at + head + n])))
        at += head + n
    return out


def open_ws(c, path, extensions=None):
    headers = [("sec-websocket-version", "13"), ("sec-websocket-protocol", "clarion.v1")]
    if extensions:
        headers.append(("sec-websocket-extensions", extensions))
    sid = c.request(path, method="CONNECT", headers=headers, end_stream=False)
    c.pump(lambda: sid in c.headers or sid in c.resets, what="the CONNECT answer")
    return sid


def test_websocket_over_h2_subscribes_and_receives(start_server, dev, mode):
    s = serve(start_server, dev)
    c = connect(s, dev, mode)
    c.pump(lambda: h2client.SETTINGS_ENABLE_CONNECT_PROTOCOL in c.remote_settings, what="SETTINGS")
    assert c.remote_settings[h2client.SETTINGS_ENABLE_CONNECT_PROTOCOL] == 1
    sid = open_ws(c, "/ws?topic=a")
    assert c.status(sid) == 200
    assert c.headers[sid]["sec-websocket-protocol"] == "clarion.v1"
    assert "sec-websocket-accept" not in c.headers[sid]
    c.send_data(sid, ws_frame(0x1, json.dumps({"type": "subscribe", "topic": "b"}).encode()))
    c.pump(lambda: len(ws_frames(c.body[sid])) >= 1, what="subscribed")
    assert json.loads(ws_frames(c.body[sid])[0][2]) == {"type": "subscribed", "topic": "b"}
    ida = s.publish("a", "to a")["id"]
    idb = s.publish("b", "to b")["id"]
    c.pump(lambda: len(ws_frames(c.body[sid])) >= 3, what="two deliveries")
    got = [json.loads(p) for _, op, p in ws_frames(c.body[sid])[1:]]
    assert [(m["topic"], m["id"], m["data"]) for m in got] == [("a", ida, "to a"), ("b", idb, "to b")]
    assert wait_metric(s, 'clarion_connections{transport="ws"}', lambda v: v == 1) == 1


def test_websocket_over_h2_with_permessage_deflate(start_server, dev, mode):
    s = serve(start_server, dev)
    c = connect(s, dev, mode)
    sid = open_ws(c, "/ws?topic=z", extensions="permessage-deflate; client_max_window_bits")
    assert c.status(sid) == 200
    assert c.headers[sid]["sec-websocket-extensions"].startswith("permessage-deflate")
    big = json.dumps({"text": "compress me " * 200})
    mid = s.publish("z", big)["id"]
    c.pump(lambda: len(ws_frames(c.body[sid])) >= 1, what="a delivery")
    rsv1, opcode, payload = ws_frames(c.body[sid])[0]
    assert rsv1 and opcode == 0x1
    assert len(payload) < len(big) // 4
    message = json.loads(zlib.decompressobj(-15).decompress(payload + b"\x00\x00\xff\xff"))
    assert (message["id"], message["data"]) == (mid, big)
    # A compressed frame from the client is inflated: a subscribe sent with RSV1.
    deflate = zlib.compressobj(wbits=-15)
    sub = json.dumps({"type": "subscribe", "topic": "z2"}).encode()
    packed = deflate.compress(sub) + deflate.flush(zlib.Z_SYNC_FLUSH)
    assert packed.endswith(b"\x00\x00\xff\xff")
    c.send_data(sid, ws_frame(0x1, packed[:-4], rsv1=True))
    c.pump(lambda: len(ws_frames(c.body[sid])) >= 2, what="subscribed")
    assert json.loads(ws_frames(c.body[sid])[1][2]) == {"type": "subscribed", "topic": "z2"}
    # And a ping is answered with a pong on the same stream.
    c.send_data(sid, ws_frame(0x9, b"hi"))
    c.pump(lambda: len(ws_frames(c.body[sid])) >= 3, what="pong")
    assert ws_frames(c.body[sid])[2] == (False, 0xA, b"hi")


def test_websocket_over_h2_close_handshake_ends_the_stream(start_server, dev, mode):
    s = serve(start_server, dev)
    c = connect(s, dev, mode)
    sid = open_ws(c, "/ws?topic=a")
    assert c.status(sid) == 200
    c.send_data(sid, ws_frame(0x8, struct.pack("!H", 1000) + b"bye"))
    c.pump(lambda: sid in c.ended or sid in c.resets, what="END_STREAM")
    assert sid not in c.resets
    frames = ws_frames(c.body[sid])
    assert [(op, p[:2]) for _, op, p in frames] == [(0x8, struct.pack("!H", 1000))]
    wait_metric(s, "clarion_h2_streams", lambda v: v == 0)
    # The connection goes on.
    assert c.get("/nope")[0] == 404


# 4. curl.


def curl(*args, timeout=15):
    return subprocess.run(["curl", "-sS", "-v", *args], capture_output=True, timeout=timeout)


def curl_while(s, args, topic, data):
    """Runs curl in the background, publishes once it is served, returns its result."""
    proc = subprocess.Popen(["curl", "-sS", "-v", "-N", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_metric(s, "clarion_h2_streams", lambda v: v == 1)
        s.publish(topic, data)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err.decode()


@pytest.mark.parametrize("how", ["prior-knowledge", "tls"])
def test_curl_sse_long_poll_and_404(start_server, dev, how):
    s = serve(start_server, dev)
    if how == "tls":
        base, flags = f"https://{s.tls}", ["--http2", "-k"]
    else:
        base, flags = f"http://{s.clients}", ["--http2-prior-knowledge"]

    code, out, err = curl_while(s, [*flags, "--max-time", "2", f"{base}/sse?topic=c"], "c", "over curl")
    assert code == 28, err  # ended by --max-time
    assert "< HTTP/2 200" in err, err
    assert "data: over curl\n" in out.decode()
    wait_metric(s, "clarion_h2_streams", lambda v: v == 0)

    code, out, err = curl_while(s, [*flags, f"{base}/poll?topic=c&timeout=20"], "c", "polled")
    assert code == 0, err
    assert "< HTTP/2 200" in err, err
    assert [m["data"] for m in json.loads(out)["messages"]] == ["polled"]

    r = curl(*flags, f"{base}/nothing/here")
    assert r.returncode == 0, r.stderr
    assert "< HTTP/2 404" in r.stderr.decode()


# 5. Bad input: the right GOAWAY or RST_STREAM on that connection, nothing on the others.


def bad_preface(s, r):
    r.send(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + h2client.settings_frame())
    f, _ = r.until(lambda f: True)
    assert f is None, "the server answered a wrong preface"


def short_ping(s, r):
    r.send(frame(h2client.PING, 0, 0, b"1234567"))
    assert r.goaway()[0] == h2client.FRAME_SIZE_ERROR


def headers_on_a_closed_stream(s, r):
    r.send(r.headers(1, "/nope"))
    assert r.response(1)[0] == 404
    r.send(r.headers(1, "/nope"))
    assert r.goaway() == (h2client.STREAM_CLOSED, 1)


def oversized_header_list(s, r):
    # 20 KB of headers, over the 16 KB limit: a HEADERS and a CONTINUATION.
    block = r.block("/nope", extra=[("x-big", "v" * 20_000)])
    r.send(
        frame(h2client.HEADERS, h2client.END_STREAM, 1, block[:16_000]),
        frame(h2client.CONTINUATION, h2client.END_HEADERS, 1, block[16_000:]),
    )
    assert r.response(1)[0] == 431
    r.send(r.headers(3, "/nope"))
    assert r.response(3)[0] == 404


def uppercase_header_name(s, r):
    r.send(r.headers(1, "/nope", extra=[("X-Upper", "1")]))
    assert r.rst(1) == h2client.PROTOCOL_ERROR
    r.send(r.headers(3, "/nope", extra=[("connection", "keep-alive")]))
    assert r.rst(3) == h2client.PROTOCOL_ERROR
    r.send(r.headers(5, "/nope"))
    assert r.response(5)[0] == 404


def rapid_reset(s, r):
    before = s.metrics()["clarion_h2_errors_total"]
    burst = []
    for i in range(1000):
        sid = 1 + 2 * i
        burst += [r.headers(sid, "/sse?topic=rr", end_stream=True), frame(h2client.RST_STREAM, 0, sid, struct.pack("!I", 8))]
    try:
        r.send(*burst)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert r.goaway()[0] == h2client.ENHANCE_YOUR_CALM
    wait_metric(s, "clarion_h2_errors_total", lambda v: v > before)
    wait_metric(s, "clarion_h2_streams", lambda v: v == 1)  # the healthy connection's


def continuation_flood(s, r):
    block = r.block("/nope")
    flood = [frame(h2client.HEADERS, h2client.END_STREAM, 1, block[:1])]
    flood += [frame(h2client.CONTINUATION, 0, 1, b"") for _ in range(200)]
    try:
        r.send(*flood)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert r.goaway()[0] == h2client.ENHANCE_YOUR_CALM


def ping_flood(s, r):
    try:
        r.send(*[frame(h2client.PING, 0, 0, struct.pack("!Q", i)) for i in range(2000)])
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert r.goaway()[0] == h2client.ENHANCE_YOUR_CALM


def stream_window_overflow(s, r):
    r.send(r.headers(1, "/sse?topic=w"))
    r.until(lambda f: f[0] == h2client.HEADERS and f[2] == 1)
    r.send(frame(h2client.WINDOW_UPDATE, 0, 1, struct.pack("!I", 0x7FFFFFFF)))
    assert r.rst(1) == h2client.FLOW_CONTROL_ERROR
    r.send(r.headers(3, "/nope"))
    assert r.response(3)[0] == 404


def connection_window_overflow(s, r):
    r.send(frame(h2client.WINDOW_UPDATE, 0, 0, struct.pack("!I", 0x7FFFFFFF)))
    assert r.goaway()[0] == h2client.FLOW_CONTROL_ERROR


def too_many_streams(s, r):
    # The server runs with --h2-max-streams 4.
    for sid in (1, 3, 5, 7):
        r.send(r.headers(sid, "/sse?topic=many"))
    for sid in (1, 3, 5, 7):
        r.until(lambda f: f[0] == h2client.HEADERS and f[2] == sid)
    r.send(r.headers(9, "/sse?topic=many"))
    assert r.rst(9) == h2client.REFUSED_STREAM
    r.send(frame(h2client.RST_STREAM, 0, 1, struct.pack("!I", h2client.CANCEL)))
    r.send(r.headers(11, "/nope"))
    assert r.response(11)[0] == 404


BAD = [
    bad_preface,
    short_ping,
    headers_on_a_closed_stream,
    oversized_header_list,
    uppercase_header_name,
    rapid_reset,
    continuation_flood,
    ping_flood,
    stream_window_overflow,
    connection_window_overflow,
    too_many_streams,
]


@pytest.mark.parametrize("case", BAD, ids=[f.__name__ for f in BAD])
def test_bad_input_gets_its_answer_and_other_connections_are_untouched(start_server, dev, case):
    s = serve(start_server, dev, "--h2-max-streams", 4)
    healthy = Client(s.clients)
    sid = open_sse(healthy)
    h1, _ = h2client.h1_sse(s.clients, "t")
    r = Raw(s.clients, preface=None if case is bad_preface else h2client.PREFACE)
    case(s, r)
    mid = s.publish("t", "after")["id"]
    healthy.pump(lambda: messages(healthy.body[sid]) == [(mid, "after")], what="the publish after")
    assert f"id: {mid}\n".encode() in h1_read_until(h1, b"data: after\n")
    assert not healthy.closed and healthy.goaway is None


# 6. Flow control: a stream that never opens its window is a slow consumer.


def test_stream_with_closed_window_is_ended_as_slow_consumer_others_go_on(start_server, dev, mode):
    s = serve(start_server, dev, "--max-backlog", 65536)
    c = connect(s, dev, mode, initial_window=1024)
    c.conn.increment_flow_control_window(16 * 1024 * 1024)
    slow = c.request("/sse?topic=burst")
    c.hold.add(slow)
    fast = c.request("/sse?topic=burst")
    c.conn.increment_flow_control_window(16 * 1024 * 1024, stream_id=fast)
    c.flush()
    c.pump(lambda: slow in c.headers and fast in c.headers, what="both answers")
    payload = "x" * 8000
    sent = [s.publish("burst", f"{i}:{payload}")["id"] for i in range(40)]  # 320 KB
    c.pump(lambda: slow in c.ended or slow in c.resets, timeout=10, what="the slow stream's end")
    c.pump(lambda: len(messages(c.body[fast])) == 40, timeout=10, what="all 40 on the open stream")
    assert [m for m, _ in messages(c.body[fast])] == sent
    assert fast not in c.ended and fast not in c.resets
    # The slow stream got no more than its window.
    assert len(c.body[slow]) <= 1024
    assert s.metrics()["clarion_slow_consumers_total"] == 1
    more = s.publish("burst", "after")["id"]
    c.pump(lambda: messages(c.body[fast])[-1] == (more, "after"), what="a later publish")


# 7. Shutdown.


def raw_sse_streams(s, dev, mode, n=3):
    """A hand-driven connection (hyper-h2 refuses frames after a GOAWAY) with `n` SSE streams."""
    r = Raw(s.tls, ca=dev["ca"]) if mode == "tls" else Raw(s.clients)
    sids = [1 + 2 * i for i in range(n)]
    r.send(*[r.headers(sid, "/sse?topic=t", end_stream=True) for sid in sids])
    # Each stream's answer starts with HEADERS and a DATA frame with its `retry:`.
    first = set()
    while len(first) < n:
        f, _ = r.until(lambda f: f[0] == h2client.DATA)
        assert f is not None and f[3].startswith(b"retry: "), f
        first.add(f[2])
    assert sorted(first) == sids
    return r, sids


def read_to_close(r, timeout=8.0):
    """Every frame until the server closes: {stream: body}, streams ended, GOAWAY codes, resets.
    Asserts no stream ends after the GOAWAY: a client that stops reading at a GOAWAY (hyper-h2,
    and httpx on it) must see its streams end first."""
    bodies, ended, goaways, resets = {}, [], [], []
    deadline = time.monotonic() + timeout
    while (f := r.read(max(0.01, deadline - time.monotonic()))) is not None:
        assert time.monotonic() < deadline, "the connection stayed open"
        ftype, flags, sid, payload = f
        if ftype == h2client.DATA:
            bodies[sid] = bodies.get(sid, b"") + payload
            if flags & h2client.END_STREAM:
                assert not goaways, f"stream {sid} ended after the GOAWAY"
                ended.append(sid)
        elif ftype == h2client.GOAWAY:
            assert not goaways, "a second GOAWAY"
            goaways.append(struct.unpack("!I", payload[4:8])[0])
        elif ftype == h2client.RST_STREAM:
            resets.append(sid)
    r.close()
    return bodies, ended, goaways, resets


def test_sigterm_sends_goaway_and_ends_sse_streams(start_server, dev, mode):
    s = serve(start_server, dev, "--shutdown-timeout", 5)
    r, sids = raw_sse_streams(s, dev, mode)
    s.proc.send_signal(signal.SIGTERM)
    bodies, ended, goaways, resets = read_to_close(r)
    assert goaways == [h2client.NO_ERROR]
    assert sorted(ended) == sids and not resets
    assert all(sse_events(bodies.get(sid, b"")) == [] for sid in sids), bodies
    code, err = s.stop(timeout=10)
    assert code == 0, err


def test_sigterm_ends_the_streams_of_a_hyper_h2_client_cleanly(start_server, dev, mode):
    # hyper-h2 treats the connection as closed from a GOAWAY on: the streams' ends come first.
    s = serve(start_server, dev, "--shutdown-timeout", 5)
    c = connect(s, dev, mode)
    sids = [open_sse(c) for _ in range(3)]
    s.proc.send_signal(signal.SIGTERM)
    c.pump(lambda: c.goaway is not None, timeout=8, what="GOAWAY")
    assert c.goaway[0] == h2client.NO_ERROR
    assert sorted(c.ended) == sids and not c.resets
    c.close()
    assert s.stop(timeout=10)[0] == 0


def test_sigusr2_restart_sends_retry_then_ends_sse_streams(start_server, dev, mode):
    s = serve(start_server, dev, "--drain-period", 1, "--shutdown-timeout", 5)
    r, sids = raw_sse_streams(s, dev, mode)
    s.proc.send_signal(signal.SIGUSR2)
    bodies, ended, goaways, resets = read_to_close(r)
    assert sorted(ended) == sids and not resets
    assert goaways == [h2client.NO_ERROR]
    for sid in sids:
        events = sse_events(bodies[sid])
        assert len(events) == 1 and 1000 <= int(events[0]["retry"]) <= 3000, events
    code, err = s.stop(timeout=10)
    assert code == 0, err


# 8. HTTP/2 off.


def test_http2_false_speaks_only_http1(start_server, dev):
    s = serve(start_server, dev, "--http2", "false")
    # The preface is read as what it looks like to HTTP/1.1: a request for version 2.0.
    with socket.create_connection(("127.0.0.1", s.port), timeout=5) as c:
        c.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert c.recv(64).startswith(b"HTTP/1.1 505 ")
    tls = h2client.open_socket(s.tls, dev["ca"], alpn=("h2", "http/1.1"))
    assert tls.selected_alpn_protocol() == "http/1.1"
    tls.sendall(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
    assert tls.recv(4096).startswith(b"HTTP/1.1 404 ")
    with pytest.raises(ssl.SSLError):
        h2client.open_socket(s.tls, dev["ca"], alpn=("h2",))
