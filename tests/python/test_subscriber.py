"""The Python subscriber (`clarion.Subscriber`, `clarion.SyncSubscriber`, python/client/src/clarion_client)
against real nodes while a publisher keeps publishing: a TCP cut through a relay the test
controls, kill -9 and restart, tokens that expire and are refreshed, a move to the second node of
a Redis-backed pair. Every message arrives once, in order; a gap the server reports is an item of
the iterator. And against a fake server that misbehaves: error events and reconnects with
backoff, never an exception into the app.
"""

import asyncio
import json
import pathlib
import socket
import sys
import threading
import time
import urllib.request

import jwt
import pytest
import websockets
from cluster_util import cluster, wait_until  # noqa: F401 (fixture)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python" / "client" / "src"))
from clarion_client.subscriber import Delivery, Gap, Subscriber, SubscriptionRefused, SyncSubscriber  # noqa: E402

SECRET = "python-subscriber-tests-0123456789"
FAST = dict(initial_delay=0.05, max_delay=0.4, restart_delay=0.3, stable=2.0)


def token(seconds, topics=("*",)):
    now = int(time.time())
    return jwt.encode({"sub": "py", "iat": now, "exp": now + seconds, "clarion": {"subscribe": list(topics)}}, SECRET, algorithm="HS256")


class Relay:
    """A TCP relay to `target` whose connections `cut()` drops; a refused far side closes the
    near side at once."""

    def __init__(self, target):
        self.target = target
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.lsock.getsockname()[1]}"
        self.socks = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                near, _ = self.lsock.accept()
            except OSError:
                return
            host, port = self.target.rsplit(":", 1)
            try:
                far = socket.create_connection((host, int(port)), timeout=2)
            except OSError:
                near.close()
                continue
            with self.lock:
                self.socks.update((near, far))
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        with self.lock:
            socks, self.socks = self.socks, set()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def close(self):
        self.lsock.close()
        self.cut()


class Publisher:
    """Publishes "0", "1", ... to `topic` every 20 ms through the first API of `apis` that
    answers, remembering each id."""

    def __init__(self, apis, topic):
        self.apis, self.topic, self.ids, self.errors = apis, topic, [], 0
        # Messages whose publish failed on the client's side and was sent again: the first
        # attempt may have been published (its answer lost with a killed node or a timeout).
        self.unsure = set()
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        n = i = 0
        while self.running:
            api = self.apis[i % len(self.apis)]
            req = urllib.request.Request(f"http://{api}/publish/{self.topic}", data=str(n).encode(), method="POST", headers={"Authorization": f"Bearer {SECRET}"})
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    self.ids.append(json.loads(r.read())["id"])
                    n += 1
            except OSError:
                self.errors += 1
                self.unsure.add(str(n))
                i += 1
            time.sleep(0.02)

    def stop(self):
        self.running = False
        self.thread.join(10)


def check_in_order(ids, got, unsure=()):
    assert not [g for g in got if isinstance(g, Gap)], got
    seen = [(d.id, d.data) for d in got]
    assert len({i for i, _ in seen}) == len(seen), "duplicates"
    # A publish the publisher sent twice because it saw no answer may be in the stream twice;
    # the copy it has no receipt for is the server doing what it was asked, not a duplicate.
    receipts = set(ids)
    seen = [(i, d) for i, d in seen if i in receipts or d not in unsure]
    expected = [(i, str(n)) for n, i in enumerate(ids)]
    start = expected.index(seen[0])
    assert seen == expected[start:], f"got {len(seen)} of {len(expected) - start}"


