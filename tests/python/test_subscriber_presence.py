"""Presence in the Python subscriber (`Subscriber.subscribe(topic, presence=True)`,
`Subscriber.presence()`, python/client/src/clarion_client/subscriber.py) against the real server with
presence_topics: the member list, join and leave items with their info, the member map after a
cut connection and after a server restart (the fresh list replaces the map, the differences come
as Join/Leave items), member pages at presence_max_members, refusals, and SyncSubscriber."""

import asyncio
import pathlib
import sys
import time

import jwt
import pytest
from cluster_util import cluster, wait_until  # noqa: F401 (fixture)
from test_subscriber import Relay

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python" / "client" / "src"))
from clarion_client.subscriber import (  # noqa: E402
    Delivery,
    Gap,
    Join,
    Leave,
    Member,
    Presence,
    PresenceError,
    Subscriber,
    SubscriptionRefused,
    SyncSubscriber,
)

SECRET = "python-presence-tests-0123456789abcdef"
FAST = dict(initial_delay=0.05, max_delay=0.4, restart_delay=0.3, stable=2.0)
ARGS = ("--auth-secret", SECRET, "--api-key", SECRET, "--presence-topics", "room.*", "--presence-max-members", "2")


def token(sub, info=None):
    claim = {"subscribe": ["room.*", "news"]}
    if info is not None:
        claim["info"] = info
    return jwt.encode({"sub": sub, "exp": int(time.time()) + 300, "clarion": claim}, SECRET, algorithm="HS256")


def client(url, sub, info=None):
    return Subscriber(url, get_token=lambda: token(sub, info), **FAST)


async def take(sub, n=1, timeout=5.0):
    """The next `n` items of a subscription."""
    return [await asyncio.wait_for(sub.__anext__(), timeout) for _ in range(n)]


async def nothing(sub, seconds=0.4):
    with pytest.raises(asyncio.TimeoutError):
        item = await asyncio.wait_for(sub.__anext__(), seconds)
        pytest.fail(f"unexpected {item}")


async def until(predicate, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def test_list_join_and_leave_with_info(start_server):
    server = start_server(*ARGS)
    url = f"ws://{server.clients}/ws"

    async def main():
        async with client(url, "alice", {"name": "Alice"}) as alice, client(url, "bob") as bob:
            a = alice.subscribe("room.a", presence=True)
            assert await take(a) == [Presence("room.a", 1, 1, (Member("alice", {"name": "Alice"}),))]
            assert dict(a.members) == {"alice": {"name": "Alice"}}
            b = bob.subscribe("room.a", presence=True)
            listing = (await take(b))[0]
            assert [m.sub for m in listing.members] == ["alice", "bob"] and listing.count == 2
            assert await take(a) == [Join("room.a", Member("bob"))]
            assert dict(a.members) == {"alice": {"name": "Alice"}, "bob": None}
            # Messages and presence items come in one order.
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: server.publish("room.a", "hi", headers={"Authorization": f"Bearer {SECRET}"})
            )
            (item,) = await take(a)
            assert isinstance(item, Delivery) and item.data == "hi"
            await bob.close()
            assert await take(a) == [Leave("room.a", Member("bob"))]
            assert dict(a.members) == {"alice": {"name": "Alice"}}

    asyncio.run(main())


def test_one_identity_with_two_connections_is_one_member(start_server):
    server = start_server(*ARGS)
    url = f"ws://{server.clients}/ws"

    async def main():
        async with client(url, "watcher") as watcher, client(url, "carol") as tab1, client(url, "carol") as tab2:
            w = watcher.subscribe("room.b", presence=True)
            await take(w)
            t1 = tab1.subscribe("room.b")
            assert await take(w) == [Join("room.b", Member("carol"))]
            t2 = tab2.subscribe("room.b")
            await until(lambda: t1.state == t2.state == "subscribed", "both tabs subscribed")
            page = await watcher.presence("room.b")
            assert (page.count, page.connections) == (2, 3)
            await tab1.close()
            await nothing(w)
            await tab2.close()
            assert await take(w) == [Leave("room.b", Member("carol"))]
            assert list(w.members) == ["watcher"]

    asyncio.run(main())


