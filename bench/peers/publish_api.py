"""Clarion's publish batch, served for the Python peers and translators: `POST /publish` with
`{"messages":[{"topic":..,"data":..}]}` on a keep-alive HTTP/1.1 connection, answered
`200` with a Content-Length once every message has been handed to `publish(topic, data)`.
It is not what the benchmark measures (one connection, one request per batch)."""

import asyncio
import json


async def serve(port, publish, batch=False):
    """Serves the API on 127.0.0.1:`port`. `publish(topic, data)` is called per message, or
    with `batch`, `publish([(topic, data), ...])` once per request; either may be async."""

    async def client(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                body = await reader.readexactly(length) if length else b""
                status, answer = b"200 OK", b"ok"
                try:
                    messages = [(str(m["topic"]), str(m["data"]))
                                for m in json.loads(body).get("messages", [])]
                    for r in [publish(messages)] if batch else (publish(*m) for m in messages):
                        if asyncio.iscoroutine(r):
                            await r
                except (ValueError, KeyError, TypeError) as e:
                    status, answer = b"400 Bad Request", str(e).encode()
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: " + str(len(answer)).encode() + b"\r\n\r\n" + answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(client, "127.0.0.1", port)
