"""Pusher semantics across a cluster (docs/pusher.md): a trigger's `socket_id` exclusion and
its event name travel with the message, so every node leaves out that socket and uses that
name (Redis and NATS), and a presence channel's client event carries its sender's `user_id`
on every node."""

import json

import pusher
import pytest
import websockets.sync.client

from cluster_util import cluster, wait_until  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(60)

APP = {"app_id": "123", "key": "app1-key", "secret": "app1-secret"}
PUSHER_ARGS = ("--pusher-app-id", APP["app_id"], "--pusher-app-key", APP["key"],
               "--pusher-app-secret", APP["secret"])


def pair(cluster, broker, *extra):
    b = cluster.redis() if broker == "redis" else cluster.nats()
    return cluster.start_nodes(2, "--broker", b.url, "--node-name", "n{i}", "--workers", "1",
                               *PUSHER_ARGS, *extra)


def lib(node):
    host, port = node.api.rsplit(":", 1)
    return pusher.Pusher(app_id=APP["app_id"], key=APP["key"], secret=APP["secret"],
                         host=host, port=int(port), ssl=False)


def connect(node):
    ws = websockets.sync.client.connect(
        f"ws://{node.clients}/app/{APP['key']}?protocol=7&client=js&version=8.4.0",
        open_timeout=5, close_timeout=2, legacy=True)
    msg = recv(ws)
    assert msg["event"] == "pusher:connection_established", msg
    return ws, msg["data"]["socket_id"]


def recv(ws, timeout=5):
    msg = json.loads(ws.recv(timeout=timeout))
    if isinstance(msg.get("data"), str) and msg["event"].startswith("pusher"):
        msg["data"] = json.loads(msg["data"])
    return msg


def subscribe(ws, channel, **data):
    ws.send(json.dumps({"event": "pusher:subscribe", "data": {"channel": channel, **data}}))
    msg = recv(ws)
    assert msg["event"] == "pusher_internal:subscription_succeeded", msg
    return msg


def next_event(ws):
    """The next message that is not a probe of `until_heard`."""
    while True:
        msg = recv(ws)
        if msg["event"] != "probe":
            return msg


def until_heard(node_a, ws, channel):
    """Publishes on node A until `ws` on the other node hears it (the cluster's interest in a
    new subscription is asynchronous), then drains to that probe."""
    def heard():
        lib(node_a).trigger(channel, "probe", "p")
        try:
            while True:
                if recv(ws, timeout=0.3)["event"] == "probe":
                    return True
        except TimeoutError:
            return False
    wait_until(heard, 10, "the other node hears the channel")


@pytest.mark.parametrize("broker", ["redis", "nats"])
def test_a_triggers_socket_id_and_event_name_apply_on_every_node(cluster, broker):
    a, b = pair(cluster, broker)
    excluded, excluded_id = connect(b)
    other, _ = connect(b)
    for ws in (excluded, other):
        subscribe(ws, "orders")
    until_heard(a, excluded, "orders")
    until_heard(a, other, "orders")
    name = "App\\Events\\OrderShipped"
    lib(a).trigger("orders", name, {"id": 42}, socket_id=excluded_id)
    lib(a).trigger("orders", "after", "x")
    # The excluded connection's next message is the one after: the trigger skipped it.
    assert next_event(excluded)["event"] == "after"
    got = next_event(other)
    assert (got["event"], got["channel"], json.loads(got["data"])) == (name, "orders", {"id": 42})
    assert next_event(other)["event"] == "after"
    excluded.close()
    other.close()


def join(node, ws, sid, channel, member):
    auth = lib(node).authenticate(channel, sid, member)
    return subscribe(ws, channel, auth=auth["auth"], channel_data=auth["channel_data"])


def test_a_presence_client_event_carries_its_senders_user_id_on_every_node(cluster):
    a, b = pair(cluster, "redis", "--pusher-client-messages")
    ada, ada_sid = connect(a)
    bob, bob_sid = connect(b)
    join(a, ada, ada_sid, "presence-room", {"user_id": "ada"})
    join(b, bob, bob_sid, "presence-room", {"user_id": "bob"})
    until_heard(a, bob, "presence-room")

    def typing():
        ada.send(json.dumps({"event": "client-typing", "channel": "presence-room",
                             "data": {"n": 1}}))
        try:
            while True:
                msg = recv(bob, timeout=0.3)
                if msg["event"] == "client-typing":
                    return msg
        except TimeoutError:
            return None
    seen = []
    wait_until(lambda: seen.append(typing()) or seen[-1] is not None, 10, "the event crosses")
    got = seen[-1]
    assert got["user_id"] == "ada", got
    assert got["channel"] == "presence-room"
    ada.close()
    bob.close()
