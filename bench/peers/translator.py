"""Accepts Clarion's publish batch and forwards it to a peer's own publish API, so that
`clarion bench` can publish to peers that have a different one. It runs as its own process,
which the benchmark does not count as the server's.

    python3 bench/peers/translator.py pushpin API_PORT 5561
    python3 bench/peers/translator.py nchan API_PORT NGINX_PUB_PORT
    python3 bench/peers/translator.py fanout API_PORT PORT1,PORT2,...

- pushpin: one `POST /publish/` per batch to Pushpin's HTTP publish endpoint, one item per
  message with an `http-stream` format holding the SSE event (`data: DATA\\n\\n`), in order.
- nchan: one `POST /pub?id=TOPIC` per message (nchan's publisher location), in order.
- fanout: the same batch to every one of several servers that speak it themselves (a group of
  µWebSockets processes, which share nothing: each must be told of every publish), one after
  the other, each over its own keep-alive connection.
Any answer but 2xx fails the batch (the bench sees 502).
"""

import asyncio
import http.client
import json
import os
import sys
import urllib.parse

sys.path.insert(0, os.path.dirname(__file__))
import publish_api  # noqa: E402


class Upstream:
    def __init__(self, port):
        self.port = port
        self.conn = None

    def post(self, path, body, content_type):
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                self.conn.request("POST", path, body=body, headers={"Content-Type": content_type})
                r = self.conn.getresponse()
                answer = r.read()
                if not 200 <= r.status < 300:
                    raise RuntimeError(f"{path}: {r.status} {answer[:200]!r}")
                return
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise


def main():
    kind, api_port = sys.argv[1], int(sys.argv[2])
    ups = [Upstream(int(p)) for p in sys.argv[3].split(",")]
    up = ups[0]

    def to_pushpin(messages):
        items = [{"channel": t, "formats": {"http-stream": {"content": f"data: {d}\n\n"}}}
                 for t, d in messages]
        up.post("/publish/", json.dumps({"items": items}).encode(), "application/json")

    def to_nchan(messages):
        for t, d in messages:
            up.post("/pub?id=" + urllib.parse.quote(t, safe=""), d.encode(), "text/plain")

    def to_all(messages):
        body = json.dumps({"messages": [{"topic": t, "data": d} for t, d in messages]},
                          separators=(",", ":")).encode()  # as the bench sends it
        for u in ups:
            u.post("/publish", body, "application/json")

    forward = {"pushpin": to_pushpin, "nchan": to_nchan, "fanout": to_all}[kind]

    async def publish(messages):
        # Blocking is fine here: the bench publishes over one connection, batch after batch.
        forward(messages)

    async def run():
        await publish_api.serve(api_port, publish, batch=True)
        print(f"ready {api_port}", flush=True)
        await asyncio.Future()

    asyncio.run(run())


if __name__ == "__main__":
    main()