def test_async_subscriber_survives_cut_expiry_move_and_kill9_on_a_redis_cluster(cluster):  # noqa: F811
    redis = cluster.redis()
    args = ["--broker", redis.url, "--auth-secret", SECRET, "--api-key", SECRET, "--auth-expiry-warning", "2", "--auth-anonymous", "false"]
    a, b = cluster.start_nodes(2, *args)
    for n in (a, b):
        n.wait_healthy()
    relay = Relay(a.clients)
    tokens = []
    events = []

    def get_token():
        tokens.append(1)
        return token(4)

    async def main():
        got = []
        client = Subscriber([f"ws://{relay.address}/ws", f"ws://{b.clients}/ws"], get_token=get_token, on_event=lambda n, d: events.append((n, d)), **FAST)
        sub = client.subscribe("feed")

        async def consume():
            async for item in sub:
                got.append(item)

        consumer = asyncio.ensure_future(consume())
        connected = lambda: sum(1 for n, _ in events if n == "connected")  # noqa: E731

        async def until(pred, what, timeout=10.0):
            deadline = time.monotonic() + timeout
            while not pred():
                assert time.monotonic() < deadline, what
                await asyncio.sleep(0.02)

        await until(lambda: sub.state == "subscribed", "subscribed")
        pub = Publisher([b.api, a.api], "feed")
        try:
            await until(lambda: len(got) >= 20, "first messages")
            relay.cut()  # (b)
            await until(lambda: connected() >= 2 and client.state == "connected", "reconnect after the cut")
            await asyncio.sleep(4.5)  # (c) the 4-second token is refreshed on the warning
            await asyncio.get_running_loop().run_in_executor(None, a.stop)  # (d) move to b
            await until(lambda: connected() >= 3 and client.state == "connected", "move to b")
            assert [d for n, d in events if n == "connected"][-1]["url"] == f"ws://{b.clients}/ws"
            await asyncio.get_running_loop().run_in_executor(None, a.start)
            await asyncio.sleep(0.5)
            before = connected()
            b.kill9()  # (a) kill -9 of the node the client is on, then it comes back
            await asyncio.get_running_loop().run_in_executor(None, b.start)
            await until(lambda: connected() > before and client.state == "connected", "reconnect after kill -9")
            await asyncio.sleep(0.5)
        finally:
            await asyncio.get_running_loop().run_in_executor(None, pub.stop)
        await until(lambda: got and got[-1].id == pub.ids[-1], "the last message")
        await client.close()
        await asyncio.wait_for(consumer, 5)
        return got, pub

    got, pub = asyncio.run(main())
    relay.close()
    check_in_order(pub.ids, got, pub.unsure)
    assert len(got) >= 100
    assert len(tokens) >= 3, "the token was never refreshed"
    assert not [d for n, d in events if n == "disconnected" and d["code"] == 4001], events


def test_sync_subscriber_yields_a_gap_after_a_restart_of_a_memory_server(cluster):  # noqa: F811
    node = cluster.node()
    client = SyncSubscriber(f"ws://{node.clients}/ws", **FAST)
    try:
        items = client.subscribe("feed", timeout=10)
        wait_until(lambda: client.client.subs["feed"].state == "subscribed", 5, "subscribed")
        first = node.publish("feed", b"before")
        assert next(items) == Delivery("feed", first["id"], "before")
        node.kill9()
        node.start()
        gap = next(items)
        assert gap == Gap("feed", first["id"], "epoch")
        wait_until(lambda: client.client.subs["feed"].state == "subscribed", 5, "subscribed again")
        second = node.publish("feed", b"after")
        assert next(items) == Delivery("feed", second["id"], "after")
    finally:
        client.close()


def test_a_forbidden_topic_fails_only_its_subscription(cluster):  # noqa: F811
    node = cluster.node("--auth-secret", SECRET, "--api-key", SECRET)

    async def main():
        async with Subscriber(f"ws://{node.clients}/ws", get_token=lambda: token(60, ["ok"]), **FAST) as client:
            ok = client.subscribe("ok")
            no = client.subscribe("secret")
            try:
                await asyncio.wait_for(no.__anext__(), 5)
                raise AssertionError("the forbidden topic yielded")
            except SubscriptionRefused as e:
                assert e.topic == "secret" and "grant" in e.reason
            while ok.state != "subscribed":
                await asyncio.sleep(0.02)
            published = await asyncio.get_running_loop().run_in_executor(None, lambda: node.publish("ok", b"hi", headers={"Authorization": f"Bearer {SECRET}"}))
            item = await asyncio.wait_for(ok.__anext__(), 5)
            assert item == Delivery("ok", published["id"], "hi")
            assert client.state == "connected"

    asyncio.run(main())


