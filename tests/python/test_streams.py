"""Appendable messages (AI token streams, docs/protocol.md "Appendable messages"): fragments
published with `stream=open` / `append_to` / `done` reach subscribers live as `append` events in
order with the topic's other messages; a subscriber that reconnects mid-stream, on a WebSocket
or on SSE, gets the text so far as ONE message and then the remaining appends; history keeps
one entry per stream; limits and the idle timeout are answered with clear statuses."""

import json
import time

import pytest

from test_cluster import Sse, recv_json, ws_sub

pytestmark = pytest.mark.timeout(60)


def post(node, topic, query, body=""):
    status, _, out = node.request(
        "POST", f"/publish/{topic}?{query}", body.encode(), {"Content-Type": "text/plain"}
    )
    return status, json.loads(out)


def fragment(node, topic, query, body=""):
    status, answer = post(node, topic, query, body)
    assert status == 200, answer
    return answer


class Reader:
    """The client's fold rule: a folded message sets a stream's text, an append at or below
    the seq held is dropped, the next one is added."""

    def __init__(self):
        self.streams = {}

    def take(self, m):
        if "stream" not in m:
            return
        text, seq, done = self.streams.get(m["stream"], ("", 0, False))
        if m["type"] == "message" and m["seq"] > seq:
            self.streams[m["stream"]] = (m["data"], m["seq"], m.get("done", False))
        elif m["type"] == "append" and m["seq"] > seq:
            assert m["seq"] == seq + 1, (m, seq)
            self.streams[m["stream"]] = (text + m["data"], m["seq"], m.get("done", False))


WORDS = ["The", " answer", " is", " forty", "-two", ",", " of", " course", "."]


def test_a_websocket_reconnecting_mid_stream_gets_the_text_so_far_as_one_message_then_the_rest(server):
    ws = ws_sub(server, "chat")
    opened = fragment(server, "chat", "stream=open", WORDS[0])
    sid = opened["stream"]
    assert opened["seq"] == 1 and opened["id"] == sid
    first = recv_json(ws)
    assert first == {
        "type": "append", "topic": "chat", "id": sid, "stream": sid, "seq": 1, "data": "The",
    }
    fragment(server, "chat", f"append_to={sid}", WORDS[1])
    plain = server.publish("chat", "a plain message between fragments")
    fragment(server, "chat", f"append_to={sid}", WORDS[2])
    got = [recv_json(ws) for _ in range(3)]
    assert [m["type"] for m in got] == ["append", "message", "append"]
    cursor = got[1]["id"]
    assert cursor == plain["id"]
    ws.close()
    for w in WORDS[3:6]:
        fragment(server, "chat", f"append_to={sid}", w)
    # Back from the plain message: the stream's text so far as one message, at its latest
    # fragment's place, then the rest live.
    ws = ws_sub(server, "chat", since=cursor)
    folded = recv_json(ws)
    assert folded["type"] == "message" and folded["stream"] == sid, folded
    assert (folded["seq"], folded["data"]) == (6, "".join(WORDS[:6])), folded
    assert "done" not in folded
    reader = Reader()
    reader.take(folded)
    for w in WORDS[6:-1]:
        fragment(server, "chat", f"append_to={sid}", w)
    last = fragment(server, "chat", f"append_to={sid}&done=1", WORDS[-1])
    assert last["done"] is True and last["seq"] == len(WORDS)
    for _ in WORDS[6:]:
        reader.take(recv_json(ws))
    assert reader.streams[sid] == ("".join(WORDS), len(WORDS), True)
    ws.close()
    # A client from the start gets one message for the whole stream, and the plain one.
    ws = ws_sub(server, "chat", since=sid.split("-")[0] + "-0")
    got = [recv_json(ws) for _ in range(2)]
    assert [m.get("stream") for m in got] == [None, sid], got
    assert got[1]["data"] == "".join(WORDS) and got[1]["done"] is True
    ws.close()
    # History holds one entry for the finished stream (the latest value is it).
    status, _, body = server.request("GET", "/topics/chat/latest")
    assert status == 200 and json.loads(body)["data"] == "".join(WORDS)


def test_an_sse_client_resuming_with_last_event_id_gets_the_text_so_far_then_the_appends(server):
    opened = fragment(server, "ai", "stream=open", "Hel")
    sid = opened["stream"]
    sse = Sse(server, "ai")
    mid = fragment(server, "ai", f"append_to={sid}", "lo")
    event_id, event, data = sse.event()
    assert (event_id, event) == (mid["id"], "append")
    assert json.loads(data)["data"] == "lo"
    sse.close()
    for w in [",", " wor", "ld"]:
        fragment(server, "ai", f"append_to={sid}", w)
    sse = Sse(server, "ai", last_event_id=mid["id"])
    event_id, event, data = sse.event()
    folded = json.loads(data)
    assert event == "stream" and (folded["seq"], folded["data"]) == (5, "Hello, world")
    reader = Reader()
    reader.take(folded)
    fragment(server, "ai", f"append_to={sid}&done=1")
    event_id, event, data = sse.event()
    assert event == "append"
    reader.take(json.loads(data))
    assert reader.streams[sid] == ("Hello, world", 6, True)
    sse.close()


