"""Appendable messages across a cluster (docs/cluster.md, "Appendable messages"). Redis: a
stream opened on one node is appended to on another; every node's subscribers get every
fragment live in order; a resume on either node, from any cursor, gets the text so far as ONE
message, exactly once; limits and the idle timeout are answered as by one node. NATS: each
node folds its own copy (the last test)."""

import json
import time

import pytest

from cluster_util import cluster, wait_until  # noqa: F401  (the fixture)
from test_cluster import nats_nodes, nodes, poll, recv_json, ws_sub
from test_streams import Reader, fragment, post

pytestmark = pytest.mark.timeout(60)

WORDS = ["Once", " upon", " a", " time", ",", " two", " nodes", " shared", " one", " answer", "."]


def replay(node, cursor):
    """What a client resuming from `cursor` on `node` is given (a long-poll that never holds)."""
    body = poll(node, f"topic=story&since={cursor}&timeout=0")
    assert not body.get("gaps"), body
    return body["messages"]


def test_a_stream_crosses_nodes_live_and_a_resume_at_every_boundary_gives_the_text_once(cluster):
    _, (a, b) = nodes(cluster, 2)
    subs = [ws_sub(a, "story"), ws_sub(b, "story")]
    before = a.publish("story", "before")["id"]
    # Fragment i is published on node i % 2: publishers behind a load balancer.
    publisher = [a, b]
    opened = fragment(a, "story", "stream=open", WORDS[0])
    sid = opened["stream"]
    assert (opened["id"], opened["seq"]) == (sid, 1)
    cursors = [before, sid]  # every position a client can hold, in order
    # Live events as each node's subscriber gets them; read as they come, so a node has
    # delivered the latest fragment (its position is there) before it is asked to resume.
    live = [[], []]

    def caught_up():
        for got, ws in zip(live, subs):
            while len(got) < len(cursors):
                got.append(recv_json(ws))

    plain = {}
    texts = {sid: WORDS[0]}  # the text so far at each fragment's id
    for i, w in enumerate(WORDS[1:], start=1):
        last = i == len(WORDS) - 1
        node = publisher[i % 2]
        r = fragment(node, "story", f"append_to={sid}" + ("&done=1" if last else ""), w)
        assert (r["stream"], r["seq"], r["done"]) == (sid, i + 1, last), r
        cursors.append(r["id"])
        texts[r["id"]] = "".join(WORDS[: i + 1])
        if i in (3, 7):
            p = publisher[(i + 1) % 2].publish("story", f"plain{i}")["id"]
            cursors.append(p)
            plain[p] = f"plain{i}"
        caught_up()
        # The property, at this stage of the stream: a resume on the node that did NOT take
        # this fragment, from every cursor so far, gives the text so far once, at its place.
        other = publisher[(i + 1) % 2]
        for j, c in enumerate(cursors):
            got = replay(other, c)
            later = cursors[j + 1:]
            want_plain = [plain[x] for x in later if x in plain]
            assert [m["data"] for m in got if "stream" not in m] == want_plain, (c, got)
            folded = [m for m in got if "stream" in m]
            fragments_after = [x for x in later if x in texts]
            if not fragments_after:
                assert folded == [], (c, got)
                continue
            assert len(folded) == 1, (c, got)
            f = folded[0]
            assert (f["type"], f["stream"], f["seq"], f["data"]) == (
                "message", sid, i + 1, texts[fragments_after[-1]],
            ), (c, f)
            assert f["id"] == fragments_after[-1]
            assert f.get("done", False) == last
    # Live, on both nodes: every fragment in order, the plain messages in their places.
    for got, ws in zip(live, subs):
        assert [m["id"] for m in got] == cursors, got
        reader = Reader()
        for m in got:
            reader.take(m)
        assert reader.streams[sid] == ("".join(WORDS), len(WORDS), True)
        assert [m["seq"] for m in got if m["type"] == "append"] == list(range(1, len(WORDS) + 1))
        ws.close()
    # A client that read up to any fragment and comes back on the other node ends with the
    # exact text: what it held, then the one folded message.
    frags = [x for x in cursors if x in texts]
    for j, c in enumerate(cursors):
        reader = Reader()
        held = [x for x in cursors[: j + 1] if x in texts]
        if held:
            reader.take({"type": "message", "stream": sid, "seq": len(held), "data": texts[held[-1]],
                         "done": len(held) == len(frags)})
        for m in replay(b, c):
            reader.take(m)
        assert reader.streams[sid] == ("".join(WORDS), len(frags), True), c
    status, _, body = b.request("GET", "/topics/story/latest")
    assert status == 200 and json.loads(body)["data"] == "".join(WORDS)


