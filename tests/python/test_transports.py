"""SSE, long-polling and HTTP streaming against the real binary, with third-party clients:
httpx + httpx-sse for EventSource streams, httpx for long-polls, curl -N for streaming. Each
transport gets a resume test (cut off while messages are published, reconnect, exactly the
missed messages arrive, once, in order) and a gap test (history trimmed, or another epoch)."""

import asyncio
import json
import socket
import subprocess
import threading
import time

import httpx
import pytest
from httpx_sse import connect_sse
from websockets.asyncio.client import connect

from conftest import seq


class SSE:
    """An EventSource-like reader over httpx-sse that skips blocks the standard would not
    dispatch (keep-alive comments, the retry hint)."""

    def __init__(self, server, query, headers=None, path="/sse"):
        self.client = httpx.Client(timeout=httpx.Timeout(10, read=15))
        self.cm = connect_sse(
            self.client, "GET", f"http://{server.clients}{path}?{query}", headers=headers or {}
        )
        self.source = self.cm.__enter__()
        self.response = self.source.response
        self.events = self.source.iter_sse()
        self.retry = None

    def next(self):
        for ev in self.events:
            if ev.retry is not None and not ev.data:
                self.retry = ev.retry
                continue
            if not ev.data and not ev.event:
                continue
            return ev
        raise EOFError("stream ended")

    def take(self, n):
        return [self.next() for _ in range(n)]

    def close(self):
        self.cm.__exit__(None, None, None)
        self.client.close()


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def test_sse_delivers_ids_event_names_and_multiline_data(server):
    sse = SSE(server, "topic=news")
    try:
        r = sse.response
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        assert r.headers["access-control-allow-origin"] == "*"
        r1 = server.publish("news", "line one\nline two")
        status, _, body = server.request(
            "POST", "/publish/news?event=breaking", b"{\"x\":1}", {"Content-Type": "text/plain"}
        )
        assert status == 200, body
        r2 = json.loads(body)
        e1, e2 = sse.take(2)
        assert sse.retry == 2000
        assert (e1.id, e1.event, e1.data) == (r1["id"], "message", "line one\nline two")
        assert (e2.id, e2.event, e2.data) == (r2["id"], "breaking", '{"x":1}')
        assert seq(e2.id) > seq(e1.id)
    finally:
        sse.close()


def test_sse_resume_with_last_event_id_is_gap_free(server):
    sse = SSE(server, "topic=feed")
    first = [server.publish("feed", f"m{i}")["id"] for i in range(3)]
    got = sse.take(3)
    assert [e.id for e in got] == first
    sse.close()
    # Cut off: messages keep coming.
    missed = [server.publish("feed", f"m{i}")["id"] for i in range(3, 13)]
    sse = SSE(server, "topic=feed", headers={"Last-Event-ID": got[-1].id})
    try:
        replay = sse.take(10)
        assert [e.id for e in replay] == missed
        assert [e.data for e in replay] == [f"m{i}" for i in range(3, 13)]
        live = server.publish("feed", "live")["id"]
        e = sse.next()
        assert (e.id, e.data) == (live, "live"), "no duplicate between replay and live"
    finally:
        sse.close()


def test_sse_resume_by_query_parameter_and_header_wins(server):
    ids = [server.publish("q", f"m{i}")["id"] for i in range(4)]
    sse = SSE(server, f"topic=q&lastEventId={ids[0]}")
    try:
        assert [e.data for e in sse.take(3)] == ["m1", "m2", "m3"]
    finally:
        sse.close()
    # A reconnecting EventSource keeps its first URL and adds the header: the header wins.
    sse = SSE(server, f"topic=q&lastEventId={ids[0]}", headers={"Last-Event-ID": ids[2]})
    try:
        assert sse.next().data == "m3"
    finally:
        sse.close()


