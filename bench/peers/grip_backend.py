"""The backend behind Pushpin: answers every `GET /sse?topic=T` with a GRIP stream hold on
channel T (`Grip-Hold: stream`, `Grip-Channel: T`) and an SSE content type, so Pushpin keeps
the client's connection open and sends it what is published to T. Pushpin calls it once per
subscriber, then holds the stream itself; this process is not counted as the server's.

    python3 bench/peers/grip_backend.py PORT
"""

import asyncio
import sys
import urllib.parse


async def client(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.split(b" ", 2)[1].decode("latin-1")
            url = urllib.parse.urlsplit(target)
            topic = urllib.parse.parse_qs(url.query).get("topic", [""])[0]
            if url.path == "/sse" and topic:
                body = b":\n\n"
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Cache-Control: no-cache\r\nGrip-Hold: stream\r\n"
                             b"Grip-Channel: " + topic.encode() + b"\r\n"
                             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, IndexError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main(port):
    await asyncio.start_server(client, "127.0.0.1", port, backlog=4096)
    print(f"ready {port}", flush=True)
    await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
