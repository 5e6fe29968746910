"""Pusher's webhooks (docs/pusher.md, "Webhooks"): an application's `webhook_url` is sent
`channel_occupied`/`channel_vacated`, `member_added`/`member_removed`, `client_event` and
`cache_miss` in Pusher's format, each request accepted by the official PyPI `pusher` library's
`validate_webhook` (its key, signature and `time_ms`), and exactly once per channel and member
across a Redis-backed pair of nodes."""

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pusher
import websockets.sync.client

from cluster_util import cluster  # noqa: F401  (the fixture)

APP = {"app_id": "123", "key": "app1-key", "secret": "app1-secret"}


def lib(host="127.0.0.1", port=80):
    return pusher.Pusher(app_id=APP["app_id"], key=APP["key"], secret=APP["secret"],
                         host=host, port=port, ssl=False)


class Receiver:
    """Takes Pusher webhooks, each checked by `validate_webhook` of the PyPI library."""

    def __init__(self):
        self.events, self.invalid, self.requests = [], [], 0
        outer, checker = self, lib()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                data = checker.validate_webhook(
                    key=self.headers.get("X-Pusher-Key", ""),
                    signature=self.headers.get("X-Pusher-Signature", ""),
                    body=body.decode())
                outer.requests += 1
                if data is None:
                    outer.invalid.append((dict(self.headers), body))
                else:
                    outer.events.extend(data["events"])
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/pusher/webhooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, name, **fields):
        return sum(e["name"] == name and all(e.get(k) == v for k, v in fields.items())
                   for e in self.events)

    def wait(self, pred, what, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.05)
        raise AssertionError(f"{what}: got {self.events}, invalid {self.invalid}")

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def app_args(url, *extra):
    return ("--pusher-app-id", APP["app_id"], "--pusher-app-key", APP["key"],
            "--pusher-app-secret", APP["secret"], "--pusher-webhook-url", url,
            "--webhook-batch-ms", "20", *extra)


class Conn:
    """A raw Pusher connection."""

    def __init__(self, clients):
        self.stack = contextlib.ExitStack()
        self.ws = self.stack.enter_context(websockets.sync.client.connect(
            f"ws://{clients}/app/{APP['key']}?protocol=7&client=js&version=8.4.0",
            open_timeout=5, close_timeout=2))
        msg = self.recv()
        assert msg["event"] == "pusher:connection_established", msg
        self.socket_id = json.loads(msg["data"])["socket_id"]

    def recv(self):
        return json.loads(self.ws.recv(timeout=5))

    def send(self, event, data, **extra):
        self.ws.send(json.dumps({"event": event, "data": data, **extra}))

    def subscribe(self, channel, user_id=None):
        data = {"channel": channel}
        if user_id is not None:
            data.update(lib().authenticate(channel, self.socket_id, {"user_id": user_id}))
        elif channel.startswith("private-"):
            data.update(lib().authenticate(channel, self.socket_id))
        self.send("pusher:subscribe", data)
        while True:
            msg = self.recv()
            if msg["event"] == "pusher_internal:subscription_succeeded":
                return
            assert msg["event"] != "pusher:error", msg

    def close(self):
        self.stack.close()


