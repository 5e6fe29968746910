"""WebSocket clients for test_drain.py, one process's share: opens COUNT WebSockets to the
server from SOURCE (a loopback address of its own, so that many connections do not run out
of one address's ports), prints `connected N` once all are open, then waits until the
server closes each (or DEADLINE, a CLOCK_MONOTONIC time: system-wide, so the test compares
it with its own clock) and prints one JSON line: for each close code, the times it came.
A client answers a Close as a browser does (the same code back, then it closes) and a Ping
with a Pong. Bounded: at most CONCURRENCY handshakes at once.

    drain_clients.py HOST PORT SOURCE COUNT CONCURRENCY DEADLINE"""

import asyncio
import json
import os
import sys
import time

HANDSHAKE = (
    b"GET /ws?topic=drain HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n"
)


def masked(opcode, payload):
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + body


async def client(host, port, source, sem, connected, all_open):
    async with sem:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
        writer.write(HANDSHAKE)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            writer.close()
            return "refused", time.monotonic()
    connected.append(1)
    if len(connected) == all_open[0]:
        all_open[1].set()
    try:
        while True:
            b0, b1 = await reader.readexactly(2)
            n = b1 & 0x7F
            if n == 126:
                n = int.from_bytes(await reader.readexactly(2), "big")
            elif n == 127:
                n = int.from_bytes(await reader.readexactly(8), "big")
            payload = await reader.readexactly(n)
            opcode = b0 & 0x0F
            if opcode == 0x8:
                at = time.monotonic()
                code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                try:
                    writer.write(masked(0x8, payload[:2]))
                    await writer.drain()
                    writer.close()
                except ConnectionError:
                    pass
                return str(code), at
            if opcode == 0x9:
                writer.write(masked(0xA, payload))
    except (asyncio.IncompleteReadError, ConnectionError):
        return "reset", time.monotonic()


async def main(host, port, source, count, concurrency, deadline):
    sem = asyncio.Semaphore(concurrency)
    connected = []
    all_open = [count, asyncio.Event()]
    tasks = [
        asyncio.ensure_future(client(host, port, source, sem, connected, all_open))
        for _ in range(count)
    ]
    try:
        await asyncio.wait_for(all_open[1].wait(), max(1.0, deadline - time.monotonic()))
        print(f"connected {len(connected)}", flush=True)
    except asyncio.TimeoutError:
        print(f"connected {len(connected)} of {count} (timed out)", flush=True)
    done, pending = await asyncio.wait(tasks, timeout=max(0.1, deadline - time.monotonic()))
    for t in pending:
        t.cancel()
    out = {}
    for t in done:
        try:
            code, at = t.result()
        except OSError as e:
            code, at = f"error {e.errno}", time.monotonic()
        out.setdefault(code, []).append(at)
    if pending:
        out["none by the deadline"] = [deadline] * len(pending)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    h, p, src, n, c, d = sys.argv[1:7]
    asyncio.run(main(h, int(p), src, int(n), int(c), float(d)))