def test_sse_reports_a_gap_when_history_was_trimmed(start_server):
    server = start_server("--history-size", "3")
    ids = [server.publish("t", f"m{i}")["id"] for i in range(10)]
    sse = SSE(server, "topic=t", headers={"Last-Event-ID": ids[2]})
    try:
        gap = sse.next()
        assert gap.event == "gap"
        assert json.loads(gap.data) == {
            "type": "gap", "topic": "t", "since": ids[2], "reason": "trimmed",
        }
        assert [e.data for e in sse.take(3)] == ["m7", "m8", "m9"]
    finally:
        sse.close()
    m = server.metrics()
    assert m['clarion_history_evictions_total{reason="count"}'] == 7
    assert m["clarion_resume_gaps_total"] == 1
    # From the oldest id still covered, nothing is missing: no gap.
    sse = SSE(server, "topic=t", headers={"Last-Event-ID": ids[6]})
    try:
        assert [e.data for e in sse.take(3)] == ["m7", "m8", "m9"]
    finally:
        sse.close()


def test_resume_after_a_restart_is_an_epoch_gap(start_server):
    old = start_server()
    last = old.publish("t", "before restart")["id"]
    old.stop()
    new = start_server()
    new.publish("t", "after restart")
    sse = SSE(new, "topic=t", headers={"Last-Event-ID": last})
    try:
        gap = sse.next()
        assert gap.event == "gap" and json.loads(gap.data)["reason"] == "epoch"
        assert sse.next().data == "after restart", "what this run holds is still replayed"
    finally:
        sse.close()
    # A header that is not an id at all is a gap too, not an error that stops EventSource.
    sse = SSE(new, "topic=t", headers={"Last-Event-ID": "not an id"})
    try:
        assert json.loads(sse.next().data)["reason"] == "epoch"
    finally:
        sse.close()


def test_sse_several_topics_with_json_envelopes_in_publish_order(server):
    sse = SSE(server, "topic=a&topic=b&format=json")
    try:
        ra = server.publish("a", "x")
        rb = server.publish("b", b"\x00\x01", binary=True)
        e1, e2 = sse.take(2)
        assert json.loads(e1.data) == {"type": "message", "topic": "a", "id": ra["id"], "data": "x"}
        d2 = json.loads(e2.data)
        assert (d2["topic"], d2["encoding"], d2["data"], e2.id) == ("b", "base64", "AAE=", rb["id"])
    finally:
        sse.close()


def test_sse_by_accept_header_on_the_websocket_path(server):
    sse = SSE(server, "topic=w", headers={"Accept": "text/event-stream"}, path="/ws")
    try:
        server.publish("w", "via accept")
        assert sse.next().data == "via accept"
    finally:
        sse.close()


