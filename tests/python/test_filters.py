"""Subscription filters (docs/filters.md): publications carry `tags`, subscriptions a `filter`
on every transport (WebSocket URL and clarion.v1 subscribe, SSE, HTTP stream, long-poll); bad
filters and tags are refused with the parser's reason and counted; each distinct filter is
evaluated once per message per worker; a filtered resume replays only what matches, with exact
gaps; tags travel through a Redis cluster. Each test runs in about a second."""

import json
import socket
import threading
import time
import urllib.parse

import pytest
from websockets.sync.client import connect

from cluster_util import cluster  # noqa: F401  (the fixture)
from test_cluster import nodes

pytestmark = pytest.mark.timeout(60)

SYM_AB = 'sym in ["A", "B"]'
BUY = 'side == "buy"'
SELL = 'side == "sell"'


def q(text):
    return urllib.parse.quote(text, safe="")


def publish(server, topic, data, **tags):
    query = "&".join(f"tag.{k}={q(v)}" for k, v in tags.items())
    status, _, body = server.request(
        "POST", f"/publish/{topic}?{query}", data.encode(), {"Content-Type": "text/plain"}
    )
    assert status == 200, body
    return json.loads(body)["id"]


def ws(server, query, envelope=True):
    return connect(
        f"ws://{server.clients}/ws?{query}",
        subprotocols=["clarion.v1"] if envelope else None,
        open_timeout=10,
        legacy=True,
    )


def drain(conn, quiet=0.4):
    out = []
    while True:
        try:
            out.append(json.loads(conn.recv(timeout=quiet)))
        except TimeoutError:
            return out


def raw_get(server, path, read_until=None, timeout=5):
    """Status line and everything read until `read_until` is seen (or the peer closes)."""
    host, port = server.clients.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (read_until is None or read_until not in data):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return s, data


def poll(server, query, timeout=10):
    s, data = raw_get(server, f"/poll?{query}", timeout=timeout)
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), json.loads(body) if body else None


def test_a_filtered_websocket_gets_only_matching_messages_with_their_tags(server):
    filtered = ws(server, f"topic=prices&filter={q(SYM_AB)}")
    plain = ws(server, "topic=prices")
    ids = [publish(server, "prices", f"p{s}", sym=s) for s in "ABCA"]
    got = drain(filtered)
    assert [m["data"] for m in got] == ["pA", "pB", "pA"], got
    assert got[0]["tags"] == {"sym": "A"}
    assert [m["id"] for m in got] == [ids[0], ids[1], ids[3]]
    assert len(drain(plain)) == 4, "an unfiltered subscriber gets everything"
    # The in-band subscribe takes the JSON form (or the text form as a string).
    for f in ({"and": [{"eq": ["sym", "C"]}, {"gte": ["px", 2]}]}, 'sym == "C" and px >= 2'):
        c = ws(server, "")
        c.send(json.dumps({"type": "subscribe", "topic": "prices", "filter": f}))
        assert json.loads(c.recv(timeout=5))["type"] == "subscribed"
        publish(server, "prices", "low", sym="C", px="1.5")
        publish(server, "prices", "high", sym="C", px="2.5")
        publish(server, "prices", "untagged")
        assert [m["data"] for m in drain(c)] == ["high"]
        c.close()
    filtered.close()
    plain.close()


def test_sse_stream_and_long_poll_take_a_filter(server):
    sse, _ = raw_get(server, f"/sse?topic=t&filter={q(SYM_AB)}", read_until=b"\r\n\r\n")
    stream, _ = raw_get(server, f"/stream?topic=t&filter={q(SYM_AB)}", read_until=b"\r\n\r\n")
    held = {}
    t = threading.Thread(
        target=lambda: held.update(answer=poll(server, f"topic=t&timeout=5&filter={q(SYM_AB)}"))
    )
    t.start()
    time.sleep(0.5)
    first = publish(server, "t", "c", sym="C")
    second = publish(server, "t", "b", sym="B")
    t.join(10)
    status, body = held["answer"]
    assert status.endswith("200 OK"), status
    assert [m["data"] for m in body["messages"]] == ["b"], body
    assert body["cursor"] == second
    got = {}
    for name, s in (("sse", sse), ("stream", stream)):
        data = b""
        deadline = time.monotonic() + 3
        while b"data: b" not in data and b'"data":"b"' not in data and time.monotonic() < deadline:
            data += s.recv(65536)
        got[name] = data
        s.close()
    assert b"id: " + second.encode() in got["sse"] and first.encode() not in got["sse"]
    assert b'"tags":{"sym":"B"}' in got["stream"] and first.encode() not in got["stream"]