def test_after_a_cut_the_fresh_list_replaces_the_map_with_the_differences_as_items(start_server):
    server = start_server(*ARGS)
    relay = Relay(server.clients)
    url = f"ws://{server.clients}/ws"

    async def main():
        events = []
        watcher = Subscriber(f"ws://{relay.address}/ws", get_token=lambda: token("watcher"), on_event=lambda n, d: events.append(n), **FAST)
        async with watcher, client(url, "dave") as dave, client(url, "erin", {"name": "Erin"}) as erin:
            w = watcher.subscribe("room.c", presence=True)
            await take(w)
            dave.subscribe("room.c")
            assert await take(w) == [Join("room.c", Member("dave"))]
            # The watcher is away (cut, and the relay refuses) while dave leaves and erin comes.
            relay.target = "127.0.0.1:9"
            relay.cut()
            await until(lambda: "disconnected" in events, "the cut")
            await dave.close()
            e = erin.subscribe("room.c")
            await until(lambda: e.state == "subscribed", "erin subscribed")
            await nothing(w, 0.2)
            relay.target = server.clients
            items = await take(w, 4, timeout=10)
            assert items == [
                Gap("room.c", None, "unpositioned"),  # no message had arrived: nothing to resume from
                Leave("room.c", Member("dave")),
                Join("room.c", Member("erin", {"name": "Erin"})),
                Presence("room.c", 2, 2, (Member("erin", {"name": "Erin"}), Member("watcher"))),
            ]
            assert dict(w.members) == {"erin": {"name": "Erin"}, "watcher": None}

    try:
        asyncio.run(main())
    finally:
        relay.close()


def test_after_a_server_restart_the_map_matches_who_is_there(cluster):  # noqa: F811
    node = cluster.node(*ARGS)
    url = f"ws://{node.clients}/ws"

    async def main():
        async with client(url, "watcher") as watcher, client(url, "gone") as gone:
            w = watcher.subscribe("room.d", presence=True)
            await take(w)
            gone.subscribe("room.d")
            assert await take(w) == [Join("room.d", Member("gone"))]
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, node.kill9)
            await gone.close()  # never comes back: only the fresh list can tell
            await loop.run_in_executor(None, node.start)
            items = await take(w, 3, timeout=15)
            assert items == [
                Gap("room.d", None, "unpositioned"),
                Leave("room.d", Member("gone")),
                Presence("room.d", 1, 1, (Member("watcher"),)),
            ]
            assert list(w.members) == ["watcher"]

    asyncio.run(main())


def test_pages_refusals_and_an_assembled_list(start_server):
    server = start_server(*ARGS)
    url = f"ws://{server.clients}/ws"

    async def main():
        others = [client(url, s) for s in ("m1", "m2", "m3", "m4")]
        subs = [c.subscribe("room.p") for c in others]
        async with client(url, "asker") as asker:
            with pytest.raises(PresenceError) as e:
                await asker.presence("room.p")
            assert e.value.kind == "disconnected"
            await until(lambda: all(s.state == "subscribed" for s in subs), "four members")
            news = asker.subscribe("news", presence=True)
            with pytest.raises(SubscriptionRefused) as refused:
                await take(news)
            assert "presence" in refused.value.reason
            await until(lambda: asker.state == "connected", "connected")
            first = await asker.presence("room.p")
            assert [m.sub for m in first.members] == ["m1", "m2"] and first.more and first.next == "m2"
            assert first.count == 4
            second = await asker.presence("room.p", after=first.next)
            assert [m.sub for m in second.members] == ["m3", "m4"] and not second.more and second.next is None
            x, y = await asyncio.gather(asker.presence("room.p", after="m1"), asker.presence("room.p", after="m3"))
            assert ([m.sub for m in x.members], [m.sub for m in y.members]) == (["m2", "m3"], ["m4"])
            with pytest.raises(PresenceError) as e:
                await asker.presence("news")
            assert e.value.kind == "server" and "presence" in e.value.reason
            # A subscription shows the whole room (five with itself), not the first page.
            p = asker.subscribe("room.p", presence=True)
            (listing,) = await take(p)
            assert [m.sub for m in listing.members] == ["asker", "m1", "m2", "m3", "m4"]
            assert not listing.more and len(p.members) == 5
        for c in others:
            await c.close()

    asyncio.run(main())


def test_sync_subscriber_presence(start_server):
    server = start_server(*ARGS)
    with SyncSubscriber(f"ws://{server.clients}/ws", get_token=lambda: token("sync", {"n": 1}), **FAST) as sync:
        items = sync.subscribe("room.s", timeout=5, presence=True)
        assert next(items) == Presence("room.s", 1, 1, (Member("sync", {"n": 1}),))
        assert dict(sync.client.subs["room.s"].members) == {"sync": {"n": 1}}
        page = sync.presence("room.s")
        assert page.members == (Member("sync", {"n": 1}),) and not page.more
