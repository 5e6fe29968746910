"""Publishing with the package's clients to a server started by its test helper (the
`clarion_server` fixture of the pytest plugin), received by a real WebSocket client."""

import asyncio
import json

import websockets

import clarion
from clarion.testing import ClarionServer


async def receive(url, count, publish):
    """Subscribes at `url`, runs `publish` (a coroutine function), returns `count` frames."""
    async with websockets.connect(url, open_timeout=10) as ws:
        await publish()
        return [await asyncio.wait_for(ws.recv(), 10) for _ in range(count)]


def test_fixture_is_registered_by_the_entry_point(clarion_server):
    assert isinstance(clarion_server, ClarionServer)
    assert clarion_server.running
    assert clarion_server.client().healthy()


def test_sync_publish_reaches_a_websocket_subscriber(clarion_server, clarion_client):
    receipts = []

    async def publish():
        # The blocking client, run off the event loop so the subscriber keeps reading.
        receipts.append(await asyncio.to_thread(clarion_client.publish, "py-sync", "hello"))
        receipts.append(await asyncio.to_thread(clarion_client.publish, "py-sync", b"\x00\xff"))

    got = asyncio.run(receive(clarion_server.ws_url("py-sync"), 2, publish))
    assert got == ["hello", b"\x00\xff"]
    assert [r.subscribers for r in receipts] == [1, 1]
    assert receipts[0].topic == "py-sync" and receipts[0].id != receipts[1].id


def test_async_publish_and_batch(clarion_server):
    receipts = {}

    async def publish():
        async with clarion_server.async_client() as c:
            receipts["one"] = await c.publish("py-async", "first", event="greeting")
            receipts["batch"] = await c.publish_batch(
                [
                    clarion.Message("py-async", "second"),
                    ("py-async", b"\x01\x02"),
                    {"topic": "py-other", "data": "elsewhere", "event": "e"},
                ]
            )

    url = clarion_server.ws_url("py-async", "py-other")
    got = asyncio.run(receive(url, 4, publish))
    assert got == ["first", "second", b"\x01\x02", "elsewhere"]
    assert receipts["one"].subscribers == 1
    assert [r.topic for r in receipts["batch"]] == ["py-async", "py-async", "py-other"]


def test_envelopes_carry_ids_and_event_names(clarion_server, clarion_client):
    async def run():
        async with websockets.connect(
            clarion_server.ws_url("py-env"), subprotocols=["clarion.v1"], open_timeout=10
        ) as ws:
            r = await asyncio.to_thread(clarion_client.publish, "py-env", "x", "price")
            env = json.loads(await asyncio.wait_for(ws.recv(), 10))
            return r, env

    receipt, env = asyncio.run(run())
    assert env["id"] == receipt.id and env["topic"] == "py-env" and env["data"] == "x"


def test_helper_servers_are_independent_and_stop():
    with ClarionServer() as a, ClarionServer() as b:
        assert a.api != b.api and a.clients != b.clients
        assert a.client().publish("t", "x").subscribers == 0
    assert not a.running and not b.running


def test_a_batch_carries_fragments_of_appendable_messages_and_their_receipts(clarion_server, clarion_client):
    frames = []

    async def publish():
        def steps():
            opened = clarion_client.publish_batch(
                [{"topic": "py-ai", "data": "Hel", "stream": "open"}, ("py-ai", "a plain one")]
            )
            sid = opened[0].stream
            closed = clarion_client.publish_batch(
                [{"topic": "py-ai", "data": "lo", "append_to": sid, "done": True, "key": "py-ai-2"}]
            )
            return opened + closed

        frames.extend(await asyncio.to_thread(steps))

    got = asyncio.run(receive(clarion_server.ws_url("py-ai"), 3, publish))
    opened, plain, closed = frames
    assert (opened.seq, opened.done, opened.stream) == (1, False, opened.id)
    assert (plain.stream, plain.seq, plain.done) == (None, None, None)
    assert (closed.stream, closed.seq, closed.done) == (opened.stream, 2, True)
    appends = [json.loads(f) for f in (got[0], got[2])]
    assert [(a["type"], a["data"], a["seq"]) for a in appends] == [("append", "Hel", 1), ("append", "lo", 2)]
    assert got[1] == "a plain one"


def test_a_stream_writer_appends_fragments_and_closes_however_the_block_ends(clarion_server, clarion_client):
    written = {}

    async def publish():
        def sync_steps():
            with clarion_client.open_stream("py-answer", "The") as answer:
                answer.append(" answer")
                first = answer.append(" is", idempotency_key="py-answer-3")
                again = answer.append(" is", idempotency_key="py-answer-3")
                written["sync"] = (answer.id, answer.seq, first, again)
            written["sync_done"] = answer.done

        await asyncio.to_thread(sync_steps)
        async with clarion_server.async_client() as c:
            async with await c.open_stream("py-answer") as answer:
                await answer.append("42")
            written["async"] = (answer.id, answer.seq, answer.done)

    got = [json.loads(f) for f in asyncio.run(receive(clarion_server.ws_url("py-answer"), 7, publish))]
    sid, seq, first, again = written["sync"]
    assert (seq, first.seq, again.repeat, again.id) == (3, 3, True, first.id)
    assert written["sync_done"] is True
    assert [(m["stream"], m["seq"], m["data"], m.get("done", False)) for m in got[:4]] == [
        (sid, 1, "The", False), (sid, 2, " answer", False), (sid, 3, " is", False), (sid, 4, "", True),
    ]
    async_id, async_seq, async_done = written["async"]
    assert (async_seq, async_done) == (3, True)
    assert [(m["stream"], m["data"]) for m in got[4:]] == [(async_id, ""), (async_id, "42"), (async_id, "")]