@pytest.mark.parametrize(
    "text, reason, says",
    [
        ('sym == "A" and', "syntax", "invalid filter"),
        ("level == 3", "type_mismatch", 'write key == "3"'),
        ("(" * 9 + 'a == "1"' + ")" * 9, "too_deep", "deeper than 8"),
        ('a == "' + "x" * 1100 + '"', "too_long", "above the limit of 1024"),
        ("a in [" + ",".join(f'"{i}"' for i in range(65)) + "]", "list_too_long", "more than 64 values"),
    ],
)
def test_a_bad_filter_is_refused_with_its_reason_and_counted(server, text, reason, says):
    s, data = raw_get(server, f"/sse?topic=t&filter={q(text)}")
    s.close()
    assert data.startswith(b"HTTP/1.1 400"), data[:200]
    assert says.encode() in data, data
    c = ws(server, "")
    c.send(json.dumps({"type": "subscribe", "topic": "t", "filter": text}))
    reply = json.loads(c.recv(timeout=5))
    assert reply["type"] == "error" and reply["topic"] == "t", reply
    assert reply["error"].startswith("invalid filter"), reply
    c.close()
    assert server.metrics()[f'clarion_filter_rejected_total{{reason="{reason}"}}'] == 2


def test_bad_tags_are_refused_with_400_and_counted(server):
    for query, says in (
        ("tag.in=1", "tag key"),
        ("tag.k=" + "v" * 257, "longer than 256"),
        ("&".join(f"tag.k{i}=v" for i in range(33)), "more than 32"),
    ):
        status, _, body = server.request("POST", f"/publish/t?{query}", b"x")
        assert status == 400 and says in json.loads(body)["error"], body
    # In a batch, the message with bad tags is answered in place and holds back its topic; the
    # other topic's message is published.
    batch = {
        "messages": [
            {"topic": "t", "data": "x", "tags": {"bad key": "1"}},
            {"topic": "u", "data": "y", "tags": {"k": "v"}},
        ]
    }
    status, _, body = server.request(
        "POST", "/publish", json.dumps(batch).encode(), {"Content-Type": "application/json"}
    )
    results = json.loads(body)["results"]
    assert status == 200, body
    assert results[0]["status"] == 400 and "invalid tags" in results[0]["error"], body
    assert "id" in results[1], body
    assert server.metrics()['clarion_filter_rejected_total{reason="tags"}'] == 4


def test_each_distinct_filter_is_evaluated_once_per_message_not_per_subscriber(start_server):
    server = start_server("--workers", "1")
    # 30 subscribers, 3 distinct filters (two spelled two ways: one canonical form each).
    spellings = [
        'a == "1" and b == "2"',
        'b == "2" and a == "1"',
        'sym in ["A", "B"]',
        'sym in ["B", "A", "A"]',
        "px > 10",
    ]
    conns = [ws(server, f"topic=t&filter={q(spellings[i % 5])}") for i in range(30)]
    m = server.metrics()
    assert m["clarion_filters"] == 3
    for i in range(4):
        publish(server, "t", f"m{i}", a="1", b="2", sym="A", px=str(i * 5))
    time.sleep(0.3)
    counts = [len(drain(c, quiet=0.02)) for c in conns]
    # px > 10 passes m3 only (px 15); the others pass all four.
    assert counts == [4, 4, 4, 4, 1] * 6, counts
    assert server.metrics()["clarion_filter_evaluations_total"] == 3 * 4
    for c in conns:
        c.close()
    deadline = time.monotonic() + 5
    while server.metrics()["clarion_filters"] != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.metrics()["clarion_filters"] == 0, "filters are forgotten with their last user"


