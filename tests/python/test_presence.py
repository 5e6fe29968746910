"""Presence against the real binary (docs/presence.md): member lists and join/leave events over
WebSocket, SSE, JSON lines and long-polls; one identity with several connections is one member;
a member that vanishes (reset, or silent until the idle timeout) leaves; the API's lists and
counts with pagination; who may read them; every refusal."""

import asyncio
import json
import signal
import socket
import struct
import time

import httpx
import jwt
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

import rawws

SECRET = "a-presence-test-secret-long-enough-0123456"
API_KEY = "presence-api-key"
KEYED = {"Authorization": f"Bearer {API_KEY}"}


def token(sub, topics=("room.*",), info=None, **extra):
    claim = {"subscribe": list(topics)}
    if info is not None:
        claim["info"] = info
    body = {"sub": sub, "exp": int(time.time()) + 300, "clarion": claim, **extra}
    return jwt.encode(body, SECRET, algorithm="HS256")


@pytest.fixture
def authed(start_server):
    return start_server(
        "--auth-secret",
        SECRET,
        "--api-key",
        API_KEY,
        "--presence-topics",
        "room.*,small",
        "--presence-max-members",
        "2",
        "--presence-max-topics",
        "2",
        "--ping-interval",
        "1",
        "--idle-timeout",
        "3",
    )


def ws(server, sub, topic="room.a", info=None, presence=True, topics=None):
    q = f"token={token(sub, info=info, topics=topics or ('room.*',))}&topic={topic}"
    if presence:
        q += "&presence=1"
    return connect(f"ws://{server.clients}/ws?{q}", subprotocols=["clarion.v1"])


