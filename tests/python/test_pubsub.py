"""Topic pub/sub through a real third-party client (Python `websockets`)."""

import asyncio
import base64
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from conftest import seq


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_every_subscriber_gets_every_message_in_order(server):
    async def main():
        a = await connect(server.ws_url(topics=["news"]))
        b = await connect(server.ws_url(topics=["news", "other"]))
        c = await connect(server.ws_url(topics=["other"]))
        sent = []
        for i in range(200):
            if i % 3 == 0:
                sent.append(bytes([i, 0, 255]))
                r = await asyncio.to_thread(server.publish, "news", sent[-1], True)
            else:
                sent.append(f"message {i} ✓")
                r = await asyncio.to_thread(server.publish, "news", sent[-1])
            assert r["subscribers"] == 2
        for ws in (a, b):
            got = [await ws.recv() for _ in sent]
            assert got == sent  # text arrives as str, binary as bytes
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(c.recv(), 0.3)
        for ws in (a, b, c):
            await ws.close()

    run(main())


def test_publish_reports_zero_subscribers_for_an_empty_topic(server):
    assert server.publish("nobody", "x")["subscribers"] == 0


def test_envelope_subprotocol(server):
    async def main():
        async with connect(server.ws_url(topics=["a", "b"]), subprotocols=["clarion.v1"]) as ws:
            assert ws.subprotocol == "clarion.v1"
            r1 = await asyncio.to_thread(server.publish, "a", "hello")
            r2 = await asyncio.to_thread(server.publish, "b", b"\x00\xff", True)
            m1 = json.loads(await ws.recv())
            m2 = json.loads(await ws.recv())
            assert m1 == {"type": "message", "topic": "a", "id": r1["id"], "data": "hello"}
            assert m2["topic"] == "b" and m2["encoding"] == "base64"
            assert base64.b64decode(m2["data"]) == b"\x00\xff"
            assert seq(m2["id"]) > seq(m1["id"])

    run(main())


def test_unknown_subprotocol_is_not_selected(server):
    async def main():
        async with connect(server.ws_url(topics=["a"]), subprotocols=["other"]) as ws:
            assert ws.subprotocol is None

    run(main())


def test_in_band_subscribe_and_unsubscribe(server):
    async def main():
        async with connect(server.ws_url()) as ws:
            await ws.send(json.dumps({"type": "subscribe", "topic": "live"}))
            assert json.loads(await ws.recv()) == {"type": "subscribed", "topic": "live"}
            await asyncio.to_thread(server.publish, "live", "one")
            assert await ws.recv() == "one"
            await ws.send(json.dumps({"type": "unsubscribe", "topic": "live"}))
            assert json.loads(await ws.recv()) == {"type": "unsubscribed", "topic": "live"}
            r = await asyncio.to_thread(server.publish, "live", "two")
            assert r["subscribers"] == 0
            # Subscribing twice is harmless and delivers once.
            for _ in range(2):
                await ws.send(json.dumps({"type": "subscribe", "topic": "live"}))
                assert json.loads(await ws.recv())["type"] == "subscribed"
            assert (await asyncio.to_thread(server.publish, "live", "three"))["subscribers"] == 1
            assert await ws.recv() == "three"

    run(main())


@pytest.mark.parametrize(
    "message, fragment",
    [
        ("not json", "JSON"),
        ('{"type":"dance"}', "dance"),
        ('{"type":"subscribe","topic":"bad topic!"}', "topic name"),
        ('{"type":"subscribe","topic":""}', "topic"),
        ('{"type":"subscribe","topic":"' + "x" * 129 + '"}', "topic"),
        ('{"type":"publish","topic":"t","data":"x"}', "disabled"),
    ],
)
def test_bad_control_messages_get_an_error_and_the_connection_stays_open(server, message, fragment):
    async def main():
        async with connect(server.ws_url(topics=["keep"])) as ws:
            await ws.send(message)
            reply = json.loads(await ws.recv())
            assert reply["type"] == "error"
            assert fragment.lower() in reply["error"].lower()
            await asyncio.to_thread(server.publish, "keep", "still here")
            assert await ws.recv() == "still here"

    run(main())


def test_subscription_limit(start_server):
    server = start_server("--max-subscriptions", 2)

    async def main():
        async with connect(server.ws_url(topics=["a", "b"])) as ws:
            await ws.send(json.dumps({"type": "subscribe", "topic": "c"}))
            reply = json.loads(await ws.recv())
            assert reply["type"] == "error" and reply["topic"] == "c"

    run(main())