def raw_get(server, target, headers="", read_for=None, until=None):
    """Sends a raw GET (Connection: close) and returns what arrives until `until` appears or
    the server closes."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n".encode())
    data = b""
    deadline = time.monotonic() + (read_for or 10)
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            break
        data += chunk
        if until and until in data:
            break
    s.close()
    return data


def test_sse_keepalive_comments_on_idle_streams(start_server):
    server = start_server("--sse-keepalive", "1", "--sse-retry", "750")
    data = raw_get(server, "/sse?topic=idle", until=b":\n\n", read_for=5)
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"200 OK" in head and b"X-Accel-Buffering: no" in head
    assert body.startswith(b"retry: 750\n\n")
    assert b":\n\n" in body, body


def test_cors_preflight_and_disabled_cors(start_server):
    server = start_server()
    with httpx.Client() as c:
        r = c.options(
            f"http://{server.clients}/sse?topic=a",
            headers={"Origin": "https://app.example", "Access-Control-Request-Headers": "last-event-id"},
        )
        assert r.status_code == 204
        assert r.headers["access-control-allow-origin"] == "*"
        assert "Last-Event-ID" in r.headers["access-control-allow-headers"]
    closed = start_server("--cors-allow-origin", "")
    head = raw_get(closed, "/poll?topic=a&timeout=0")
    assert b"200 OK" in head and b"Access-Control-Allow-Origin" not in head


@pytest.mark.parametrize(
    "target,status,why",
    [
        ("/sse", 400, b"at least one topic"),
        ("/sse?topic=a%20b", 400, b"invalid topic"),
        ("/sse?topic=a&since=nope", 400, b"invalid since"),
        ("/sse?topic=a&format=xml", 400, b"unknown format"),
        ("/stream?topic=a&format=raw&since=x-1", 400, b"cannot resume"),
        ("/poll?topic=a&timeout=soon", 400, b"invalid timeout"),
        ("/ws?topic=a&since=x-1", 400, b"clarion.v1"),
    ],
)
def test_bad_subscription_requests_are_answered(server, target, status, why):
    headers = ""
    if target.startswith("/ws"):
        headers = (
            "Upgrade: websocket\r\nConnection: Upgrade, close\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        )
    data = raw_get(server, target, headers)
    assert data.startswith(f"HTTP/1.1 {status}".encode()), data
    assert why in data, data


def test_wrong_method_and_http10_stream(server):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    s.sendall(b"POST /sse?topic=a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 405")
    s.close()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    s.sendall(b"GET /stream?topic=a HTTP/1.0\r\nHost: x\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 505")
    s.close()


# ---------------------------------------------------------------- long-polling


def poll(server, query, client=None, timeout=20):
    c = client or httpx.Client(timeout=timeout)
    try:
        r = c.get(f"http://{server.clients}/poll?{query}")
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/json"
        return r.json()
    finally:
        if client is None:
            c.close()


def test_poll_is_held_until_a_message_arrives(server):
    box = {}
    t = threading.Thread(target=lambda: box.update(body=poll(server, "topic=lp")))
    t.start()
    wait_for(lambda: server.metrics()['clarion_connections{transport="poll"}'] == 1)
    r = server.publish("lp", "wake up")
    t.join(10)
    body = box["body"]
    assert body["messages"] == [{"type": "message", "topic": "lp", "id": r["id"], "data": "wake up"}]
    assert body["cursor"] == r["id"]
    assert server.metrics()['clarion_connections{transport="poll"}'] == 0


def test_poll_times_out_with_an_empty_answer_and_a_usable_cursor(server):
    before = server.publish("quiet", "old")["id"]
    t0 = time.monotonic()
    body = poll(server, "topic=quiet&timeout=1")
    assert 0.5 < time.monotonic() - t0 < 4
    assert body["messages"] == [] and seq(body["cursor"]) >= seq(before)
    server.publish("quiet", "new")
    body = poll(server, f"topic=quiet&since={body['cursor']}&timeout=0")
    assert [m["data"] for m in body["messages"]] == ["new"]


def test_poll_loop_misses_nothing_while_messages_keep_coming(start_server):
    """A client polling in a loop on one keep-alive connection, with a publisher racing it,
    gets every message exactly once and in order, whatever falls between two polls. History
    holds every message of the run: with the default 100, a poller starved for a moment on a
    loaded machine is rightly told of a "trimmed" gap, which is not what this test is about."""
    server = start_server("--history-size", "1000")
    total = 300
    ready = threading.Event()

    def publisher():
        ready.wait()
        for i in range(total):
            server.publish("race", str(i))
            if i % 7 == 0:
                time.sleep(0.003)

    t = threading.Thread(target=publisher)
    t.start()
    got = []
    cursor = poll(server, "topic=race&timeout=0")["cursor"]
    ready.set()
    with httpx.Client(timeout=20) as c:
        deadline = time.monotonic() + 30
        while len(got) < total and time.monotonic() < deadline:
            body = poll(server, f"topic=race&since={cursor}&timeout=5", client=c)
            assert "gaps" not in body
            got += [int(m["data"]) for m in body["messages"]]
            cursor = body["cursor"]
    t.join()
    assert got == list(range(total))


def test_poll_answers_at_once_with_a_gap(start_server):
    server = start_server("--history-size", "2")
    ids = [server.publish("g", f"m{i}")["id"] for i in range(5)]
    body = poll(server, f"topic=g&since={ids[0]}")
    assert body["gaps"] == [{"type": "gap", "topic": "g", "since": ids[0], "reason": "trimmed"}]
    assert [m["data"] for m in body["messages"]] == ["m3", "m4"]
    assert body["cursor"] == ids[4]


# ---------------------------------------------------------------- streaming (curl -N)


def curl_stream(server, query):
    return subprocess.Popen(
        ["curl", "-sN", "--max-time", "20", f"http://{server.clients}/stream?{query}"],
        stdout=subprocess.PIPE,
    )


def test_stream_with_curl_ndjson_and_raw(server):
    nd = curl_stream(server, "topic=s")
    raw = curl_stream(server, "topic=s&format=raw")
    wait_for(lambda: server.metrics()['clarion_connections{transport="stream"}'] == 2)
    r1 = server.publish("s", "one")
    server.publish("s", "two")
    line = json.loads(nd.stdout.readline())
    assert line == {"type": "message", "topic": "s", "id": r1["id"], "data": "one"}
    assert json.loads(nd.stdout.readline())["data"] == "two"
    assert raw.stdout.readline() == b"one\n"
    assert raw.stdout.readline() == b"two\n"
    # Graceful shutdown ends the chunked body properly: curl exits cleanly.
    code, _ = server.stop()
    assert code == 0
    assert nd.wait(10) == 0 and raw.wait(10) == 0


def test_stream_resume_after_a_cut_and_gap_line(start_server):
    server = start_server("--history-size", "6")
    p = curl_stream(server, "topic=sr")
    wait_for(lambda: server.metrics()['clarion_connections{transport="stream"}'] == 1)
    first = [server.publish("sr", f"m{i}")["id"] for i in range(2)]
    got = [json.loads(p.stdout.readline()) for _ in range(2)]
    assert [g["id"] for g in got] == first
    p.kill()
    p.wait()
    missed = [server.publish("sr", f"m{i}")["id"] for i in range(2, 7)]
    p = curl_stream(server, f"topic=sr&since={got[-1]['id']}")
    try:
        assert [json.loads(p.stdout.readline())["id"] for _ in range(5)] == missed
        live = server.publish("sr", "live")["id"]
        assert json.loads(p.stdout.readline())["id"] == live
    finally:
        p.kill()
        p.wait()
    # Six kept of eight (m2..live): resuming from m0 missed m1, announced as a gap line.
    p = curl_stream(server, f"topic=sr&since={first[0]}")
    try:
        line = json.loads(p.stdout.readline())
        assert line == {"type": "gap", "topic": "sr", "since": first[0], "reason": "trimmed"}
        assert json.loads(p.stdout.readline())["data"] == "m2"
    finally:
        p.kill()
        p.wait()


# ---------------------------------------------------------------- WebSocket envelope resume


def test_websocket_envelope_resume_by_url_and_by_subscribe_message(start_server):
    server = start_server("--history-size", "3")
    ids = [server.publish("r", f"m{i}")["id"] for i in range(5)]

    async def main():
        url = f"ws://{server.clients}/ws?topic=r&since={ids[2]}"
        async with connect(url, subprotocols=["clarion.v1"]) as ws:
            got = [json.loads(await ws.recv()) for _ in range(2)]
            assert [m["data"] for m in got] == ["m3", "m4"]
            await ws.send(json.dumps({"type": "subscribe", "topic": "r2", "since": ids[0]}))
            assert json.loads(await ws.recv()) == {"type": "subscribed", "topic": "r2"}
            live = await asyncio.to_thread(server.publish, "r2", "fresh")
            assert json.loads(await ws.recv())["id"] == live["id"]
        # Resuming from an id older than the history holds: the gap is announced first.
        url = f"ws://{server.clients}/ws?topic=r&since={ids[0]}"
        async with connect(url, subprotocols=["clarion.v1"]) as ws:
            gap = json.loads(await ws.recv())
            assert gap == {"type": "gap", "topic": "r", "since": ids[0], "reason": "trimmed"}
            assert [json.loads(await ws.recv())["data"] for _ in range(3)] == ["m2", "m3", "m4"]
        async with connect(f"ws://{server.clients}/ws?topic=r") as ws:
            await ws.send(json.dumps({"type": "subscribe", "topic": "x", "since": ids[0]}))
            err = json.loads(await ws.recv())
            assert err["type"] == "error" and "clarion.v1" in err["error"]

    asyncio.run(main())


def test_history_memory_cap_evicts_and_is_reported(start_server):
    server = start_server("--history-memory", "20000")
    for i in range(50):
        server.publish(f"t{i % 5}", "x" * 1000)
    m = server.metrics()
    assert m["clarion_history_bytes"] <= 20000
    assert m['clarion_history_evictions_total{reason="memory"}'] > 0
    assert 0 < m["clarion_history_messages"] < 50


def test_slow_sse_consumer_is_cut_and_resumes_without_loss(start_server):
    """An SSE client that stops reading is disconnected at the backlog cap (others keep
    receiving); when it reconnects with its last id it gets everything it had not read."""
    server = start_server("--max-backlog", 65536, "--history-size", 1000)
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", server.port))
    slow.sendall(b"GET /sse?topic=flood HTTP/1.1\r\nHost: x\r\n\r\n")
    fast = SSE(server, "topic=flood")
    chunk = "x" * 16384
    ids = []
    try:
        for i in range(300):
            ids.append(server.publish("flood", f"{i} {chunk}")["id"])
            assert fast.next().data.startswith(f"{i} ")
            if server.metrics()['clarion_closes_total{reason="slow_consumer"}'] >= 1:
                break
        assert server.metrics()['clarion_closes_total{reason="slow_consumer"}'] == 1
        # The slow client reads what reached it: whole events, then the end of the stream.
        data = b""
        slow.settimeout(10)
        while chunk := slow.recv(65536):
            data += chunk
        events = [e for e in data.split(b"\n\n") if e.startswith(b"id: ")]
        last = events[-1].split(b"\n")[0][4:].decode()
        assert last in ids and ids.index(last) < len(ids) - 1
        resumed = SSE(server, "topic=flood", headers={"Last-Event-ID": last})
        try:
            rest = resumed.take(len(ids) - ids.index(last) - 1)
            assert [e.id for e in rest] == ids[ids.index(last) + 1:]
        finally:
            resumed.close()
        server.publish("flood", "after")
        assert fast.next().data == "after"
    finally:
        fast.close()
        slow.close()


def test_history_expires_by_age(start_server):
    server = start_server("--history-ttl", 1)
    first = server.publish("old", "stale")["id"]
    server.publish("old", "stale too")
    wait_for(lambda: server.metrics()['clarion_history_evictions_total{reason="age"}'] == 2, 5)
    assert server.metrics()["clarion_history_messages"] == 0
    body = poll(server, f"topic=old&since={first}&timeout=0")
    assert body["messages"] == [] and body["gaps"][0]["reason"] == "trimmed"


def test_many_http_subscribers_leave_nothing_behind(server):
    """SSE streams, held polls and streams on several topics, then all dropped at once: every
    gauge, subscription and topic goes back to zero, and the descriptors are released."""
    import os

    def fds():
        out = []
        for f in os.listdir(f"/proc/{server.proc.pid}/fd"):
            try:
                out.append(os.readlink(f"/proc/{server.proc.pid}/fd/{f}"))
            except OSError:
                pass  # closed between the listing and the look
        return sorted(out)

    fds_before = fds()
    socks = []
    for i in range(600):
        c = socket.create_connection(("127.0.0.1", server.port))
        path = ["/sse", "/poll", "/stream"][i % 3]
        c.sendall(f"GET {path}?topic=t{i % 50}&topic=u HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        socks.append(c)
    wait_for(lambda: server.metrics()["clarion_subscriptions"] == 1200)
    m = server.metrics()
    for transport in ("sse", "poll", "stream"):
        assert m[f'clarion_connections{{transport="{transport}"}}'] == 200
    assert m["clarion_topics"] == 51
    for c in socks:
        c.close()
    wait_for(lambda: server.metrics()["clarion_subscriptions"] == 0)
    m = server.metrics()
    assert m["clarion_topics"] == 0
    for transport in ("http", "sse", "poll", "stream"):
        assert m[f'clarion_connections{{transport="{transport}"}}'] == 0
    # Every descriptor is released: the same kinds as before the test (a slow machine may take
    # a few seconds to read 600 EOFs; a leak never goes away, and the message names it).
    deadline = time.monotonic() + 15
    while len(fds()) > len(fds_before) and time.monotonic() < deadline:
        time.sleep(0.05)
    after = fds()
    extra = [f for f in set(after) if after.count(f) > fds_before.count(f)]
    assert len(after) <= len(fds_before), f"{len(after) - len(fds_before)} more descriptors: {extra}"
