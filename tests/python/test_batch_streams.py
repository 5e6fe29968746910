"""Fragments of appendable messages in a batch (docs/protocol.md, "Batch publishing"): an AI
gateway sends many answers' fragments in one `POST /publish`. Items are applied in the order
sent, messages and fragments mixed; each is answered in place as one request would be; a
fragment the broker refuses holds back its stream's later fragments in the batch, and a refused
item holds back its topic's other items, as for messages. On a Redis cluster a batch appends to
streams opened on another node."""

import json

import pytest

from cluster_util import cluster  # noqa: F401  (the fixture)
from test_cluster import nodes, poll, recv_json, ws_sub
from test_streams import Reader, fragment

pytestmark = pytest.mark.timeout(60)


def batch(node, *items):
    body = json.dumps({"messages": list(items)}).encode()
    status, _, out = node.request("POST", "/publish", body, {"Content-Type": "application/json"})
    assert status == 200, out
    return json.loads(out)["results"]


def test_a_batch_carries_fragments_of_several_streams_in_order_with_messages(server):
    ws = ws_sub(server, "ai")
    opened = batch(
        server,
        {"topic": "ai", "data": "Hel", "stream": "open"},
        {"topic": "ai", "data": "Bon", "stream": "open"},
    )
    assert [r["seq"] for r in opened] == [1, 1] and all(not r["done"] for r in opened), opened
    s1, s2 = (r["stream"] for r in opened)
    assert s1 != s2
    out = batch(
        server,
        {"topic": "ai", "data": "lo", "append_to": s1},
        {"topic": "ai", "data": "jour", "append_to": s2, "done": True},
        {"topic": "ai", "data": "a plain message between"},
        {"topic": "ai", "data": ", world", "append_to": s1, "key": "k-s1-3"},
        {"topic": "ai", "data": "", "append_to": s1, "done": True},
    )
    assert [(r.get("stream"), r.get("seq"), r.get("done")) for r in out] == [
        (s1, 2, False), (s2, 2, True), (None, None, None), (s1, 3, False), (s1, 4, True),
    ], out
    got = [recv_json(ws) for _ in range(7)]
    assert [m["id"] for m in got] == [r["id"] for r in opened + out], got
    assert [m["type"] for m in got] == ["append"] * 4 + ["message"] + ["append"] * 2
    reader = Reader()
    for m in got:
        reader.take(m)
    assert reader.streams == {s1: ("Hello, world", 4, True), s2: ("Bonjour", 2, True)}
    # A retried item with its key is answered its first receipt, and not appended again.
    again = batch(server, {"topic": "ai", "data": ", world", "append_to": s1, "key": "k-s1-3"})
    assert again[0]["repeat"] is True and again[0]["id"] == out[3]["id"], again
    # History holds the texts, one message per stream.
    since = s1.split("-")[0] + "-0"
    body = poll(server, f"topic=ai&since={since}&timeout=0")
    texts = [m["data"] for m in body["messages"]]
    assert texts == ["Bonjour", "a plain message between", "Hello, world"], body
    ws.close()


def test_a_refused_fragment_holds_back_its_stream_and_a_bad_item_its_topic(start_server):
    refusals_hold_back(start_server("--stream-max-bytes", "8"))


def test_on_redis_a_refused_fragment_holds_back_its_stream_and_a_bad_item_its_topic(cluster):
    _, (node,) = nodes(cluster, 1, "--stream-max-bytes", "8")
    refusals_hold_back(node)


def refusals_hold_back(s):
    a = fragment(s, "a", "stream=open", "1234")["stream"]
    b = fragment(s, "b", "stream=open", "x")["stream"]
    epoch = a.split("-")[0]
    ws_a, ws_c = ws_sub(s, "a"), ws_sub(s, "c")
    out = batch(
        s,
        {"topic": "a", "data": "56789", "append_to": a},  # 0: over stream_max_bytes
        {"topic": "a", "data": "5", "append_to": a},  # 1: held back: a hole otherwise
        {"topic": "a", "data": "plain"},  # 2: a message: goes
        {"topic": "b", "data": "y", "append_to": f"{epoch}-999"},  # 3: no such stream
        {"topic": "b", "data": "z", "append_to": b, "done": True},  # 4: another stream: goes
        {"topic": "c", "data": "q", "append_to": b},  # 5: stream b is not on topic c
        {"topic": "c", "data": "x", "event": "e", "stream": "open"},  # 6: invalid item
        {"topic": "c", "data": "held"},  # 7: its topic is held back by 6
        {"topic": "b", "data": "w", "append_to": b},  # 8: b was closed by 4
    )
    status = [r.get("status", 200) for r in out]
    assert status == [413, 424, 200, 404, 200, 424, 400, 424, 409], out
    assert "stream_max_bytes" in out[0]["error"], out
    assert "messages[0] of the same stream" in out[1]["error"], out
    assert out[4]["done"] is True and out[4]["seq"] == 2, out
    assert "messages[6] of the same topic" in out[5]["error"], out
    assert out[6]["error"].startswith("invalid fragment: "), out
    assert "messages[6]" in out[7]["error"], out
    assert "closed" in out[8]["error"], out
    assert recv_json(ws_a)["data"] == "plain"
    for ws in (ws_a, ws_c):
        with pytest.raises(TimeoutError):
            ws.recv(timeout=0.3)
        ws.close()
    m = s.metrics()
    # Refused by the broker (413, 404, 409) or invalid (400); held-back items are not.
    assert m["clarion_stream_refusals_total"] == 4, m
    assert m["clarion_batch_items_refused_total"] == 7, m
    # The first stream is whole and still open.
    more = fragment(s, "a", f"append_to={a}", "5")
    assert more["seq"] == 2


def test_a_batch_appends_on_one_node_to_a_stream_opened_on_another(cluster):
    _, (a, b) = nodes(cluster, 2)
    subs = [ws_sub(a, "story"), ws_sub(b, "story")]
    s1 = fragment(a, "story", "stream=open", "Once")["stream"]
    s2 = batch(b, {"topic": "story", "data": "Twice", "stream": "open"})[0]["stream"]
    out = batch(
        b,
        {"topic": "story", "data": " upon", "append_to": s1},
        {"topic": "story", "data": " over", "append_to": s2, "done": True},
        {"topic": "story", "data": " a time", "append_to": s1, "done": True},
    )
    assert [r["seq"] for r in out] == [2, 2, 3], out
    for ws in subs:
        reader = Reader()
        for _ in range(5):
            reader.take(recv_json(ws))
        assert reader.streams == {s1: ("Once upon a time", 3, True), s2: ("Twice over", 2, True)}
    since = s1.split("-")[0] + "-0"
    for node in (a, b):
        texts = [m["data"] for m in poll(node, f"topic=story&since={since}&timeout=0")["messages"]]
        assert texts == ["Twice over", "Once upon a time"], texts
