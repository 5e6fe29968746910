"""Delta compression (docs/delta.md) against the real binary: subscribers that ask (`delta=1`,
`"delta":true`) on a topic of `delta_topics` get a full message first and then each message as a
Fossil delta of the one before, on a clarion.v1 WebSocket (with and without permessage-deflate),
SSE `format=json` and NDJSON streams; a subscriber that joins mid-stream or resumes gets a full
message first; the delta is computed once per publication; requests that cannot have deltas are
refused, saying why."""

import asyncio
import json
import pathlib
import random
import re
import socket
import sys

from websockets.asyncio.client import connect

import rawws

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python" / "client" / "src"))
from clarion_client.fossil import DeltaError, apply  # noqa: E402


def book(rng, levels=40):
    """An order book of about 2 KB as JSON."""
    side = lambda p0, sgn: [[round(p0 + sgn * i * 0.05, 2), rng.randint(1, 500)] for i in range(levels)]  # noqa: E731
    return {"symbol": "BTC-USD", "seq": 0, "bids": side(100.0, -1), "asks": side(100.05, 1)}


def updates(n, seed=7):
    """`n` successive order books (JSON text), each changing a few sizes of the one before."""
    rng = random.Random(seed)
    b = book(rng)
    out = []
    for i in range(n):
        b["seq"] = i
        for _ in range(4):
            side = b["bids"] if rng.random() < 0.5 else b["asks"]
            side[rng.randrange(len(side))][1] = rng.randint(1, 500)
        out.append(json.dumps(b, separators=(",", ":")))
    return out


class Reader:
    """Takes `clarion.v1` message envelopes, applying deltas to the last message taken."""

    def __init__(self):
        self.last_id = None
        self.last = None
        self.kinds = []  # "full" or "delta", in order
        self.texts = []

    def take(self, m):
        assert m["type"] == "message", m
        if "delta" in m:
            assert m["delta"] == self.last_id, f"delta of {m['delta']} after {self.last_id}"
            text = apply(self.last, m["data"].encode()).decode()
            self.kinds.append("delta")
        else:
            text = m["data"]
            self.kinds.append("full")
        self.last_id, self.last = m["id"], text.encode()
        self.texts.append(text)


async def ws_messages(ws, n, reader):
    while len(reader.texts) < n:
        m = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if m["type"] == "message":
            reader.take(m)
    return reader


def start(start_server, *extra):
    return start_server("--delta-topics", "book.*", *extra)


def test_ws_subscribers_get_a_full_message_then_deltas_with_and_without_deflate(start_server):
    server = start(start_server)
    msgs = updates(6)

    async def run():
        url = f"ws://{server.clients}/ws?topic=book.btc&delta=1"
        full_url = f"ws://{server.clients}/ws?topic=book.btc"
        async with connect(url, subprotocols=["clarion.v1"], compression=None) as plain, connect(
            url, subprotocols=["clarion.v1"]
        ) as deflated, connect(full_url, subprotocols=["clarion.v1"]) as other:
            assert deflated.protocol.extensions, "permessage-deflate was negotiated"
            for m in msgs:
                server.publish("book.btc", m)
            readers = [await ws_messages(ws, len(msgs), Reader()) for ws in (plain, deflated, other)]
            return readers

    plain, deflated, other = asyncio.run(run())
    for r in (plain, deflated):
        assert r.texts == msgs
        assert r.kinds == ["full"] + ["delta"] * 5
    # Not asked for: full messages.
    assert other.kinds == ["full"] * 6 and other.texts == msgs
    # Once per publication (the first has no previous one), whatever the subscribers.
    assert server.metrics()["clarion_deltas_computed_total"] == 5


