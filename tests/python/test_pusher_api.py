"""Pusher's HTTP API on the API listener, driven by the official PyPI `pusher` server library,
unchanged: trigger, batch trigger and channel queries are answered as Pusher answers them; a
wrong secret and a stale timestamp are refused; and Clarion's own subscribers (WebSocket and
SSE on the topic of the channel's name) receive what the library triggers (docs/pusher.md)."""

import hashlib
import hmac
import json
import threading
import time
from unittest import mock

import httpx
import pusher
import pytest
import websockets.sync.client

APP = {"app_id": "123", "key": "app1-key", "secret": "app1-secret"}


def start(start_server, *extra):
    return start_server(
        "--pusher-app-id", APP["app_id"], "--pusher-app-key", APP["key"],
        "--pusher-app-secret", APP["secret"], *extra,
    )


def client(server, secret=APP["secret"]):
    host, port = server.api.rsplit(":", 1)
    return pusher.Pusher(
        app_id=APP["app_id"], key=APP["key"], secret=secret, host=host, port=int(port), ssl=False
    )


def signed(server, path, payload):
    """POSTs `payload` to `path` signed as the libraries sign (for what they would not send)."""
    body = json.dumps(payload).encode()
    params = {
        "auth_key": APP["key"], "auth_timestamp": str(int(time.time())), "auth_version": "1.0",
        "body_md5": hashlib.md5(body).hexdigest(),
    }
    query = "&".join(f"{k}={v}" for k, v in sorted(params.items()))
    to_sign = f"POST\n{path}\n{query}".encode()
    sig = hmac.new(APP["secret"].encode(), to_sign, hashlib.sha256).hexdigest()
    return server.request("POST", f"{path}?{query}&auth_signature={sig}", body,
                          {"Content-Type": "application/json"})


def sse_lines(server, topic, out, ready, stop):
    """Collects an SSE stream's `event:`/`data:` lines into `out` until `stop` is set."""
    with httpx.Client(timeout=10) as c:
        with c.stream("GET", f"http://{server.clients}/sse?topic={topic}") as r:
            ready.set()
            for line in r.iter_lines():
                if line.startswith(("event:", "data:")):
                    out.append(line)
                if stop.is_set() or len(out) >= 4:
                    return


def wait_subscribers(server, topic, n):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if client(server).channel_info(topic, ["subscription_count"]).get("subscription_count") == n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{topic} never had {n} subscribers")


def test_a_library_trigger_reaches_clarion_websocket_and_sse_subscribers(start_server):
    server = start(start_server)
    lines, ready, stop = [], threading.Event(), threading.Event()
    t = threading.Thread(target=sse_lines, args=(server, "orders", lines, ready, stop), daemon=True)
    t.start()
    ready.wait(5)
    with websockets.sync.client.connect(f"ws://{server.clients}/ws?topic=orders") as ws:
        wait_subscribers(server, "orders", 2)
        p = client(server)
        assert p.trigger("orders", "order-shipped", {"id": 7}) == {}
        # Pusher's `data` string, unchanged, is the message.
        assert json.loads(ws.recv(timeout=5)) == {"id": 7}
        # Several channels at once, and an event name Clarion's SSE cannot carry.
        p.trigger(["orders", "other"], "App\\Events\\Shipped", "plain text")
        assert ws.recv(timeout=5) == "plain text"
    t.join(5)
    stop.set()
    assert lines[:3] == ["event: order-shipped", 'data: {"id": 7}', "data: plain text"]


def test_batch_trigger_publishes_every_event_in_order(start_server):
    server = start(start_server)
    with websockets.sync.client.connect(f"ws://{server.clients}/ws?topic=a&topic=b") as ws:
        wait_subscribers(server, "a", 1)
        out = client(server).trigger_batch(
            [
                {"channel": "a", "name": "e1", "data": {"n": 1}},
                {"channel": "b", "name": "e2", "data": {"n": 2}},
                {"channel": "a", "name": "e3", "data": "three"},
            ]
        )
        assert out == {}
        got = [ws.recv(timeout=5) for _ in range(3)]
        assert got == ['{"n": 1}', '{"n": 2}', "three"]