def test_stream_limits_and_mistakes_are_answered_with_their_status_and_counted(start_server):
    s = start_server(
        "--stream-max-fragments", "3", "--stream-max-bytes", "10", "--stream-max-open", "1"
    )
    sid = fragment(s, "t", "stream=open", "12345")["stream"]
    status, answer = post(s, "t", "stream=open", "x")
    assert status == 429 and "stream_max_open" in answer["error"], answer
    status, answer = post(s, "t", f"append_to={sid}", "123456")
    assert status == 413 and "stream_max_bytes" in answer["error"], answer
    fragment(s, "t", f"append_to={sid}", "6")
    fragment(s, "t", f"append_to={sid}", "7")
    status, answer = post(s, "t", f"append_to={sid}", "8")
    assert status == 413 and "stream_max_fragments" in answer["error"], answer
    status, answer = post(s, "other", f"append_to={sid}", "8")
    assert status == 404, answer
    status, answer = post(s, "t", f"append_to={sid.split('-')[0]}-999", "8")
    assert status == 404 and "stream=open" in answer["error"], answer
    status, answer = post(s, "t", "done=1")
    assert status == 400, answer
    status, answer = post(s, "t", "stream=maybe")
    assert status == 400, answer
    s2 = fragment(s, "u", "stream=open")["stream"]
    fragment(s, "u", f"append_to={s2}&done=1", "end")
    status, answer = post(s, "u", f"append_to={s2}", "more")
    assert status == 409 and "closed" in answer["error"], answer
    assert s.metrics()["clarion_stream_refusals_total"] == 8


def test_a_stream_left_open_is_closed_with_a_timeout_reason(start_server):
    s = start_server("--stream-timeout", "1")
    ws = ws_sub(s, "slow")
    sid = fragment(s, "slow", "stream=open", "partial")["stream"]
    assert recv_json(ws)["seq"] == 1
    closing = recv_json(ws, timeout=10)
    assert closing["type"] == "append" and closing["stream"] == sid, closing
    assert (closing["seq"], closing["data"], closing["done"], closing["reason"]) == (
        2, "", True, "timeout",
    )
    status, answer = post(s, "slow", f"append_to={sid}", "late")
    assert status == 409, answer
    status, _, body = s.request("GET", "/topics/slow/latest")
    latest = json.loads(body)
    assert (latest["data"], latest["done"], latest["reason"]) == ("partial", True, "timeout")
    assert s.metrics()["clarion_streams_timed_out_total"] == 1
    ws.close()


def test_the_python_subscriber_gives_the_text_so_far_after_a_cut_then_the_rest(server):
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python" / "client" / "src"))
    from clarion_client.subscriber import SyncSubscriber  # noqa: E402
    from clarion_client.streams import StreamText  # noqa: E402
    from test_subscriber import FAST, Relay

    relay = Relay(server.clients)
    client = SyncSubscriber(f"ws://{relay.address}/ws", **FAST)
    try:
        items = client.subscribe("answer", timeout=10)
        deadline = time.monotonic() + 5
        while client.client.subs["answer"].state != "subscribed":
            assert time.monotonic() < deadline, "never subscribed"
            time.sleep(0.02)
        sid = fragment(server, "answer", "stream=open", "To")["stream"]
        assert next(items) == StreamText("answer", sid, sid, "To", 1)
        relay.cut()
        for w in [" be", " or", " not"]:
            fragment(server, "answer", f"append_to={sid}", w)
        # Back after the cut: the text so far in one item, then each fragment's new text.
        again = next(items)
        assert (again.text, again.seq, again.done) == ("To be or not", 4, False), again
        last = fragment(server, "answer", f"append_to={sid}&done=1", " to be")
        final = next(items)
        assert final == StreamText("answer", last["id"], sid, "To be or not to be", 5, True)
    finally:
        client.close()
        relay.close()


def test_the_python_subscriber_resubscribes_when_fragments_are_missing_with_an_error_of_kind_stream():
    """Frames handed to the client's own handler, no server: a fragment past the next one is
    never applied; the app gets an `error` of kind `stream` (not `delta`) and the client
    subscribes again from the last fragment it applied."""
    import asyncio
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python" / "client" / "src"))
    from clarion_client.subscriber import Subscriber, Subscription  # noqa: E402

    events = []
    client = Subscriber("ws://127.0.0.1:9/ws", on_event=lambda name, d: events.append((name, d)))
    sub = client.subs["answer"] = Subscription(client, "answer", None)

    async def feed():
        for seq, mid in [(1, "e-1"), (3, "e-3")]:
            m = {"type": "append", "topic": "answer", "id": mid, "stream": "s1", "seq": seq, "data": "x"}
            await client._on_frame(json.dumps(m))

    asyncio.run(feed())
    assert [(n, d["kind"]) for n, d in events if n == "error"] == [("error", "stream")], events
    assert sub.last_id == "e-1" and sub._resyncing and sub.delta_failures == 0
    assert sub._queue.qsize() == 1  # only the first fragment's text reached the app