def test_a_subscriber_joining_mid_stream_or_resuming_gets_a_full_message_first(start_server):
    server = start(start_server)
    msgs = updates(8)

    async def run():
        base = f"ws://{server.clients}/ws?topic=book.eth&delta=1"
        async with connect(base, subprotocols=["clarion.v1"]) as early:
            for m in msgs[:3]:
                server.publish("book.eth", m)
            first = await ws_messages(early, 3, Reader())
            async with connect(base, subprotocols=["clarion.v1"]) as late:
                for m in msgs[3:5]:
                    server.publish("book.eth", m)
                joined = await ws_messages(late, 2, Reader())
            # Resume after the second message: 3..5 replayed in full, then live deltas.
            since = f"{base}&since={first.last_id.rsplit('-', 1)[0]}-{int(first.last_id.rsplit('-', 1)[1]) - 1}"
            async with connect(since, subprotocols=["clarion.v1"]) as resumed:
                r = Reader()
                await ws_messages(resumed, 3, r)
                for m in msgs[5:8]:
                    server.publish("book.eth", m)
                await ws_messages(resumed, 6, r)
            # In-band: {"type":"subscribe","delta":true}.
            async with connect(f"ws://{server.clients}/ws", subprotocols=["clarion.v1"]) as inband:
                await inband.send(json.dumps({"type": "subscribe", "topic": "book.eth", "delta": True}))
                assert json.loads(await inband.recv())["type"] == "subscribed"
                server.publish("book.eth", msgs[0])
                server.publish("book.eth", msgs[1])
                band = await ws_messages(inband, 2, Reader())
            return joined, r, band

    joined, resumed, band = asyncio.run(run())
    assert joined.kinds == ["full", "delta"] and joined.texts == msgs[3:5]
    assert resumed.kinds == ["full", "full", "full", "delta", "delta", "delta"]
    assert resumed.texts == msgs[2:8]
    assert band.kinds == ["full", "delta"] and band.texts == msgs[:2]


def http_lines(server, target, n, pattern):
    """The first `n` JSON objects matched by `pattern` in a streamed answer to GET `target`."""
    sock = socket.create_connection(tuple(server.clients.rsplit(":", 1)), timeout=10)
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n".encode())
    return sock, lambda: _read_json(sock, n, pattern)


def _read_json(sock, n, pattern):
    buf, found = b"", []
    while len(found) < n:
        chunk = sock.recv(65536)
        assert chunk, f"stream ended after {found}"
        buf += chunk
        found = [json.loads(x) for x in re.findall(pattern, buf)]
    return found[:n]


def test_sse_json_and_ndjson_streams_carry_deltas(start_server):
    server = start(start_server)
    msgs = updates(4, seed=3)
    sse, read_sse = http_lines(server, "/sse?topic=book.sol&delta=1&format=json", 4, rb"data: (\{.*?\})\n")
    nd, read_nd = http_lines(server, "/stream?topic=book.sol&delta=1", 4, rb"(\{\"type\":\"message\".*?\})\n")
    # The heads are out once each answer began: subscribed.
    for s in (sse, nd):
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    for m in msgs:
        server.publish("book.sol", m)
    for read in (read_sse, read_nd):
        r = Reader()
        for m in read():
            r.take(m)
        assert r.texts == msgs and r.kinds == ["full", "delta", "delta", "delta"]
    sse.close()
    nd.close()


def test_a_delta_applied_to_another_base_is_refused_not_shown(start_server):
    """The rule a client follows: it applies a delta only to the message named in `delta`,
    and the checksum refuses what the id cannot catch."""
    server = start(start_server)
    msgs = updates(3, seed=5)

    async def run():
        url = f"ws://{server.clients}/ws?topic=book.x&delta=1"
        async with connect(url, subprotocols=["clarion.v1"]) as ws:
            for m in msgs:
                server.publish("book.x", m)
            return [json.loads(await asyncio.wait_for(ws.recv(), 10)) for _ in msgs]

    full, d1, d2 = asyncio.run(run())
    assert d1["delta"] == full["id"] and d2["delta"] == d1["id"]
    # d2 on d1's base (a lost d1): refused.
    try:
        apply(full["data"].encode(), d2["data"].encode())
        raise AssertionError("a delta applied to another base")
    except DeltaError:
        pass


def get(addr, target):
    """(status, whole answer) of GET `target` with `Connection: close`."""
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()
    return int(answer.split(b" ", 2)[1]), answer


