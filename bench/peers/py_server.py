"""Benchmark peers in Python, speaking what `clarion bench` speaks: WebSocket subscribers on
/ws?topic=T, and Clarion's publish batch on a separate API port, each message's data sent
verbatim as one text message to every subscriber of its topic, in order.

    bench/peers/.env/venv/bin/python bench/peers/py_server.py websockets|socketify PORT API_PORT
"""

import asyncio
import sys
import urllib.parse

sys.path.insert(0, __import__("os").path.dirname(__file__))
import publish_api  # noqa: E402


def topic_of(path):
    url = urllib.parse.urlsplit(path)
    if url.path != "/ws":
        return None
    return urllib.parse.parse_qs(url.query).get("topic", [None])[0]


def run_websockets(port, api_port):
    # Python `websockets` (asyncio implementation): a set of connections per topic and
    # websockets.broadcast(), its documented way to fan out without awaiting each client.
    from websockets.asyncio.server import broadcast, serve

    topics = {}

    async def handler(ws):
        topic = topic_of(ws.request.path)
        if topic is None:
            return
        subs = topics.setdefault(topic, set())
        subs.add(ws)
        try:
            await ws.wait_closed()
        finally:
            subs.discard(ws)

    def publish(topic, data):
        subs = topics.get(topic)
        if subs:
            broadcast(subs, data)

    async def main():
        async with serve(handler, "127.0.0.1", port, compression=None, ping_interval=None,
                         max_queue=None):
            await publish_api.serve(api_port, publish)
            print(f"ready {port}", flush=True)
            await asyncio.Future()

    asyncio.run(main())


def run_socketify(port, api_port):
    # µWebSockets through socketify: its own topic tree; the API on a second listener of the
    # same app (socketify's event loop is µWebSockets', not asyncio's).
    import json

    from socketify import App, OpCode

    app = App()

    def upgrade(res, req, context):
        topic = req.get_query("topic") or ""
        res.upgrade(req.get_header("sec-websocket-key"), req.get_header("sec-websocket-protocol"),
                    req.get_header("sec-websocket-extensions"), context, topic)

    def on_open(ws):
        ws.subscribe(ws.get_user_data())

    async def publish(res, req):
        body = await res.get_data()
        try:
            for m in json.loads(body.getvalue()).get("messages", []):
                app.publish(str(m["topic"]), str(m["data"]), OpCode.TEXT)
            res.end("ok")
        except (ValueError, KeyError, TypeError) as e:
            res.write_status(400).end(str(e))

    app.ws("/ws", {"upgrade": upgrade, "open": on_open, "idle_timeout": 0,
                   "max_backpressure": 64 * 1024 * 1024})
    app.post("/publish", publish)
    app.listen(api_port, lambda config: None)
    app.listen(port, lambda config: print(f"ready {port}", flush=True))
    app.run()


if __name__ == "__main__":
    mode, port, api_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    {"websockets": run_websockets, "socketify": run_socketify}[mode](port, api_port)