def test_stream_limits_and_a_late_append_are_answered_on_every_node_as_on_one(cluster):
    limits = ("--stream-max-fragments", "3", "--stream-max-bytes", "10", "--stream-max-open", "1")
    _, (a, b) = nodes(cluster, 2, *limits)
    sid = fragment(a, "t", "stream=open", "12345")["stream"]
    status, answer = post(b, "t", "stream=open", "x")
    assert status == 429 and "stream_max_open" in answer["error"], answer
    status, answer = post(b, "t", f"append_to={sid}", "123456")
    assert status == 413 and "stream_max_bytes" in answer["error"], answer
    fragment(b, "t", f"append_to={sid}", "6")
    fragment(a, "t", f"append_to={sid}", "7")
    status, answer = post(b, "t", f"append_to={sid}", "8")
    assert status == 413 and "stream_max_fragments" in answer["error"], answer
    status, answer = post(a, "other", f"append_to={sid}", "8")
    assert status == 404, answer
    status, answer = post(b, "t", f"append_to={sid.split('-')[0]}-999", "8")
    assert status == 404 and "stream=open" in answer["error"], answer
    s2 = fragment(a, "u", "stream=open")["stream"]
    fragment(b, "u", f"append_to={s2}&done=1", "end")
    status, answer = post(a, "u", f"append_to={s2}", "more")
    assert status == 409 and "closed" in answer["error"], answer
    refused = a.metrics()["clarion_stream_refusals_total"] + b.metrics()["clarion_stream_refusals_total"]
    assert refused == 6


def test_a_stream_left_open_is_closed_once_across_the_cluster_with_a_timeout_reason(cluster):
    _, (a, b) = nodes(cluster, 2, "--stream-timeout", "1")
    subs = [ws_sub(a, "slow"), ws_sub(b, "slow")]
    sid = fragment(a, "slow", "stream=open", "partial")["stream"]
    for ws in subs:
        assert recv_json(ws)["seq"] == 1
    for ws in subs:
        closing = recv_json(ws, timeout=10)
        assert closing["type"] == "append" and closing["stream"] == sid, closing
        assert (closing["seq"], closing["data"], closing["done"], closing["reason"]) == (
            2, "", True, "timeout",
        )
    status, answer = post(b, "slow", f"append_to={sid}", "late")
    assert status == 409, answer
    status, _, body = b.request("GET", "/topics/slow/latest")
    latest = json.loads(body)
    assert (latest["data"], latest["done"], latest["reason"]) == ("partial", True, "timeout")
    # Both nodes sweep; the script closes it once.
    time.sleep(1.5)
    timed_out = [n.metrics()["clarion_streams_timed_out_total"] for n in (a, b)]
    assert sum(timed_out) == 1, timed_out
    for ws in subs:
        ws.close()


def test_nats_a_stream_reaches_the_other_node_live_and_a_resume_on_each_node_gives_the_text_so_far(cluster):  # noqa: F811
    """Through NATS each node keeps its own copy of a stream (docs/cluster.md, "Appendable
    messages through NATS"): appends are taken by the opening node or one that saw it open,
    every node's subscribers get every fragment live, and a resume on a node gives that node's
    text so far as one message."""
    nats, (a, b) = nats_nodes(cluster, 2)
    subs = {"a": ws_sub(a, "story"), "b": ws_sub(b, "story")}
    wait_until(
        lambda: sorted(n for n, s in nats.subjects().items() if s) == ["n1", "n2"],
        10,
        "a and b subscribed at NATS",
    )
    node = {"a": a, "b": b}
    sid = fragment(a, "story", "stream=open", WORDS[0])["stream"]
    got = {n: [recv_json(ws)] for n, ws in subs.items()}
    for i, w in enumerate(WORDS[1:], start=1):
        last = i == len(WORDS) - 1
        # Alternately through b, which saw the stream open: it names it by a's id.
        r = fragment(node["ab"[i % 2]], "story", f"append_to={sid}" + ("&done=1" if last else ""), w)
        assert (r["stream"], r["seq"], r["done"]) == (sid, i + 1, last), r
        for n, ws in subs.items():
            got[n].append(recv_json(ws))
        if i == 5:
            # Mid-stream, on each node: from its first fragment, the text so far in one message.
            for n in "ab":
                body = poll(node[n], f"topic=story&since={got[n][0]['id']}&timeout=0")
                (folded,) = body["messages"]
                assert (folded["seq"], folded["data"]) == (6, "".join(WORDS[:6])), folded
    for n, events in got.items():
        assert [m["type"] for m in events] == ["append"] * len(WORDS), events
        assert [m["seq"] for m in events] == list(range(1, len(WORDS) + 1))
        reader = Reader()
        for m in events:
            reader.take(m)
        (text,) = reader.streams.values()
        assert text == ("".join(WORDS), len(WORDS), True), n
        # A resume on the same node from any fragment but the last: the whole text, once.
        for m in events[:-1]:
            body = poll(node[n], f"topic=story&since={m['id']}&timeout=0")
            assert [x["data"] for x in body["messages"]] == ["".join(WORDS)], (n, m, body)
        subs[n].close()
    # A node that never saw the stream open does not know it.
    status, answer = post(b, "other", "stream=open", "x")
    assert status == 200, answer
    status, answer = post(a, "other", f"append_to={answer['stream']}", "y")
    assert status == 404, answer
