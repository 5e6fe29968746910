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


def events(ws, n, name="tick"):
    """The next `n` events named `name` (probes and other events skipped)."""
    out = []
    while len(out) < n:
        msg = recv(ws)
        if msg["event"] == name:
            out.append(msg)
    return out


def test_a_node_killed_the_resume_extension_loses_nothing_and_a_stock_client_resubscribes(
        cluster):
    a, b = pair(cluster, "redis")
    resuming, _ = connect(a)
    stock, _ = connect(a)
    subscribe(resuming, "ticks", clarion_since="")
    subscribe(stock, "ticks")
    until_heard(b, resuming, "ticks")
    until_heard(b, stock, "ticks")
    for i in range(10):
        lib(b).trigger("ticks", "tick", str(i))
    before = events(resuming, 10)
    assert all("clarion_id" in m for m in before), before[0]
    plain = events(stock, 10)
    assert [m["data"] for m in plain] == [str(i) for i in range(10)]
    assert all("clarion_id" not in m for m in plain), "a stock client sees Pusher's form"
    a.kill9()
    for i in range(10, 20):
        lib(b).trigger("ticks", "tick", str(i))
    # Both reconnect to the surviving node, as pusher-js does.
    resumed, _ = connect(b)
    subscribe(resumed, "ticks", clarion_since=before[-1]["clarion_id"])
    again, _ = connect(b)
    subscribe(again, "ticks")
    for i in range(20, 25):
        lib(b).trigger("ticks", "tick", str(i))
    after = events(resumed, 15)
    assert [m["data"] for m in before + after] == [str(i) for i in range(25)], "nothing lost"
    ids = [m["clarion_id"] for m in before + after]
    assert len(set(ids)) == 25
    # Without the extension: Pusher's semantics, live events from the resubscription on.
    live = events(again, 5)
    assert [m["data"] for m in live] == [str(i) for i in range(20, 25)]
    assert all("clarion_id" not in m for m in live)
    for ws in (resuming, stock, resumed, again):
        ws.close()


def test_a_resume_from_an_id_history_no_longer_holds_gets_a_clarion_gap_event(cluster):
    a, b = pair(cluster, "redis")
    lib(a).trigger("gone", "tick", "0")
    ws, _ = connect(b)
    subscribe(ws, "gone", clarion_since="0000000000000000-1")
    gap = events(ws, 1, name="clarion:gap")[0]
    assert gap["channel"] == "gone"
    data = json.loads(gap["data"])
    assert data["type"] == "gap" and data["since"] == "0000000000000000-1", data
    lib(a).trigger("gone", "tick", "1")
    for _ in range(3):
        if events(ws, 1)[0]["data"] == "1":
            break
    else:
        raise AssertionError("the live event after the gap did not come")
    ws.close()