def test_a_filtered_resume_replays_only_matches_and_reports_no_gap(start_server):
    server = start_server("--history-size", "100")
    ids = [publish(server, "r", f"m{i}", side="buy" if i % 2 else "sell") for i in range(6)]
    c = ws(server, f"topic=r&since={ids[0]}&filter={q(BUY)}")
    got = drain(c)
    assert [m["data"] for m in got] == ["m1", "m3", "m5"], got
    assert all(m["type"] == "message" for m in got), "filtered-out messages are not a gap"
    c.close()
    # Long-poll: the cursor passes the messages left out, so the next poll waits for new ones.
    status, body = poll(server, f"topic=r&since={ids[2]}&filter={q(SELL)}")
    assert [m["data"] for m in body["messages"]] == ["m4"], body
    assert body["cursor"] == ids[5] and "gaps" not in body, body
    status, body = poll(server, f"topic=r&since={body['cursor']}&timeout=0&filter={q(SELL)}")
    assert body["messages"] == [] and body["cursor"] == ids[5], body
    # A trimmed resume still reports its gap, filtered or not.
    small = start_server("--history-size", "2")
    ids = [publish(small, "r", f"m{i}", side="buy") for i in range(5)]
    c = ws(small, f"topic=r&since={ids[0]}&filter={q(BUY)}")
    got = drain(c)
    assert got[0]["type"] == "gap" and [m["data"] for m in got[1:]] == ["m3", "m4"], got
    c.close()


def test_tags_travel_between_nodes_through_redis_and_its_history(cluster):
    _, (a, b) = nodes(cluster, 2)
    eur = q('pair == "EURUSD"')
    sub = ws(b, f"topic=fx&filter={eur}")
    ids = [publish(a, "fx", f"q{i}", pair=p) for i, p in enumerate(["EURUSD", "USDJPY", "EURUSD"])]
    got = drain(sub, quiet=1.0)
    assert [(m["data"], m["tags"]) for m in got] == [
        ("q0", {"pair": "EURUSD"}),
        ("q2", {"pair": "EURUSD"}),
    ], got
    sub.close()
    # A resume on node b reads Redis' history: the tags were kept with the messages.
    jpy = q('pair == "USDJPY"')
    again = ws(b, f"topic=fx&since={ids[0]}&filter={jpy}")
    assert [m["data"] for m in drain(again, quiet=1.0)] == ["q1"]
    again.close()


def test_tags_survive_a_restart_with_history_dir(start_server, tmp_path):
    d = str(tmp_path / "h")
    a = start_server("--history-dir", d)
    ids = [publish(a, "r", f"m{i}", side="buy" if i % 2 else "sell") for i in range(4)]
    a.stop()
    b = start_server("--history-dir", d)
    c = ws(b, f"topic=r&since={ids[0]}&filter={q(BUY)}")
    got = drain(c)
    assert [(m["data"], m["tags"]) for m in got] == [
        ("m1", {"side": "buy"}),
        ("m3", {"side": "buy"}),
    ], got
    c.close()


def test_a_filter_moves_with_its_connection_in_an_upgrade(start_server):
    from test_handover import upgrade, wait_exit

    old = start_server("--workers", "1")
    ws_conn = ws(old, f"topic=prices&filter={q(SYM_AB)}")
    sse, _ = raw_get(old, f"/sse?topic=prices&filter={q(SYM_AB)}", read_until=b"\r\n\r\n")
    sse.settimeout(10)
    new = upgrade(old, "--workers", "1")
    try:
        assert wait_exit(old.proc) == 0
        log = old.proc.stderr.read()
        assert "2 connections moved" in log, (log, new.proc.stderr.read() if new.proc.poll() is not None else "")
        for s in "CAB":
            publish(new, "prices", f"p{s}", sym=s)
        assert [m["data"] for m in drain(ws_conn)] == ["pA", "pB"]
        data = b""
        deadline = time.monotonic() + 5
        while b"data: pB" not in data and time.monotonic() < deadline:
            data += sse.recv(65536)
        assert b"data: pA" in data and b"data: pC" not in data, data
        assert new.metrics()["clarion_filters"] == 1, "both share the one filter"
    finally:
        ws_conn.close()
        sse.close()
        new.proc.kill()
        new.proc.wait()