def test_channel_queries_answer_occupancy_and_subscription_counts(start_server):
    server = start(start_server)
    p = client(server)
    assert p.channel_info("empty-channel", ["subscription_count"]) == {
        "occupied": False, "subscription_count": 0,
    }
    with websockets.sync.client.connect(f"ws://{server.clients}/ws?topic=room-1"), \
            websockets.sync.client.connect(f"ws://{server.clients}/ws?topic=room-1"), \
            websockets.sync.client.connect(f"ws://{server.clients}/ws?topic=lobby"):
        wait_subscribers(server, "room-1", 2)
        assert p.channel_info("room-1", ["subscription_count"]) == {
            "occupied": True, "subscription_count": 2,
        }
        assert p.channels_info() == {"channels": {"lobby": {}, "room-1": {}}}
        assert p.channels_info(prefix_filter="room-") == {"channels": {"room-1": {}}}
        # Presence questions about a channel that is not a presence channel: 400, as on Pusher.
        with pytest.raises(pusher.errors.PusherBadRequest):
            p.channel_info("room-1", ["user_count"])
        with pytest.raises(pusher.errors.PusherBadRequest):
            p.users_info("room-1")
    assert p.users_info("presence-room") == {"users": []}


def test_a_wrong_secret_or_a_stale_timestamp_is_refused_and_counted(start_server):
    server = start(start_server)
    with pytest.raises(pusher.errors.PusherBadAuth) as e:
        client(server, secret="not-the-secret").trigger("a", "e", "x")
    assert "invalid signature" in str(e.value)
    # A request signed 11 minutes ago (Pusher's window is 600 s either way).
    stale = time.time() - 660
    with mock.patch("time.time", return_value=stale):
        with pytest.raises(pusher.errors.PusherBadAuth) as e:
            client(server).trigger("a", "e", "x")
    assert "timestamp expired" in str(e.value)
    # Ten minutes is within the window.
    with mock.patch("time.time", return_value=time.time() - 590):
        assert client(server).trigger("a", "e", "x") == {}
    m = server.metrics()
    assert m['clarion_pusher_api_requests_total{outcome="signature"}'] == 1
    assert m['clarion_pusher_api_requests_total{outcome="timestamp"}'] == 1
    assert m['clarion_pusher_api_requests_total{outcome="ok"}'] == 1


def test_unsigned_unknown_app_and_malformed_requests_get_pushers_statuses(start_server):
    server = start(start_server)
    status, _, body = server.request("POST", "/apps/123/events", b"{}")
    assert status == 401 and b"missing auth_key" in body
    status, _, body = server.request("GET", "/apps/999/channels")
    assert status == 404 and b"Unknown app" in body
    host, port = server.api.rsplit(":", 1)
    other = pusher.Pusher(app_id="999", key="k", secret="s", host=host, port=int(port), ssl=False)
    with pytest.raises(pusher.errors.PusherBadStatus):
        other.trigger("a", "e", "x")
    p = client(server)
    # What the library refuses to send itself, signed by hand: the server checks it too.
    status, _, body = signed(server, "/apps/123/events", {"name": "e", "channel": "a", "data": "x", "socket_id": "x.1"})
    assert status == 400 and b"invalid socket_id" in body
    status, _, body = signed(server, "/apps/123/events", {"name": "e", "channel": "a,b", "data": "x"})
    assert status == 400 and b"cannot be a Clarion topic" in body
    status, _, body = signed(server, "/apps/123/events", {"name": "e", "channel": "a", "data": "x" * 10241})
    assert status == 413 and b"10240" in body
    # A socket id is accepted (its connection is skipped once Pusher connections exist).
    assert p.trigger("a", "e", "x", socket_id="1234.5678") == {}
    assert p.terminate_user_connections("user-1") == {}


def test_without_an_app_the_pusher_api_is_not_found(server):
    status, _, body = server.request("GET", "/apps/123/channels")
    assert status == 404 and b"pusher_apps" in body


def test_apps_from_the_config_file_each_verify_with_their_own_secret(start_server, tmp_path):
    conf = tmp_path / "clarion.toml"
    conf.write_text(
        '[[pusher_apps]]\nid = "1"\nkey = "k1"\nsecret = "s1"\n'
        '[[pusher_apps]]\nid = "2"\nkey = "k2"\nsecret = "s2"\n'
    )
    server = start_server("--config", conf)
    host, port = server.api.rsplit(":", 1)
    for app_id, key, secret in (("1", "k1", "s1"), ("2", "k2", "s2")):
        p = pusher.Pusher(app_id=app_id, key=key, secret=secret, host=host, port=int(port), ssl=False)
        assert p.trigger("a", "e", "x") == {}
    crossed = pusher.Pusher(app_id="1", key="k2", secret="s2", host=host, port=int(port), ssl=False)
    with pytest.raises(pusher.errors.PusherBadAuth):
        crossed.trigger("a", "e", "x")