async def next_json(c, kind=None, timeout=5):
    """The next text frame as JSON (skipping other types when `kind` is given)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no {kind} message"
        m = json.loads(await asyncio.wait_for(c.recv(), left))
        if kind is None or m["type"] == kind:
            return m


async def member_event(c, kind, sub, timeout=5):
    """The next `kind` event about `sub` (with a cluster, a watcher may first see its own join:
    its list can be read before its own change reaches Redis)."""
    deadline = time.monotonic() + timeout
    while True:
        m = await next_json(c, kind, timeout=max(deadline - time.monotonic(), 0.01))
        if m["member"]["sub"] == sub:
            return m


async def members_joined(c, subs, timeout=5):
    """Waits for a join event about each of `subs`, in any order: joins made one after another on
    another node may be announced in another order (that node's workers enter their connections
    into rooms each on its own)."""
    deadline = time.monotonic() + timeout
    waiting = set(subs)
    while waiting:
        m = await next_json(c, "join", timeout=max(deadline - time.monotonic(), 0.01))
        waiting.discard(m["member"]["sub"])


async def no_event_about(c, sub, seconds):
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            m = json.loads(await asyncio.wait_for(c.recv(), left))
        except asyncio.TimeoutError:
            return
        assert m.get("member", {}).get("sub") != sub, m


async def nothing_for(c, seconds):
    with pytest.raises(asyncio.TimeoutError):
        m = await asyncio.wait_for(c.recv(), seconds)
        pytest.fail(f"unexpected {m}")


def members(listing):
    return [m["sub"] for m in listing["members"]]


def test_members_join_and_leave_in_order_over_websocket(authed):
    async def main():
        async with ws(authed, "alice", info={"name": "Alice"}) as a:
            first = await next_json(a)
            assert first == {
                "type": "presence",
                "topic": "room.a",
                "count": 1,
                "connections": 1,
                "members": [{"sub": "alice", "info": {"name": "Alice"}}],
                "more": False,
            }
            async with ws(authed, "bob", presence=False) as b:
                joined = await next_json(a)
                assert joined == {"type": "join", "topic": "room.a", "member": {"sub": "bob"}}
                # A message published after the join arrives after it: one order.
                authed.publish("room.a", "hello", headers=KEYED)
                m = await next_json(a)
                assert m["type"] == "message" and m["data"] == "hello"
                await next_json(b, "message")
            left = await next_json(a)
            assert left == {"type": "leave", "topic": "room.a", "member": {"sub": "bob"}}
            # Presence events are not history: a resume replays the message only.
            async with connect(
                f"ws://{authed.clients}/ws?token={token('carol')}&topic=room.a&since={m['id'].split('-')[0]}-0",
                subprotocols=["clarion.v1"],
            ) as c:
                got = await next_json(c)
                assert got["type"] in ("message", "gap"), got
                if got["type"] == "gap":
                    got = await next_json(c)
                assert got["data"] == "hello"
                await nothing_for(c, 0.5)

    asyncio.run(main())


def test_one_identity_with_three_connections_is_one_member(authed):
    async def main():
        async with ws(authed, "watcher", topic="room.b") as w:
            await next_json(w, "presence")
            tabs = [await ws(authed, "dana", topic="room.b", presence=False).__aenter__() for _ in range(3)]
            assert (await next_json(w))["type"] == "join"
            await nothing_for(w, 0.5)
            status, _, body = authed.request("GET", "/topics/room.b/presence", headers=KEYED)
            assert status == 200
            got = json.loads(body)
            assert got["count"] == 2 and got["connections"] == 4
            assert {"sub": "dana", "connections": 3} in got["members"]
            for t in tabs[:2]:
                await t.close()
            await nothing_for(w, 0.5)
            await tabs[2].close()
            left = await next_json(w)
            assert left["type"] == "leave" and left["member"]["sub"] == "dana"

    asyncio.run(main())


def test_a_member_that_vanishes_leaves(authed):
    """A reset (no close frame) leaves at once; a client that goes silent (no FIN, no pong)
    leaves when the idle timeout (3 s here) closes it."""

    async def main():
        async with ws(authed, "watcher", topic="room.c") as w:
            await next_json(w, "presence")
            for how in ("reset", "silent"):
                path = f"/ws?token={token(how)}&topic=room.c"
                s, head, _ = rawws.connect(authed.clients, path)
                assert " 101 " in head.split("\r\n")[0], head
                assert (await next_json(w))["member"]["sub"] == how
                started = time.monotonic()
                if how == "reset":
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.close()
                # else: the socket stays open and never answers a ping.
                left = await next_json(w, "leave", timeout=8)
                took = time.monotonic() - started
                assert left["member"]["sub"] == how
                if how == "reset":
                    assert took < 1.0, took
                else:
                    assert 1.5 < took < 6.0, took
                    s.close()

    asyncio.run(main())


def test_sse_streams_and_polls_carry_presence(authed):
    url = f"http://{authed.clients}"
    with httpx.Client(timeout=10) as http:
        with http.stream(
            "GET", f"{url}/sse?topic=room.d&presence=1&token={token('sse-user')}"
        ) as r:
            assert r.status_code == 200
            lines = r.iter_lines()

            def event():
                name = data = None
                for line in lines:
                    if line.startswith("event:"):
                        name = line[6:].strip()
                    elif line.startswith("data:"):
                        data = json.loads(line[5:].strip())
                    elif line.startswith("id:"):
                        pytest.fail("presence events carry no id (Last-Event-ID stays on messages)")
                    elif line == "" and data is not None:
                        return name, data

            name, listing = event()
            assert name == "presence" and members(listing) == ["sse-user"]

            # A long-poll's first look answers at once with the member lists.
            first = http.get(f"{url}/poll?topic=room.d&presence=1&token={token('poller')}").json()
            assert first["messages"] == [] and members(first["presence"][0]) == ["sse-user"]

            async def join_while_polling():
                async with httpx.AsyncClient(timeout=10) as ah:
                    held = asyncio.create_task(
                        ah.get(
                            f"{url}/poll?topic=room.d&presence=1&timeout=10"
                            f"&since={first['cursor']}&token={token('poller')}"
                        )
                    )
                    await asyncio.sleep(0.5)
                    assert not held.done()
                    async with ws(authed, "erin", topic="room.d", presence=False):
                        answer = (await held).json()
                        assert answer["messages"] == []
                        assert members(answer["presence"][0]) == ["erin", "sse-user"]

            asyncio.run(join_while_polling())
            assert event() == ("join", {"type": "join", "topic": "room.d", "member": {"sub": "erin"}})
            assert event()[0] == "leave"

    # JSON lines carry the same objects.
    with httpx.Client(timeout=10) as http:
        with http.stream("GET", f"{url}/stream?topic=room.d&presence=1&token={token('nd')}") as r:
            line = json.loads(next(r.iter_lines()))
            assert line["type"] == "presence" and members(line) == ["nd"]


def test_a_held_poll_is_answered_by_a_join_with_nobody_else_watching(authed):
    url = f"http://{authed.clients}"

    async def main():
        async with httpx.AsyncClient(timeout=10) as http:
            first = (await http.get(f"{url}/poll?topic=room.p&presence=1&token={token('p')}")).json()
            held = asyncio.create_task(
                http.get(
                    f"{url}/poll?topic=room.p&presence=1&timeout=8&since={first['cursor']}"
                    f"&token={token('p')}"
                )
            )
            await asyncio.sleep(0.5)
            started = time.monotonic()
            async with ws(authed, "quinn", topic="room.p", presence=False):
                answer = (await held).json()
                assert time.monotonic() - started < 2
                assert members(answer["presence"][0]) == ["quinn"]

    asyncio.run(main())


def test_the_api_lists_pages_and_counts(authed):
    async def main():
        conns = [await ws(authed, s, topic="room.e", presence=False).__aenter__() for s in ("c", "a", "b")]
        anon_status, _, _ = authed.request("GET", "/topics/room.e/presence")
        assert anon_status == 401
        status, _, body = authed.request("GET", "/topics/room.e/presence", headers=KEYED)
        page = json.loads(body)
        assert status == 200 and members(page) == ["a", "b"] and page["next"] == "b"
        assert page["count"] == 3
        _, _, body = authed.request("GET", "/topics/room.e/presence?after=b", headers=KEYED)
        page = json.loads(body)
        assert members(page) == ["c"] and "next" not in page
        _, _, body = authed.request("GET", "/topics/room.e/presence?limit=1", headers=KEYED)
        assert members(json.loads(body)) == ["a"]
        status, _, body = authed.request("GET", "/topics/room.e/presence/count", headers=KEYED)
        assert json.loads(body) == {"topic": "room.e", "count": 3, "connections": 3}
        # A token that may subscribe may read; one that may not is refused.
        ok = {"Authorization": f"Bearer {token('x')}"}
        assert authed.request("GET", "/topics/room.e/presence/count", headers=ok)[0] == 200
        no = {"Authorization": f"Bearer {token('x', topics=('other',))}"}
        assert authed.request("GET", "/topics/room.e/presence", headers=no)[0] == 403
        assert authed.request("GET", "/topics/news/presence", headers=KEYED)[0] == 404
        assert authed.request("GET", "/topics/room.e/presence?limit=0", headers=KEYED)[0] == 400
        assert authed.request("POST", "/topics/room.e/presence", b"", KEYED)[0] == 405
        # The dashboard's topic view shows the occupancy and members.
        status, _, body = authed.request("GET", "/topics/room.e?limit=1", headers=KEYED)
        view = json.loads(body)
        assert status == 200 and view["presence"]["count"] == 3
        # (the first 20, capped by presence_max_members = 2)
        assert [m["sub"] for m in view["presence"]["members"]] == ["a", "b"]
        _, _, body = authed.request("GET", "/topics/news", headers=KEYED)
        assert json.loads(body)["presence"] is None
        m = authed.metrics()
        assert m["clarion_presence_members"] == 3
        assert m["clarion_presence_connections"] == 3
        assert m['clarion_presence_events_total{type="join"}'] >= 3
        for c in conns:
            await c.close()

    asyncio.run(main())


def test_presence_message_and_subscribe_option_in_band(authed):
    async def main():
        q = f"token={token('frank', topics=('room.*', 'news'))}"
        async with connect(f"ws://{authed.clients}/ws?{q}", subprotocols=["clarion.v1"]) as c:
            await c.send(json.dumps({"type": "presence", "topic": "room.f"}))
            got = await next_json(c)
            assert got["type"] == "presence" and got["members"] == [] and got["count"] == 0
            await c.send(json.dumps({"type": "subscribe", "topic": "room.f", "presence": True}))
            assert await next_json(c) == {"type": "subscribed", "topic": "room.f"}
            listing = await next_json(c)
            assert listing["type"] == "presence" and members(listing) == ["frank"]
            # Not granted: the answer says so, the connection stays.
            await c.send(json.dumps({"type": "presence", "topic": "small"}))
            err = await next_json(c)
            assert err["type"] == "error" and err["topic"] == "small"
            assert "grant" in err["error"]
            await c.send(json.dumps({"type": "subscribe", "topic": "news", "presence": True}))
            err = await next_json(c)
            assert err["type"] == "error" and "not kept for this topic" in err["error"]
            # presence_max_topics = 2: a third presence topic is refused.
            await c.send(json.dumps({"type": "subscribe", "topic": "room.g"}))
            await next_json(c, "subscribed")
            await c.send(json.dumps({"type": "subscribe", "topic": "room.h"}))
            err = await next_json(c)
            assert err["type"] == "error" and "presence_max_topics" in err["error"]

    asyncio.run(main())


def test_presence_events_reach_a_deflate_websocket_compressed(authed):
    import rawws
    from test_compression import inflate, read_frame

    q = f"token={token('watcher')}&topic=room.z&presence=1"
    sock, head, rest = rawws.connect(
        authed.clients, f"/ws?{q}",
        extra_headers="Sec-WebSocket-Protocol: clarion.v1\r\n"
                      "Sec-WebSocket-Extensions: permessage-deflate\r\n")
    assert "permessage-deflate" in head, head

    def next_typed(kind):
        nonlocal rest
        while True:
            rsv, op, payload, rest = read_frame(sock, rest)
            m = json.loads(inflate(payload) if rsv else payload)
            if m.get("type") == kind:
                return rsv, m

    next_typed("presence")
    # A member whose info is long enough to compress (over compression_threshold).
    info = {"name": "Ada Lovelace", "bio": "analytical engine " * 20}

    async def join():
        async with ws(authed, "ada", topic="room.z", info=info):
            rsv, joined = await asyncio.to_thread(next_typed, "join")
            assert joined["member"] == {"sub": "ada", "info": info}, joined
            assert rsv, "the join event compressed"

    try:
        asyncio.run(join())
    finally:
        sock.close()


def test_refusals_are_clear(authed):
    url = f"http://{authed.clients}"
    # A plain WebSocket carries no types: events would look like messages.
    with pytest.raises(InvalidStatus) as e:
        asyncio.run(connect(f"ws://{authed.clients}/ws?topic=room.a&presence=1&token={token('g')}").__aenter__())
    assert e.value.response.status_code == 400
    r = httpx.get(f"{url}/sse?topic=news&presence=1&token={token('g', topics=('news',))}")
    assert r.status_code == 400 and "not kept" in r.text
    r = httpx.get(f"{url}/stream?topic=room.a&presence=1&format=raw&token={token('g')}")
    assert r.status_code == 400
    r = httpx.get(f"{url}/sse?topic=room.a&presence=maybe&token={token('g')}")
    assert r.status_code == 400
    # An info past presence_max_info is refused with the token.
    big = token("g", info={"bio": "x" * 600})
    r = httpx.get(f"{url}/sse?topic=room.a&token={big}")
    assert r.status_code == 401 and "presence_max_info" in r.text
    not_object = token("g", info=["a"])
    assert httpx.get(f"{url}/sse?topic=room.a&token={not_object}").status_code == 401
    # The server's event names are reserved on presence topics only.
    status, _, body = authed.request(
        "POST", "/publish/room.a?event=join", b"x", {"Content-Type": "text/plain", **KEYED}
    )
    assert status == 400 and b"reserved" in body
    status, _, _ = authed.request(
        "POST", "/publish/news?event=join", b"x", {"Content-Type": "text/plain", **KEYED}
    )
    assert status == 200
    # Without the token for the topic the upgrade is refused.
    with pytest.raises(InvalidStatus) as e:
        asyncio.run(ws(authed, "h", topic="small").__aenter__())
    assert e.value.response.status_code == 403


def test_without_presence_topics_nothing_is_tracked(server):
    r = httpx.get(f"http://{server.clients}/sse?topic=room&presence=1")
    assert r.status_code == 400 and "presence_topics" in r.text
    assert server.request("GET", "/topics/room/presence")[0] == 404


def test_anonymous_connections_are_counted_not_listed(start_server):
    s = start_server("--presence-topics", "*")

    async def main():
        async with connect(f"ws://{s.clients}/ws?topic=lobby&presence=1", subprotocols=["clarion.v1"]) as a:
            first = await next_json(a)
            assert first["members"] == [] and first["connections"] == 1
            async with connect(f"ws://{s.clients}/ws?topic=lobby"):
                await asyncio.sleep(0.3)
                _, _, body = s.request("GET", "/topics/lobby/presence/count")
                assert json.loads(body) == {"topic": "lobby", "count": 0, "connections": 2}
            await nothing_for(a, 0.3)

    asyncio.run(main())


def test_anonymous_connections_are_listed_when_configured(start_server):
    s = start_server("--presence-topics", "*", "--presence-list-anonymous")

    async def main():
        async with connect(f"ws://{s.clients}/ws?topic=lobby&presence=1", subprotocols=["clarion.v1"]) as a:
            first = await next_json(a)
            assert first["count"] == 1 and first["members"][0]["sub"].startswith("~")
            me = first["members"][0]["sub"]
            async with connect(f"ws://{s.clients}/ws?topic=lobby"):
                joined = await next_json(a, "join")
                other = joined["member"]["sub"]
                assert other.startswith("~") and other != me
                _, _, body = s.request("GET", "/topics/lobby/presence")
                listed = json.loads(body)
                assert listed["count"] == 2 and listed["connections"] == 2
                assert sorted(m["sub"] for m in listed["members"]) == sorted([me, other])
            left = await next_json(a, "leave")
            assert left["member"]["sub"] == other

    asyncio.run(main())


# --------------------------------------------------------------------------------------------
# Across a cluster (Redis): one membership, dead nodes reaped, Redis restarts rebuilt.

from cluster_util import _recv_until, cluster, wait_until  # noqa: E402,F401 (fixture)


def node_args(redis):
    return (
        "--broker", redis.url, "--node-name", "n{i}", "--auth-secret", SECRET,
        "--api-key", API_KEY, "--presence-topics", "room.*",
    )


def api_presence(node, topic):
    status, _, body = node.request("GET", f"/topics/{topic}/presence", headers=KEYED)
    assert status == 200, body
    return json.loads(body)


def test_two_nodes_see_one_membership(cluster):
    redis = cluster.redis()
    a, b = cluster.start_nodes(2, *node_args(redis))

    async def main():
        async with ws(a, "watcher-a", topic="room.x") as wa, ws(b, "watcher-b", topic="room.x") as wb:
            await next_json(wa, "presence")
            await next_json(wb, "presence")
            # One identity on both nodes is one member; each node's watcher sees one join.
            async with ws(a, "zoe", topic="room.x", presence=False), ws(b, "zoe", topic="room.x", presence=False):
                for w in (wa, wb):
                    await member_event(w, "join", "zoe")
                # The second node's change may still be on its way: wait for it, bounded.
                listing = wait_until(
                    lambda: (got := api_presence(b, "room.x"))["connections"] == 4 and got,
                    what="both of zoe's connections counted",
                )
                assert members(listing) == ["watcher-a", "watcher-b", "zoe"]
                assert {"sub": "zoe", "connections": 2} in listing["members"]
                # Zoe's second connection made no second join.
                await no_event_about(wa, "zoe", 0.3)
            for w in (wa, wb):
                await member_event(w, "leave", "zoe")
            # The in-band list and the count agree, from either node.
            await wb.send(json.dumps({"type": "presence", "topic": "room.x"}))
            assert members(await next_json(wb, "presence")) == ["watcher-a", "watcher-b"]
            _, _, body = a.request("GET", "/topics/room.x/presence/count", headers=KEYED)
            assert json.loads(body) == {"topic": "room.x", "count": 2, "connections": 2}

    asyncio.run(main())


def test_a_killed_node_s_members_leave_everywhere(cluster):
    """kill -9 of a node: its members leave on the others within the documented bound
    (liveness 10 s + one 2 s round), with leave events; a restarted node starts clean."""
    redis = cluster.redis()
    a, b = cluster.start_nodes(2, *node_args(redis))

    async def main():
        async with ws(a, "watcher", topic="room.k") as w:
            await next_json(w, "presence")
            victims = [await ws(b, f"v{i}", topic="room.k", presence=False).__aenter__() for i in range(3)]
            await members_joined(w, [f"v{i}" for i in range(3)])
            killed = time.monotonic()
            b.kill9()
            gone = set()
            while len(gone) < 3:
                left = await next_json(w, "leave", timeout=20)
                gone.add(left["member"]["sub"])
            took = time.monotonic() - killed
            assert gone == {"v0", "v1", "v2"}
            assert took < 15, took
            assert members(api_presence(a, "room.k")) == ["watcher"]
            for v in victims:
                with pytest.raises(Exception):
                    await v.recv()

    asyncio.run(main())


def test_a_room_is_on_the_node_s_list_before_its_members_reach_redis(cluster):
    """The reaper finds a dead node's members through the node's room list, so the list is
    written first: a node killed between the two writes leaves no member nobody can reap
    (that window made the kill -9 test above fail now and then)."""
    redis = cluster.redis()
    (a,) = cluster.start_nodes(1, *node_args(redis))
    mon = redis._connect(5)
    mon.settimeout(10)
    mon.sendall(b"MONITOR\r\n")
    seen = _recv_until(mon, b"+OK\r\n").split(b"+OK\r\n", 1)[1]

    def until_written():
        # The member reaches Redis through the room script: an "apply" normally, a "sync" when
        # the node's first apply found Redis not yet ready (a loaded machine) and it rewrote
        # its whole part later. Either must come after the room went on the list.
        nonlocal seen
        deadline = time.monotonic() + 30
        while True:
            lines = seen.split(b"\r\n")
            for i, line in enumerate(lines):
                if (b'"apply"' in line or b'"sync"' in line) and b'"room.mon"' in line:
                    return lines[:i]
            assert time.monotonic() < deadline, f"no room script for room.mon: {lines[-5:]}"
            chunk = mon.recv(65536)
            assert chunk, "MONITOR closed"
            seen += chunk

    async def main():
        async with ws(a, "m0", topic="room.mon", presence=False):
            before = await asyncio.to_thread(until_written)
            assert any(b'"SADD"' in line and b"presence:rooms:" in line and b'"room.mon"' in line
                       for line in before), before[-5:]

    try:
        asyncio.run(main())
    finally:
        mon.close()


def test_a_redis_restart_rebuilds_presence_from_live_connections(cluster):
    redis = cluster.redis()
    a, b = cluster.start_nodes(2, *node_args(redis))

    async def main():
        conns = [
            await ws(a, "ann", topic="room.r", presence=False).__aenter__(),
            await ws(b, "ben", topic="room.r", presence=False).__aenter__(),
            await ws(b, "ann", topic="room.r", presence=False).__aenter__(),
        ]
        wait_until(lambda: members(api_presence(a, "room.r")) == ["ann", "ben"], what="membership")
        redis.restart()  # without persistence: every key is gone
        a.wait_healthy()
        b.wait_healthy()

        def rebuilt():
            try:
                got = api_presence(a, "room.r")
            except AssertionError:
                return False
            return got if members(got) == ["ann", "ben"] and got["connections"] == 3 else False

        got = wait_until(rebuilt, timeout=15, what="presence rebuilt after the Redis restart")
        assert {"sub": "ann", "connections": 2} in got["members"]
        # A member that leaves afterwards leaves for real (no ghost from before the restart).
        await conns[1].close()
        wait_until(lambda: members(api_presence(b, "room.r")) == ["ann"], what="ben left")
        for c in (conns[0], conns[2]):
            await c.close()
        wait_until(lambda: api_presence(a, "room.r")["connections"] == 0, what="room empty")

    asyncio.run(main())


def test_a_node_that_stops_takes_its_members_out_at_once(cluster):
    redis = cluster.redis()
    a, b = cluster.start_nodes(2, *node_args(redis))

    async def main():
        async with ws(a, "watcher", topic="room.s") as w:
            await next_json(w, "presence")
            c = await ws(b, "leaver", topic="room.s", presence=False).__aenter__()
            await member_event(w, "join", "leaver")
            started = time.monotonic()
            b.proc.send_signal(signal.SIGTERM)  # not stop(): it would block this event loop
            left = await next_json(w, "leave", timeout=10)
            assert left["member"]["sub"] == "leaver" and time.monotonic() - started < 5
            del c

    asyncio.run(main())