def test_client_publish_when_allowed(start_server):
    server = start_server("--allow-client-publish")

    async def main():
        async with connect(server.ws_url(topics=["room"])) as sub, connect(server.ws_url()) as pub:
            await pub.send(json.dumps({"type": "publish", "topic": "room", "data": "hi"}))
            ack = json.loads(await pub.recv())
            assert ack["type"] == "published" and ack["subscribers"] == 1
            assert await sub.recv() == "hi"
            payload = base64.b64encode(b"\x01\x02").decode()
            await pub.send(
                json.dumps({"type": "publish", "topic": "room", "data": payload, "encoding": "base64"})
            )
            assert json.loads(await pub.recv())["type"] == "published"
            assert await sub.recv() == b"\x01\x02"

    run(main())


def test_binary_frame_on_pubsub_endpoint_closes_1003(server):
    async def main():
        async with connect(server.ws_url(topics=["t"])) as ws:
            await ws.send(b"\x00")
            with pytest.raises(ConnectionClosed) as info:
                await ws.recv()
            assert info.value.rcvd.code == 1003

    run(main())


def test_invalid_topic_in_url_is_400(server):
    async def main():
        with pytest.raises(Exception) as info:
            await connect(f"ws://{server.clients}/ws?topic=a%20b")
        assert "400" in str(info.value)

    run(main())


def test_echo_endpoint_is_off_by_default(server):
    async def main():
        with pytest.raises(Exception) as info:
            await connect(f"ws://{server.clients}/echo")
        assert "404" in str(info.value)

    run(main())


def test_metrics_follow_connections_and_subscriptions(server):
    async def main():
        async with connect(server.ws_url(topics=["m1", "m2"])) as a, connect(server.ws_url(topics=["m1"])) as b:
            m = await asyncio.to_thread(server.metrics)
            assert m['clarion_connections{transport="ws"}'] == 2
            assert m["clarion_subscriptions"] == 3
            assert m["clarion_topics"] == 2
            await asyncio.to_thread(server.publish, "m1", "x")
            # Both read it before leaving: a close that reaches the worker before the
            # publish does would leave nothing to deliver (seen once in CI).
            for ws in (a, b):
                assert await asyncio.wait_for(ws.recv(), 10) == "x"
        for _ in range(50):
            m = await asyncio.to_thread(server.metrics)
            if m['clarion_connections{transport="ws"}'] == 0:
                break
            await asyncio.sleep(0.05)
        assert m['clarion_connections{transport="ws"}'] == 0
        # m1 outlives its subscribers: its message stays in history for resuming clients.
        assert m["clarion_subscriptions"] == 0 and m["clarion_topics"] == 1
        assert m["clarion_history_messages"] == 1 and m["clarion_history_bytes"] > 0
        assert m["clarion_messages_published_total"] == 1
        assert m["clarion_messages_delivered_total"] == 2
        assert m['clarion_closes_total{reason="client_close"}'] == 2
        assert m["clarion_process_rss_bytes"] > 0

    run(main())


def test_batches_arrive_in_order_for_raw_and_envelope_subscribers(server):
    # Runs of one topic are written to each subscriber in one go; interleaving topics must
    # not reorder anything for a subscriber of both.
    items = [("a", f"a{i}") for i in range(40)] + [("b", "b0"), ("a", "a40"), ("b", "b1")]
    items += [("a", f"a{i}") for i in range(41, 80)]

    async def main():
        raw = await connect(server.ws_url(topics=["a", "b"]))
        env = await connect(server.ws_url(topics=["a", "b"]), subprotocols=["clarion.v1"])
        only_a = await connect(server.ws_url(topics=["a"]))
        body = json.dumps({"messages": [{"topic": t, "data": d} for t, d in items]}).encode()
        for _ in range(3):  # several batches back to back
            status, _, out = await asyncio.to_thread(
                server.request, "POST", "/publish", body, {"Content-Type": "application/json"}
            )
            assert status == 200, out
        expected = [d for _, d in items] * 3
        assert [await raw.recv() for _ in expected] == expected
        assert [json.loads(await env.recv())["data"] for _ in expected] == expected
        expected_a = [d for t, d in items if t == "a"] * 3
        assert [await only_a.recv() for _ in expected_a] == expected_a
        for ws in (raw, env, only_a):
            await ws.close()

    run(main())