def test_delta_requests_that_cannot_apply_are_refused_saying_why(start_server):
    server = start(start_server)
    addr = server.clients
    cases = [
        ("/ws?topic=news&delta=1", "Sec-WebSocket-Protocol: clarion.v1\r\n", b"delta_topics"),
        ("/ws?topic=book.a&delta=1", "", b"clarion.v1"),
    ]
    for path, extra, why in cases:
        sock, head, rest = rawws.connect(addr, path, extra_headers=extra)
        assert head.startswith("HTTP/1.1 400"), head
        body = rest if why in rest else rest + sock.recv(4096)
        assert why in body, (head, body)
        sock.close()
    for target, why in [
        ("/sse?topic=book.a&delta=1", b"format=json"),
        ("/stream?topic=book.a&delta=1&format=raw", b"format=json"),
        ("/sse?topic=book.a&topic=news&delta=1&format=json", b"\"news\""),
        ("/sse?topic=book.a&delta=yes&format=json", b"1 or 0"),
    ]:
        status, body = get(addr, target)
        assert status == 400 and why in body, (target, status, body)

    async def inband():
        async with connect(f"ws://{addr}/ws", subprotocols=["clarion.v1"]) as ws:
            await ws.send(json.dumps({"type": "subscribe", "topic": "news", "delta": True}))
            return json.loads(await ws.recv())

    reply = asyncio.run(inband())
    assert reply["type"] == "error" and "delta_topics" in reply["error"] and reply["topic"] == "news"
    assert server.metrics()["clarion_delta_refused_total"] == 6
    # A long-poll takes delta=1 and answers with full messages.
    status, body = get(addr, "/poll?topic=book.a&delta=1&timeout=0")
    assert status == 200, body


# The Python subscriber (python/client/src/clarion_client) with `delta=True`.
from clarion_client.subscriber import Delivery, Subscriber  # noqa: E402


def test_the_python_client_yields_whole_messages_from_a_real_servers_deltas(start_server):
    server = start(start_server)
    msgs = updates(5, seed=11)

    async def run():
        events = []
        async with Subscriber(f"ws://{server.clients}/ws", on_event=lambda n, d: events.append((n, d))) as client:
            sub = client.subscribe("book.py", delta=True)
            while sub.state != "subscribed":
                await asyncio.sleep(0.01)
            for m in msgs:
                server.publish("book.py", m)
            got = [await asyncio.wait_for(sub.__anext__(), 10) for _ in msgs]
            return got, sub.delta_failures, events

    got, failures, events = asyncio.run(run())
    assert [d.data for d in got] == msgs
    assert failures == 0, events


def test_the_python_client_resubscribes_from_its_last_message_when_a_delta_does_not_apply():
    """A fake server sends a full message, then a delta whose checksum is wrong, then one for
    another base: neither reaches the app; each time the client unsubscribes and subscribes
    again from the last message it yielded, and takes the full messages that follow."""
    good = "H\n6@0,6:there 5@6,OPwXW;"  # "hello world" -> "hello there world"
    corrupt = good.replace("OPwXW", "OPwXX")
    seen = []

    async def handler(ws):
        async for text in ws:
            m = json.loads(text)
            seen.append(m)
            if m["type"] != "subscribe":
                continue
            await ws.send(json.dumps({"type": "subscribed", "topic": "t"}))
            subscribes = sum(1 for x in seen if x["type"] == "subscribe")
            if subscribes == 1:
                await ws.send(json.dumps({"type": "message", "topic": "t", "id": "e-1", "data": "hello world"}))
                await ws.send(json.dumps({"type": "message", "topic": "t", "id": "e-2", "delta": "e-1", "data": corrupt}))
            elif subscribes == 2:
                await ws.send(json.dumps({"type": "message", "topic": "t", "id": "e-2", "data": "hello there world"}))
                await ws.send(json.dumps({"type": "message", "topic": "t", "id": "e-3", "delta": "e-1", "data": good}))
            else:
                await ws.send(json.dumps({"type": "message", "topic": "t", "id": "e-3", "data": "hello there world"}))

    async def run():
        import websockets

        async with websockets.serve(handler, "127.0.0.1", 0, subprotocols=["clarion.v1"]) as fake:
            port = fake.sockets[0].getsockname()[1]
            events = []
            async with Subscriber(f"ws://127.0.0.1:{port}/ws", on_event=lambda n, d: events.append((n, d))) as client:
                sub = client.subscribe("t", delta=True)
                got = [await asyncio.wait_for(sub.__anext__(), 10) for _ in range(3)]
                return got, sub.delta_failures, events

    got, failures, events = asyncio.run(run())
    assert got == [
        Delivery("t", "e-1", "hello world"),
        Delivery("t", "e-2", "hello there world"),
        Delivery("t", "e-3", "hello there world"),
    ]
    assert failures == 2
    assert [e["kind"] for n, e in events if n == "error"] == ["delta", "delta"]
    asks = [(m["type"], m.get("since"), m.get("delta")) for m in seen]
    assert asks == [
        ("subscribe", None, True),
        ("unsubscribe", None, None),
        ("subscribe", "e-1", True),
        ("unsubscribe", None, None),
        ("subscribe", "e-2", True),
    ]


