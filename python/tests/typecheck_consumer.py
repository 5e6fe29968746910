"""Checked with `mypy --strict` against the installed wheel by packaging/test.sh (not collected
by pytest): py.typed is shipped and the hints describe the API as users call it."""

import asyncio
from typing import List

import clarion
from clarion.testing import ClarionServer


def sync_use(server: ClarionServer) -> str:
    with clarion.Client(server.api_url, api_key="k", timeout=5.0) as c:
        r: clarion.Receipt = c.publish("news", "hello", event="e")
        rs: List[clarion.Receipt] = c.publish_batch([("a", b"\x01"), clarion.Message("b", "x")])
        with c.open_stream("ai", "Hel") as answer:
            w: clarion.StreamWriter = answer
            seq: int = w.append("lo").seq or 0
        try:
            c.publish("bad topic", "x")
        except clarion.BadRequest as e:
            status: int = e.status
            return f"{r.id} {len(rs)} {seq} {status} {e.message}"
    return ""


async def async_use(server: ClarionServer) -> int:
    async with clarion.AsyncClient(server.api_url, token=lambda: "jwt") as c:
        r = await c.publish("news", b"\x00")
        async with await c.open_stream("ai") as answer:
            w: clarion.AsyncStreamWriter = answer
            done: bool = (await w.close("!")).done or False
        return r.subscribers + int(done)


async def presence_use(url: str) -> List[str]:
    async with clarion.Subscriber(url, get_token=lambda: "jwt") as s:
        try:
            page: clarion.Presence = await s.presence("room.a", after="bob")
        except clarion.PresenceError as e:
            return [e.kind, e.topic, e.reason]
        names = [m.sub for m in page.members if page.more or m.info is None]
        room = s.subscribe("room.a", presence=True)
        async for item in room:
            if isinstance(item, (clarion.Join, clarion.Leave)):
                names.append(item.member.sub)
            elif isinstance(item, clarion.Presence):
                return names + list(room.members) + [str(room.count)]
        return names


def main() -> None:
    with ClarionServer(["--api-key", "k"]) as server:
        print(sync_use(server), asyncio.run(async_use(server)), clarion.find_clarion_bin(), clarion.__version__)


if __name__ == "__main__":
    main()
