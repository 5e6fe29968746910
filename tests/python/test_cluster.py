"""Clarion nodes joined through Redis (docs/cluster.md), with real processes: publishes on one
node reach subscribers of every node over every transport, with the same ids; resumes work
across nodes; faults (a node killed, Redis restarted without persistence, Redis down or
stalled) behave as documented; a node only hears the topics it has subscribers for."""

import json
import socket
import threading
import time

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from cluster_util import cluster, wait_until  # noqa: F401  (the fixture)
from conftest import ROOT

pytestmark = pytest.mark.timeout(120)


def nodes(cluster, n, *extra):
    redis = cluster.redis()
    started = cluster.start_nodes(
        n, "--broker", redis.url, "--node-name", "n{i}", "--workers", "2", *extra
    )
    return redis, started


def ws_sub(node, *topics, since=None, envelope=True):
    """A WebSocket on `node` subscribed to `topics` (envelope JSON messages)."""
    url = f"ws://{node.clients}/ws?" + "&".join(f"topic={t}" for t in topics)
    if since:
        url += f"&since={since}"
    # legacy=True: the connection is closed by each test itself, not by a `with` block.
    # max_queue=None: a subscriber read only at the end of a long test keeps reading its
    # socket meanwhile, so it still answers pings; with the default bound (16 messages) it
    # stops, its keepalive times out, and it closes itself with 1011 mid-test (the resharding
    # test lost its subscribers that way on a loaded machine).
    return connect(
        url, subprotocols=["clarion.v1"] if envelope else None, open_timeout=10, legacy=True,
        max_queue=None,
    )


def ws_sub_retrying(node, *topics, since=None, timeout=20):
    """`ws_sub` as a client subscribes: refused with `503` while the node's link to its broker
    is not back yet (after a restart or a failover), it tries again every 0.2 s (sooner than
    the refusal's Retry-After asks, so that a test waits no longer than it must) until
    `timeout`."""
    subscribed = []

    def subscribe():
        try:
            subscribed.append(ws_sub(node, *topics, since=since))
            return True
        except InvalidStatus as e:
            if e.response.status_code != 503:
                raise
            return False

    wait_until(subscribe, timeout, f"a subscription to {topics} on {node.name}", 0.2)
    return subscribed[0]


def recv_json(ws, timeout=10):
    return json.loads(ws.recv(timeout=timeout))