# Over a cluster: each node computes the deltas of what it receives, in the topic's order.
from cluster_util import cluster  # noqa: E402,F401 (fixture)


def test_deltas_cross_a_cluster_each_node_against_what_it_received(cluster):
    for broker in (cluster.redis(), cluster.nats()):
        a, b = cluster.start_nodes(2, "--broker", broker.url, "--node-name", "n{i}", "--delta-topics", "book.*")
        msgs = updates(5, seed=17)

        async def run():
            url = f"ws://{b.clients}/ws?topic=book.c&delta=1"
            async with connect(url, subprotocols=["clarion.v1"]) as ws_b, connect(
                f"ws://{a.clients}/ws?topic=book.c&delta=1", subprotocols=["clarion.v1"]
            ) as ws_a:
                await asyncio.sleep(0.3)  # NATS: the subscription reaches the server
                for m in msgs:
                    a.publish("book.c", m)
                return [await ws_messages(ws, len(msgs), Reader()) for ws in (ws_a, ws_b)]

        for r in asyncio.run(run()):
            assert r.texts == msgs, broker
            assert r.kinds == ["full"] + ["delta"] * 4, broker
        # Each node computed each delta once.
        assert a.metrics()["clarion_deltas_computed_total"] == 4
        assert b.metrics()["clarion_deltas_computed_total"] == 4


def test_http2_sse_and_ndjson_streams_carry_deltas(start_server):
    """The same over HTTP/2 streams (h2c prior knowledge): a stream record is served by the
    transports as an HTTP/1.1 connection is, so the delta rule holds there too."""
    from h2client import Client

    server = start(start_server)
    msgs = updates(4, seed=5)
    c = Client(server.clients)
    try:
        sse = c.request("/sse?topic=book.h2&delta=1&format=json")
        nd = c.request("/stream?topic=book.h2&delta=1")
        c.pump(lambda: sse in c.headers and nd in c.headers, what="both heads")
        assert c.status(sse) == 200 and c.status(nd) == 200
        for m in msgs:
            server.publish("book.h2", m)

        def found(sid, pattern):
            return [json.loads(x) for x in re.findall(pattern, bytes(c.body[sid]))]

        sse_re, nd_re = rb"data: (\{.*?\})\n", rb"(\{\"type\":\"message\".*?\})\n"
        c.pump(lambda: len(found(sse, sse_re)) >= 4 and len(found(nd, nd_re)) >= 4, what="4 messages each")
        for sid, pattern in ((sse, sse_re), (nd, nd_re)):
            r = Reader()
            for m in found(sid, pattern)[:4]:
                r.take(m)
            assert r.texts == msgs and r.kinds == ["full", "delta", "delta", "delta"]
    finally:
        c.close()