def test_bad_input_is_an_error_event_and_a_reconnect_with_backoff():
    behaviours = {
        "garbage": lambda ws: ws.send("not json"),
        "unknown type": lambda ws: ws.send('{"type":"surprise"}'),
        "binary": lambda ws: ws.send(b"\x01\x02"),
        "oversized": lambda ws: ws.send(json.dumps({"type": "message", "topic": "t", "id": "e-1", "data": "x" * 5000})),
        "unknown close": lambda ws: ws.close(4999, "who knows"),
    }

    async def one(name, behave):
        async def handler(ws):
            await behave(ws)
            try:
                await ws.wait_closed()
            except Exception:
                pass

        async with websockets.serve(handler, "127.0.0.1", 0, subprotocols=["clarion.v1"], max_size=None) as server:
            port = server.sockets[0].getsockname()[1]
            events = []

            def on_event(n, d):
                events.append((n, d))
                raise RuntimeError("the app's callback throws: ignored")

            client = Subscriber(f"ws://127.0.0.1:{port}/ws", on_event=on_event, max_frame_bytes=1000, **FAST)
            client.subscribe("t")
            deadline = time.monotonic() + 15
            while sum(1 for n, _ in events if n == "reconnecting") < 3:
                assert time.monotonic() < deadline, f"{name}: {events}"
                await asyncio.sleep(0.02)
            await client.close()
            errors = [d for n, d in events if n == "error"]
            delays = [d["delay"] for n, d in events if n == "reconnecting"]
            assert len(errors) >= 3, f"{name}: {events}"
            assert all(0 <= x <= min(0.4, 0.05 * 2**i) for i, x in enumerate(delays)), delays
            return errors

    async def main():
        for name, behave in behaviours.items():
            errors = await one(name, behave)
            kind = "close" if name == "unknown close" else "protocol"
            assert any(e["kind"] == kind for e in errors), f"{name}: {errors}"

    asyncio.run(main())


def test_after_1012_the_first_reconnect_comes_within_reload_delay_and_after_1001_within_restart_delay():
    """1012 says the server is restarting (an upgrade or reload whose new process already
    listens, with the history): the first wait is short, so the resume lands inside the
    history (100 messages are 5 s at 20 msg/s). 1001 and 1013 keep the long spread."""

    async def first_delay(code, **options):
        async def handler(ws):
            await ws.close(code, "bye")

        async with websockets.serve(handler, "127.0.0.1", 0, subprotocols=["clarion.v1"]) as server:
            port = server.sockets[0].getsockname()[1]
            events = []
            # The longest draw the jitter can make.
            client = Subscriber(f"ws://127.0.0.1:{port}/ws", on_event=lambda n, d: events.append((n, d)),
                                random=lambda: 0.999, **options)
            client.subscribe("t")
            deadline = time.monotonic() + 10
            while not any(n == "reconnecting" for n, _ in events):
                assert time.monotonic() < deadline, events
                await asyncio.sleep(0.01)
            await client.close()
            closed = next(d for n, d in events if n == "disconnected")
            assert closed["code"] == code, closed
            return next(d["delay"] for n, d in events if n == "reconnecting")

    async def main():
        assert 0.9 < await first_delay(1012) < 1.0
        assert 9.9 < await first_delay(1001) < 10.0
        assert 9.9 < await first_delay(1013) < 10.0
        assert 0.29 < await first_delay(1012, reload_delay=0.3) < 0.3

    asyncio.run(main())


def test_a_filtered_subscription_gets_matching_messages_and_a_bad_filter_is_refused(cluster):  # noqa: F811
    node = cluster.node()
    client = SyncSubscriber(f"ws://{node.clients}/ws", **FAST)
    try:
        items = client.subscribe("fx", timeout=10, filter={"in": ["pair", ["EURUSD"]]})
        wait_until(lambda: client.client.subs["fx"].state == "subscribed", 5, "subscribed")
        for pair in ("USDJPY", "EURUSD"):
            status, _, body = node.request("POST", f"/publish/fx?tag.pair={pair}", pair.encode())
            assert status == 200, body
        got = next(items)
        assert (got.data, got.tags) == ("EURUSD", {"pair": "EURUSD"}), got
        bad = client.subscribe("other", timeout=10, filter="pair ==")
        with pytest.raises(SubscriptionRefused, match="invalid filter"):
            next(bad)
    finally:
        client.close()
