"""A TLS-originating proxy for conformance runs: accepts clear-text connections (from the
Autobahn runner, which has no TLS) and relays each over its own TLS connection to Clarion's TLS
listener, so every Autobahn case also exercises Clarion's TLS record layer.

    python3 tls_proxy.py LISTEN_PORT TARGET_HOST:PORT CA_FILE

Prints `ready PORT` once listening. Bytes are relayed as they come, in both directions; a
close on either side closes the other.
"""

import asyncio
import ssl
import sys


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main():
    port, target, ca = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    host, tport = target.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca)

    async def handle(creader, cwriter):
        try:
            sreader, swriter = await asyncio.open_connection(
                host, int(tport), ssl=ctx, server_hostname="localhost"
            )
        except (OSError, ssl.SSLError):
            cwriter.close()
            return
        await asyncio.gather(pipe(creader, swriter), pipe(sreader, cwriter))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