def test_channel_member_client_and_cache_events_in_pushers_format_validated_by_the_library(
        start_server):
    r = Receiver()
    s = start_server(*app_args(r.url, "--pusher-client-messages"))
    a = Conn(s.clients)
    a.subscribe("orders")
    r.wait(lambda: r.count("channel_occupied", channel="orders") == 1, "orders occupied")
    a.subscribe("presence-room", user_id="ada")
    a2 = Conn(s.clients)
    a2.subscribe("presence-room", user_id="ada")  # the same member's second connection
    b = Conn(s.clients)
    b.subscribe("presence-room", user_id="bob")
    r.wait(lambda: r.count("member_added", channel="presence-room") == 2, "two members added")
    b.send("client-typing", {"who": "bob"}, channel="presence-room")  # as pusher-js sends it
    r.wait(lambda: r.count("client_event") == 1, "the client event")
    b.subscribe("cache-ticker")
    r.wait(lambda: r.count("cache_miss", channel="cache-ticker") == 1, "the cache miss")
    b.close()
    r.wait(lambda: r.count("member_removed", channel="presence-room", user_id="bob") == 1,
           "bob removed")
    a2.close()
    time.sleep(0.3)
    assert r.count("member_removed", user_id="ada") == 0, "ada still has a connection"
    a.close()
    r.wait(lambda: r.count("channel_vacated", channel="orders") == 1
           and r.count("channel_vacated", channel="presence-room") == 1
           and r.count("member_removed", user_id="ada") == 1, "everything vacated")

    assert not r.invalid and r.requests >= 1
    assert r.count("channel_occupied", channel="presence-room") == 1
    assert r.count("channel_occupied", channel="cache-ticker") == 1
    assert r.count("channel_vacated", channel="cache-ticker") == 1
    assert sorted(e["user_id"] for e in r.events if e["name"] == "member_added") == ["ada", "bob"]
    [ce] = [e for e in r.events if e["name"] == "client_event"]
    assert json.loads(ce.pop("data")) == {"who": "bob"}, "data is the event's data as a string"
    assert ce == {"name": "client_event", "channel": "presence-room", "event": "client-typing",
                  "socket_id": b.socket_id, "user_id": "bob"}, ce
    # No Clarion-format event, no user topic, nothing else.
    assert {e["name"] for e in r.events} == {"channel_occupied", "channel_vacated",
                                             "member_added", "member_removed",
                                             "client_event", "cache_miss"}
    assert all(not e["channel"].startswith("pusher:") for e in r.events)
    r.close()


def test_a_wrong_secret_is_refused_by_the_library():
    """The check above is not vacuous: another secret's `validate_webhook` refuses a body
    signed as Clarion signs it."""
    import hashlib
    import hmac
    body = json.dumps({"time_ms": int(time.time() * 1000), "events": []})
    sig = hmac.new(APP["secret"].encode(), body.encode(), hashlib.sha256).hexdigest()
    assert lib().validate_webhook(APP["key"], sig, body) is not None
    other = pusher.Pusher(app_id="123", key=APP["key"], secret="other", ssl=False)
    assert other.validate_webhook(APP["key"], sig, body) is None


def test_occupied_vacated_added_removed_once_across_two_nodes(cluster):
    r = Receiver()
    redis = cluster.redis()
    n1, n2 = cluster.start_nodes(2, "--broker", redis.url, "--node-name", "n{i}",
                                 *app_args(r.url))
    a = Conn(n1.clients)
    a.subscribe("shared")
    a.subscribe("presence-room", user_id="ada")
    r.wait(lambda: r.count("member_added") == 1, "ada added on n1")
    b = Conn(n2.clients)
    b.subscribe("shared")
    b.subscribe("presence-room", user_id="ada")
    time.sleep(0.5)
    assert r.count("channel_occupied", channel="shared") == 1
    assert r.count("member_added") == 1, "ada's connection on n2 is the same member"
    a.close()
    time.sleep(0.5)
    assert r.count("channel_vacated") == 0 and r.count("member_removed") == 0, "n2 holds both"
    b.close()
    r.wait(lambda: r.count("channel_vacated", channel="shared") == 1
           and r.count("member_removed", user_id="ada") == 1, "vacated once")
    # The last connections on both nodes leaving at the same moment: still once.
    a, b = Conn(n1.clients), Conn(n2.clients)
    a.subscribe("both")
    b.subscribe("both")
    time.sleep(0.5)
    threading.Thread(target=a.close).start()
    b.close()
    r.wait(lambda: r.count("channel_vacated", channel="both") == 1, "both vacated")
    time.sleep(0.5)
    assert r.count("channel_occupied", channel="both") == 1
    assert r.count("channel_vacated", channel="both") == 1
    assert r.count("channel_occupied", channel="presence-room") == 1
    assert r.count("channel_vacated", channel="presence-room") == 1
    assert not r.invalid
    r.close()