def recv_messages(ws, count, timeout=15):
    """`count` messages (gap notices included, in order)."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"got {len(out)} of {count}: {out[-3:]}"
        out.append(recv_json(ws, timeout=left))
    return out


class Sse:
    """A raw SSE reader with a bounded wait per event."""

    def __init__(self, node, topic, last_event_id=None):
        host, port = node.clients.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        extra = f"Last-Event-ID: {last_event_id}\r\n" if last_event_id else ""
        self.sock.sendall(
            f"GET /sse?topic={topic} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n{extra}\r\n".encode()
        )
        self.buf = b""
        head = self._until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head

    def _until(self, marker):
        while marker not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "SSE stream closed"
            self.buf += chunk
        part, self.buf = self.buf.split(marker, 1)
        return part

    def event(self):
        """(id, event, data) of the next event, skipping comments."""
        while True:
            block = self._until(b"\n\n").decode()
            fields = {}
            for line in block.split("\n"):
                if line.startswith(":") or ":" not in line:
                    continue
                k, v = line.split(":", 1)
                fields[k] = v[1:] if v.startswith(" ") else v
            if "data" in fields:
                return fields.get("id"), fields.get("event"), fields["data"]

    def close(self):
        self.sock.close()


def poll(node, query, timeout=10):
    host, port = node.clients.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(f"GET /poll?{query} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return json.loads(body)


def test_a_publish_on_one_node_reaches_every_transport_on_the_others(cluster):
    _, (a, b, c) = nodes(cluster, 3)
    ws_b = ws_sub(b, "news")
    ws_c = ws_sub(c, "news")
    sse_c = Sse(c, "news")
    held = {}

    def long_poll():
        held["body"] = poll(c, "topic=news&timeout=10")

    t = threading.Thread(target=long_poll)
    t.start()
    time.sleep(0.5)
    ids = [a.publish("news", f"m{i}")["id"] for i in range(5)]
    epoch = ids[0].split("-")[0]
    assert ids == [f"{epoch}-{i}" for i in range(1, 6)], "offsets per topic, from 1"
    for ws in (ws_b, ws_c):
        got = recv_messages(ws, 5)
        assert [m["data"] for m in got] == [f"m{i}" for i in range(5)]
        assert [m["id"] for m in got] == ids, "the same ids on every node"
    for i in range(5):
        eid, _, data = sse_c.event()
        assert (eid, data) == (ids[i], f"m{i}")
    t.join(15)
    assert [m["id"] for m in held["body"]["messages"]][:1] == ids[:1]
    # A publish on another node gets the next offset.
    assert b.publish("news", "m5")["id"] == f"{epoch}-6"
    assert recv_json(ws_c)["id"] == f"{epoch}-6"
    for ws in (ws_b, ws_c):
        ws.close()
    sse_c.close()


def test_resume_on_another_node_is_exact_and_a_long_poll_chain_crosses_nodes(cluster):
    _, (a, b, c) = nodes(cluster, 3)
    ws = ws_sub(a, "feed")
    ids = [c.publish("feed", f"x{i}")["id"] for i in range(10)]
    got = recv_messages(ws, 4)
    last = got[-1]["id"]
    ws.close()
    # The client comes back on node b, resuming from the fourth message.
    ws = ws_sub(b, "feed", since=last)
    again = recv_messages(ws, 6)
    assert [m["id"] for m in again] == ids[4:]
    c.publish("feed", "live")
    assert recv_json(ws)["data"] == "live"
    ws.close()
    # SSE with Last-Event-ID on node c.
    sse = Sse(c, "feed", last_event_id=ids[7])
    assert [sse.event()[0] for _ in range(3)] == ids[8:] + [ids[-1].split("-")[0] + "-11"]
    sse.close()
    # A long-poll chain hopping between nodes sees every message once.
    cursor = ids[0]
    seen = []
    for node in (a, b, c, a):
        body = poll(node, f"topic=feed&since={cursor}&timeout=1")
        seen += [m["data"] for m in body["messages"]]
        cursor = body["cursor"]
        assert not body.get("gaps"), body
    assert seen == [f"x{i}" for i in range(1, 10)] + ["live"]


def test_a_trimmed_resume_and_a_foreign_id_get_a_gap_notice(cluster):
    _, (a, b) = nodes(cluster, 2, "--history-size", "3")
    first = a.publish("t", "0")["id"]
    for i in range(1, 10):
        a.publish("t", str(i))
    ws = ws_sub(b, "t", since=first)
    gap = recv_json(ws)
    assert gap["type"] == "gap" and gap["reason"] == "trimmed" and gap["since"] == first
    assert [m["data"] for m in recv_messages(ws, 3)] == ["7", "8", "9"]
    ws.close()
    ws = ws_sub(b, "t", since="zzzz-3")
    assert recv_json(ws)["reason"] == "epoch"
    ws.close()


def test_a_multi_topic_long_poll_carries_one_id_per_topic(cluster):
    _, (a, b) = nodes(cluster, 2)
    a.publish("p1", "before")
    first = poll(b, "topic=p1&topic=p2&timeout=0")
    cursor = first["cursor"]
    assert cursor.count(",") == 1 and cursor.startswith("p1:"), cursor
    a.publish("p2", "two")
    a.publish("p1", "one")
    # A long-poll answers with what has reached its node: the two topics' messages may reach b
    # in two of its reads from Redis (under load), and the client polls again from the cursor.
    got, deadline = [], time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        body = poll(b, f"topic=p1&topic=p2&since={cursor}&timeout=1")
        got += [m["data"] for m in body["messages"]]
        cursor = body["cursor"]
    assert sorted(got) == ["one", "two"]
    body = poll(a, f"topic=p1&topic=p2&since={cursor}&timeout=0")
    assert body["messages"] == [] and not body.get("gaps"), body


def test_kill9_of_a_node_clients_resume_on_another_with_nothing_lost(cluster):
    _, (a, b, c) = nodes(cluster, 3)
    clients = [ws_sub(a, "ticks") for _ in range(5)]
    received = [[] for _ in clients]
    stop = threading.Event()
    published = []

    def publisher():
        i = 0
        while not stop.is_set() and i < 400:
            published.append(c.publish("ticks", str(i))["id"])
            i += 1
            time.sleep(0.005)

    t = threading.Thread(target=publisher)
    t.start()
    time.sleep(0.5)
    for n, ws in enumerate(clients):
        received[n] += recv_messages(ws, 10)
    a.kill9()
    # Each client drains what reached it, then reconnects to b from its last id.
    for n, ws in enumerate(clients):
        try:
            while True:
                received[n].append(recv_json(ws, timeout=1))
        except Exception:
            pass
        ws.close()
    resumed = [ws_sub(b, "ticks", since=r[-1]["id"]) for r in received]
    t.join(30)
    stop.set()
    for n, ws in enumerate(resumed):
        missing = len(published) - len(received[n])
        received[n] += recv_messages(ws, missing, timeout=20)
        assert [m.get("type") for m in received[n]].count("gap") == 0
        assert [m["id"] for m in received[n]] == published, f"client {n}"
        ws.close()


def test_redis_restarted_without_persistence_gives_a_gap_with_the_new_epoch(cluster):
    redis, (a, b) = nodes(cluster, 2)
    ws = ws_sub(b, "r")
    old = a.publish("r", "before")["id"]
    assert recv_json(ws)["id"] == old
    redis.restart()
    b.wait_healthy(timeout=20)
    a.wait_healthy(timeout=20)
    new = wait_until(lambda: _try_publish(a, "r", "after"), 20, "publish after restart")
    assert new.split("-")[0] != old.split("-")[0] and new.endswith("-1")
    gap = recv_json(ws)
    assert gap["type"] == "gap" and gap["reason"] == "epoch" and gap["since"] == old
    assert recv_json(ws)["id"] == new
    # A resume from the old epoch on the other node is told, too.
    ws2 = ws_sub(a, "r", since=old)
    assert recv_json(ws2)["reason"] == "epoch"
    assert recv_json(ws2)["id"] == new
    ws.close()
    ws2.close()


def _try_publish(node, topic, data):
    status, _, body = node.request("POST", f"/publish/{topic}", data.encode())
    return json.loads(body)["id"] if status == 200 else None


def test_a_node_started_before_its_redis_waits_for_it(cluster):
    """Nodes and Redis may start in any order: a node whose Redis is not there yet starts,
    says so (healthz 503, publishes 503), and serves once Redis comes up."""
    redis = cluster.redis()
    redis.kill()
    node = cluster.node("--broker", redis.url, "--broker-timeout-ms", "500")
    assert node.healthz()[0] == 503
    assert node.request("POST", "/publish/early", b"x")[0] == 503
    assert "starting without it" in node.log_text()
    redis.start()
    node.wait_healthy(timeout=20)
    # The first subscription may still be refused for a moment (the pool waits 500 ms after a
    # failed connect before it tries again): a client retries, as the refusal's Retry-After says.
    ws = ws_sub_retrying(node, "early")
    wait_until(lambda: _try_publish(node, "early", "hello"), 20, "publish once Redis is up")
    got = recv_json(ws, timeout=10)
    assert got["data"] == "hello", got


def test_redis_down_publishes_503_connections_stay_and_the_node_recovers(cluster):
    redis, (a, b) = nodes(cluster, 2, "--broker-timeout-ms", "500")
    ws = ws_sub(b, "d")
    a.publish("d", "one")
    assert recv_json(ws)["data"] == "one"
    redis.kill()
    status, _, body = a.request("POST", "/publish/d", b"lost?")
    assert status == 503 and b"broker unavailable" in body, body
    wait_until(lambda: b.healthz()[0] == 503, 10, "healthz reports the broker")
    # New subscriptions to topics the node does not follow are refused clearly: 503 before
    # the upgrade, an error reply for an in-band subscribe (the connection stays).
    with pytest.raises(InvalidStatus) as refused:
        ws_sub(b, "other")
    assert refused.value.response.status_code == 503
    assert b"broker unavailable" in refused.value.response.body
    ws.send(json.dumps({"type": "subscribe", "topic": "other"}))
    err = recv_json(ws)
    assert err["type"] == "error" and "broker unavailable" in err["error"], err
    # An EventSource gives up for good on any status but 200: SSE gets a 200 stream that says
    # when to come back (retry:) and why, and ends, so the browser reconnects by itself.
    # The retry is 5 s with jitter (4 to 6 s), so the browsers turned away during an outage
    # do not all come back at once.
    retries = set()
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", b.port), timeout=10) as s:
            s.sendall(b"GET /sse?topic=other HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        assert b"event: unavailable" in answer, answer
        retry = int(answer.split(b"retry: ")[1].split(b"\n")[0])
        assert 4000 <= retry <= 6000, answer
        retries.add(retry)
    assert len(retries) > 1, retries
    assert b"broker unavailable" in answer
    redis.start()
    b.wait_healthy(timeout=20)
    wait_until(lambda: _try_publish(a, "d", "two"), 20, "publish after Redis is back")
    got = recv_json(ws, timeout=10)
    # Redis lost its data: the epoch changed, and the subscriber is told before "two".
    if got["type"] == "gap":
        got = recv_json(ws, timeout=10)
    assert got["data"] == "two"
    assert b.metrics()["clarion_broker_reconnects_total"] >= 1
    ws.close()


def test_a_stalled_redis_costs_a_publish_its_timeout_and_memory_stays_bounded(cluster):
    redis, (a,) = nodes(cluster, 1, "--broker-timeout-ms", "300")
    ws = ws_sub(a, "s")
    a.publish("s", "ok")
    assert recv_json(ws)["data"] == "ok"
    redis.pause()
    try:
        rss_before = a.metrics()["clarion_process_rss_bytes"]
        started = time.monotonic()
        statuses = [a.request("POST", "/publish/s", b"x" * 1000)[0] for _ in range(5)]
        assert set(statuses) == {503}
        assert time.monotonic() - started < 10
        wait_until(lambda: a.healthz()[0] == 503, 10, "stall detected")
        assert a.metrics()["clarion_process_rss_bytes"] < rss_before + 32 * 1024 * 1024
    finally:
        redis.resume()
    a.wait_healthy(timeout=20)
    wait_until(lambda: _try_publish(a, "s", "back"), 20, "publish after the stall")
    msgs = []
    while not msgs or msgs[-1].get("data") != "back":
        msgs.append(recv_json(ws, timeout=10))
    ws.close()


def test_a_node_hears_only_the_topics_it_has_subscribers_for(cluster):
    redis, (a, b) = nodes(cluster, 2)
    channel = _channel(redis, "lonely")
    assert _numsub(redis, channel) == 0
    ws = ws_sub(b, "lonely")
    a.publish("lonely", "x")
    assert recv_json(ws)["data"] == "x"
    assert _numsub(redis, channel) == 1, "only b subscribes"
    ws.close()
    wait_until(lambda: _numsub(redis, channel) == 0, 10, "b unsubscribes when its last leaves")


def _calls(redis, command):
    """How many times Redis ran `command` since its statistics were reset."""
    info = redis.command_reply("INFO", "commandstats")
    info = info.decode() if isinstance(info, bytes) else info
    for line in info.splitlines():
        if line.startswith(f"cmdstat_{command}:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def test_a_mass_disconnect_lets_go_of_topics_lazily_and_in_batches(cluster):
    # 2,000 topics lose their last subscriber at once: the node lets go of them after a short
    # linger, with one SUNSUBSCRIBE per partition and sweep instead of one per topic, and its
    # subscriber connection never looks stalled (no reconnect).
    redis, (a,) = nodes(cluster, 1)
    topics = [f"room{i}" for i in range(2000)]
    conns = [ws_sub(a, *topics[i : i + 50]) for i in range(0, len(topics), 50)]
    a.publish(topics[-1], "x")
    assert recv_json(conns[-1])["data"] == "x"
    redis.command_reply("CONFIG", "RESETSTAT")
    for ws in conns:
        ws.close()
    # Lazily: a subscriber back within the linger finds its topic still followed.
    back = ws_sub(a, topics[0])
    assert _numsub(redis, _channel(redis, topics[0])) == 1
    assert _calls(redis, "ssubscribe") == 0, "a topic within its linger is subscribed again"
    wait_until(
        lambda: len(redis.command_reply("PUBSUB", "SHARDCHANNELS")) == 1,
        15,
        "the node lets go of every empty topic",
    )
    unsubscribes = _calls(redis, "sunsubscribe")
    assert 0 < unsubscribes <= 3 * 64, f"{unsubscribes} SUNSUBSCRIBE commands for 1,999 topics"
    assert a.metrics()["clarion_broker_reconnects_total"] == 0
    # The topics let go of work as before: a new subscriber follows again.
    ws = ws_sub(a, topics[1])
    a.publish(topics[1], "again")
    assert recv_json(ws)["data"] == "again"
    ws.close()
    back.close()


def test_a_dropped_subscriber_connection_is_refilled_from_the_stream(cluster):
    redis, (a, b) = nodes(cluster, 2)
    ws = ws_sub(b, "h")
    ids = [a.publish("h", "0")["id"]]
    recv_messages(ws, 1)
    # Cut b's subscriber connection while messages keep coming: b reconnects, re-subscribes and
    # reads what it missed from the stream.
    redis.command_reply("CLIENT", "KILL", "TYPE", "pubsub")
    for i in range(1, 20):
        ids.append(a.publish("h", str(i))["id"])
    got = recv_messages(ws, 19, timeout=20)
    assert [m["id"] for m in got] == ids[1:]
    assert b.metrics()["clarion_broker_reconnects_total"] >= 1
    ws.close()


def _channel(redis, topic):
    # The channel of a topic is `clarion:{pN}:TOPIC`; find N the way the broker does (FNV-1a).
    h = 0x811C9DC5
    for byte in topic.encode():
        h ^= byte
        h = (h * 0x01000193) & 0xFFFFFFFF
    return f"clarion:{{p{h % 64}}}:{topic}"


def _numsub(redis, channel):
    reply = redis.command_reply("PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1])


# ------------------------------------------------------------------------------------------
# NATS: fan-out only; each node keeps its own ids and history (docs/cluster.md).


def nats_nodes(cluster, n, *extra):
    nats = cluster.nats()
    started = cluster.start_nodes(
        n, "--broker", nats.url, "--node-name", "n{i}", "--workers", "2", *extra
    )
    return nats, started


def test_nats_fans_out_to_every_node_and_subscribes_by_interest(cluster):
    nats, (a, b, c) = nats_nodes(cluster, 3)
    ws_b = ws_sub(b, "chat")
    sse_c = Sse(c, "chat")
    # Interest: only b and c hold a subscription for the topic's subject.
    wait_until(
        lambda: sorted(n for n, subs in nats.subjects().items() if subs) == ["n2", "n3"],
        10,
        "b and c subscribed at NATS",
    )
    ws_a = ws_sub(a, "chat")  # a's own subscriber gets a's publishes locally
    for i in range(20):
        a.publish("chat", f"m{i}")
    for ws in (ws_a, ws_b):
        assert [m["data"] for m in recv_messages(ws, 20)] == [f"m{i}" for i in range(20)]
    assert [sse_c.event()[2] for _ in range(20)] == [f"m{i}" for i in range(20)]
    ws_a.close()
    ws_b.close()
    sse_c.close()
    wait_until(lambda: not any(nats.subjects().get("n2", [])), 10, "b unsubscribed")


def test_nats_receipt_counts_this_nodes_subscribers_as_documented(cluster):
    # Core NATS does not say who received a message: the receipt's `subscribers` is the
    # publishing node's own (docs/cluster.md, "What a receipt's subscribers counts"), so 0 while
    # the only subscriber is on another node, which still gets the message.
    nats, (a, b) = nats_nodes(cluster, 2)
    ws_b = ws_sub(b, "receipt")
    wait_until(lambda: bool(nats.subjects().get("n2")), 10, "b subscribed at NATS")
    assert a.publish("receipt", "to b")["subscribers"] == 0
    assert [m["data"] for m in recv_messages(ws_b, 1)] == ["to b"]
    ws_a = ws_sub(a, "receipt")
    assert a.publish("receipt", "to both")["subscribers"] == 1
    ws_a.close()
    ws_b.close()
    doc = (ROOT / "docs" / "cluster.md").read_text()
    assert "What a receipt's `subscribers` counts" in doc
    # A clean shutdown is not a lost connection (issue 36: it used to warn on every stop).
    code, stderr = a.stop()
    assert code == 0 and "NATS connection lost" not in stderr and "WARN" not in stderr, stderr


def test_nats_resume_on_the_same_node_is_exact_and_on_another_says_epoch(cluster):
    _, (a, b) = nats_nodes(cluster, 2)
    # b only hears a topic while it has a subscriber to it: another one stays meanwhile.
    stays = ws_sub(b, "r")
    ws = ws_sub(b, "r")
    time.sleep(0.3)  # the subscription reaches NATS (core NATS does not confirm it)
    a.publish("r", "0")
    first = recv_json(ws)["id"]
    ws.close()
    a.publish("r", "1")
    time.sleep(0.3)
    ws = ws_sub(b, "r", since=first)
    assert recv_json(ws)["data"] == "1", "b's own history"
    ws.close()
    ws = ws_sub(a, "r", since=first)
    gap = recv_json(ws)
    assert gap["type"] == "gap" and gap["reason"] == "epoch"
    ws.close()
    stays.close()


def test_nats_down_publishes_503_and_the_node_recovers(cluster):
    nats, (a, b) = nats_nodes(cluster, 2)
    ws = ws_sub(b, "d")
    nats.kill()
    wait_until(lambda: a.healthz()[0] == 503, 15, "a notices NATS is gone")
    status, _, body = a.request("POST", "/publish/d", b"x")
    assert status == 503 and b"broker unavailable" in body, body
    nats.start()
    a.wait_healthy(timeout=20)
    b.wait_healthy(timeout=20)
    time.sleep(0.3)
    wait_until(lambda: _try_publish(a, "d", "back"), 20, "publish after NATS is back")
    assert recv_json(ws)["data"] == "back"
    ws.close()


def test_a_pushpin_format_publish_reaches_grip_holds_on_another_node(cluster, tmp_path):
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            body = b"start\n"
            self.send_response(200)
            self.send_header("Grip-Hold", "stream")
            prev = "; prev-id=p1" if self.path.startswith("/app/prev") else ""
            self.send_header("Grip-Channel", "g" + prev)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    backend.daemon_threads = True
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    try:
        routes = tmp_path / "routes"
        routes.write_text(f"*,path_beg=/app 127.0.0.1:{backend.server_address[1]}\n")
        _, (a, b) = nodes(cluster, 2, "--grip-routes", routes)
        host, port = b.clients.rsplit(":", 1)
        held = socket.create_connection((host, int(port)), timeout=10)
        held.sendall(b"GET /app/s HTTP/1.1\r\nHost: h\r\n\r\n")
        got = b""
        while b"start\n" not in got:
            got += held.recv(65536)
        wait_until(lambda: b.metrics().get("clarion_grip_held") == 1, 10, "held on b")
        items = {"items": [{"channel": "g", "id": "p1", "formats": {"http-stream": {"content": "one\n"}}}]}
        status, _, out = a.request("POST", "/publish/", json.dumps(items).encode(),
                                   {"Content-Type": "application/json"})
        assert status == 200, out
        while b"one\n" not in got:
            chunk = held.recv(65536)
            assert chunk, got
            got += chunk
        assert got.endswith(b"4\r\none\n\r\n"), got
        held.close()
        # prev-id across nodes: a hold after "p1" on b gets what a published after it.
        items["items"][0].update(id="p2", formats={"http-stream": {"content": "two\n"}})
        status, _, out = a.request("POST", "/publish/", json.dumps(items).encode(),
                                   {"Content-Type": "application/json"})
        assert status == 200, out
        again = socket.create_connection((host, int(port)), timeout=10)
        again.sendall(b"GET /app/prev HTTP/1.1\r\nHost: h\r\n\r\n")
        got = b""
        while b"two\n" not in got:
            chunk = again.recv(65536)
            assert chunk, got
            got += chunk
        assert b"one\n" not in got.split(b"start\n", 1)[1], got
        again.close()
    finally:
        backend.shutdown()
        backend.server_close()


def test_an_in_band_publish_gets_its_cluster_id_or_a_clear_error(cluster):
    redis, (a, b) = nodes(cluster, 2, "--allow-client-publish", "--broker-timeout-ms", "500")
    sub = ws_sub(b, "inband")
    pub = connect(
        f"ws://{a.clients}/ws", subprotocols=["clarion.v1"], open_timeout=10, legacy=True
    )
    pub.send(json.dumps({"type": "publish", "topic": "inband", "data": "hello"}))
    reply = recv_json(pub)
    assert reply["type"] == "published" and reply["id"].endswith("-1"), reply
    got = recv_json(sub)
    assert (got["id"], got["data"]) == (reply["id"], "hello")
    redis.kill()
    pub.send(json.dumps({"type": "publish", "topic": "inband", "data": "lost"}))
    err = recv_json(pub)
    assert err["type"] == "error" and "broker unavailable" in err["error"], err
    pub.close()
    sub.close()


def test_a_hole_history_cannot_fill_is_announced_live_then_delivery_goes_on(cluster):
    redis, (a, b) = nodes(cluster, 2, "--history-size", "0")
    ws = ws_sub(b, "nohist")
    sse = Sse(b, "nohist")
    first = a.publish("nohist", "0")["id"]
    assert recv_json(ws)["id"] == first
    assert sse.event()[0] == first
    redis.command_reply("CLIENT", "KILL", "TYPE", "pubsub")
    missed = [a.publish("nohist", str(i))["id"] for i in range(1, 6)]
    wait_until(lambda: b.metrics()["clarion_broker_live_gaps_total"] >= 1, 15, "the gap found")
    after = a.publish("nohist", "after")["id"]
    gap = recv_json(ws)
    assert gap == {"type": "gap", "topic": "nohist", "since": first, "reason": "trimmed"}
    assert recv_json(ws)["id"] == after
    # SSE: an event named gap, without an id (Last-Event-ID stays on the last message).
    eid, event, data = sse.event()
    assert (eid, event, json.loads(data)["reason"]) == (None, "gap", "trimmed")
    assert sse.event()[0] == after
    assert int(after.split("-")[1]) == int(missed[-1].split("-")[1]) + 1
    ws.close()
    sse.close()


def test_topics_spread_over_several_redis_servers(cluster):
    r1, r2 = cluster.redis(), cluster.redis()
    url = f"{r1.url},{r2.url}"
    a, b = cluster.start_nodes(2, "--broker", url, "--node-name", "n{i}")
    topics = [f"room{i}" for i in range(16)]
    subs = {t: ws_sub(b, t) for t in topics}
    for t in topics:
        a.publish(t, f"to {t}")
    for t, ws in subs.items():
        assert recv_json(ws)["data"] == f"to {t}"
    held = [len(r.command_reply("KEYS", "clarion:*")) for r in (r1, r2)]
    assert all(n > 0 for n in held) and sum(held) == 2 * len(topics), held
    # One Redis down: its topics answer 503, the other's keep working.
    r2.kill()
    answers = {t: a.request("POST", f"/publish/{t}", b"x")[0] for t in topics}
    assert set(answers.values()) == {200, 503}, answers
    for t, status in answers.items():
        if status == 200:
            assert recv_json(subs[t])["data"] == "x"
    for ws in subs.values():
        ws.close()
