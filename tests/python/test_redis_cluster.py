"""Redis Cluster (docs/cluster.md, "Redis Cluster"): nodes given
`redis+cluster://seed1,seed2` find the masters serving each topic partition's slot, subscribe
(SSUBSCRIBE) on the master that serves it, and follow a `kill -9` of a master (its topics
publish again once the replica is promoted, with one epoch gap notice; the other masters'
topics never notice) and a resharding under load (nothing lost, no gap notice, same epoch).
A cluster URL at a standalone Redis, or a plain URL at a cluster node, stops startup with a
clear error.

The set-up: six `redis-server --cluster-enabled yes` on free loopback ports (three masters,
three replicas, made with `redis-cli --cluster create`), `cluster-node-timeout` 1000 ms and
`cluster-require-full-coverage no` (so a master's failure does not stop the others' slots),
`cluster-replica-validity-factor 0` (a replica always takes over, however fresh the cluster)."""

import json
import shutil
import subprocess
import threading
import time

import pytest

from cluster_util import (  # noqa: F401 (fixture)
    Redis,
    RedisError,
    cluster,
    free_port,
    missing_service,
    wait_until,
)
from test_cluster import _channel, recv_json, recv_messages, ws_sub

pytestmark = pytest.mark.timeout(120)

REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


class ClusterRedis(Redis):
    """One redis-server in cluster mode (its nodes.conf in its own directory)."""

    name = "redis-cluster-node"

    def __init__(self, workdir):
        self.bus_port = free_port()
        super().__init__(workdir)

    def command(self):
        return super().command() + [
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.dir / "nodes.conf"),
            "--cluster-node-timeout", "1000",
            "--cluster-require-full-coverage", "no",
            "--cluster-replica-validity-factor", "0",
            # The bus port is otherwise port + 10000, which may be taken (or ephemeral).
            "--cluster-port", str(self.bus_port),
        ]  # fmt: skip

    def linked(self):
        """A master with its replica attached, or a replica in sync with its master."""
        text = self.command_reply("INFO", "replication").decode()
        return "connected_slaves:1" in text or "master_link_status:up" in text

    def cluster_info(self):
        text = self.command_reply("CLUSTER", "INFO").decode()
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def role(self):
        try:
            return self.command_reply("ROLE", timeout=1.0)[0].decode()
        except (OSError, RedisError):
            return ""

    def node_id(self):
        return self.command_reply("CLUSTER", "MYID").decode()


class RedisCluster:
    """Six cluster nodes made into three masters with a replica each."""

    def __init__(self, c):
        self.nodes = []
        for _ in range(6):
            self.nodes.append(ClusterRedis(c.dir))
            c.brokers.append(self.nodes[-1])  # killed at the end even if a later one fails
        out = subprocess.run(
            [REDIS_CLI, "--cluster", "create",
             *[f"127.0.0.1:{n.port}" for n in self.nodes],
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        wait_until(self.ok, 20, "cluster_state:ok on every node", 0.1)
        wait_until(lambda: all(n.linked() for n in self.nodes), 20, "replicas in sync", 0.1)

    def ok(self):
        try:
            return all(
                n.cluster_info().get("cluster_state") == "ok" for n in self.nodes if n.running
            )
        except (OSError, RedisError):
            return False

    def url(self, n=2):
        return "redis+cluster://" + ",".join(f"127.0.0.1:{x.port}" for x in self.nodes[:n])

    def masters(self):
        return [n for n in self.nodes if n.running and n.role() == "master"]

    def owner(self, topic):
        """The running master serving `topic`'s slot, asked of the cluster itself."""
        return self.owner_of_key(_channel(None, topic))

    def owner_of_key(self, key):
        any_node = next(n for n in self.nodes if n.running)
        slot = any_node.command_reply("CLUSTER", "KEYSLOT", key)
        for m in self.masters():
            for r in m.command_reply("CLUSTER", "SLOTS"):
                if r[0] <= slot <= r[1] and r[2][1] == m.port:
                    return m
        return None

    def topics_per_master(self, per=2, prefix="t"):
        """`per` topic names served by each master: {master port: [topics]}."""
        out = {m.port: [] for m in self.masters()}
        i = 0
        while any(len(v) < per for v in out.values()):
            t = f"{prefix}{i}"
            i += 1
            port = self.owner(t).port
            if len(out[port]) < per:
                out[port].append(t)
            assert i < 2000
        return out


def _numsub(node, channel):
    return int(node.command_reply("PUBSUB", "SHARDNUMSUB", channel)[1])


@pytest.fixture
def rc(cluster):
    if not shutil.which("redis-cli"):
        missing_service("redis-cli")
    return RedisCluster(cluster)


def test_topics_spread_over_every_master_deliver_across_nodes_and_resume_exactly(cluster, rc):
    a, b = cluster.start_nodes(2, "--broker", rc.url(), "--node-name", "n{i}")
    by_master = rc.topics_per_master(2)
    topics = [t for ts in by_master.values() for t in ts]
    subs = {t: ws_sub(b, t) for t in topics}
    ids = {t: [a.publish(t, f"{t}-{k}")["id"] for k in range(3)] for t in topics}
    for t, ws in subs.items():
        got = recv_messages(ws, 3)
        assert [m["id"] for m in got] == ids[t]
        assert [m["data"] for m in got] == [f"{t}-{k}" for k in range(3)]
    # Each master holds its own topics' subscriptions (node b's), none of the others'.
    for m in rc.masters():
        for port, ts in by_master.items():
            want = 1 if port == m.port else 0
            for t in ts:
                assert _numsub(m, _channel(None, t)) == want, (m.port, t)
        # And the keys: the topic's metadata is on the master serving it.
        for t in by_master[m.port]:
            assert m.command_reply("EXISTS", _channel(None, t).replace("}:", "}:m:", 1)) == 1
    # Resume on the other node from the first id: exactly the rest.
    for t in topics:
        again = ws_sub(a, t, since=ids[t][0])
        assert [m["id"] for m in recv_messages(again, 2)] == ids[t][1:]
        again.close()
    for ws in subs.values():
        ws.close()
    for n in (a, b):
        assert n.healthz()[0] == 200


class Loop(threading.Thread):
    """Publishes to `topics` in turn on `node` until stopped (bounded in time); records, per
    topic, each answer's status and the ids handed out, and when each status came."""

    def __init__(self, node, topics, limit=60):
        super().__init__(daemon=True)
        self.node, self.topics, self.limit = node, topics, limit
        self.ids = {t: [] for t in topics}
        self.failed = {t: [] for t in topics}
        self.stop = threading.Event()

    def run(self):
        t0, n = time.monotonic(), 0
        while not self.stop.is_set() and time.monotonic() - t0 < self.limit:
            for t in self.topics:
                n += 1
                status, _, body = self.node.request("POST", f"/publish/{t}", f"m{n}".encode())
                if status == 200:
                    self.ids[t].append((time.monotonic(), json.loads(body)["id"]))
                else:
                    self.failed[t].append((time.monotonic(), status))
            time.sleep(0.01)


def _drain(ws, until_id, timeout=20):
    """Messages from `ws` up to and including the one with `until_id`."""
    out = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"{until_id} never arrived: {out[-3:]}"
        m = recv_json(ws, timeout=left)
        out.append(m)
        if m.get("id") == until_id:
            return out


def _check_stream(published, got, gaps_allowed):
    """Every published id exactly once, in order, except what a gap notice announced (at most
    `gaps_allowed` of them, each an epoch change); nothing twice."""
    ids = [m["id"] for m in got if m.get("type") != "gap"]
    gaps = [m for m in got if m.get("type") == "gap"]
    assert len(ids) == len(set(ids)), f"delivered twice: {ids}"
    assert len(gaps) <= gaps_allowed, gaps
    for g in gaps:
        assert g["reason"] == "epoch", g
    if not gaps:
        assert ids == published, (ids, published)
    else:
        # Before the notice: a prefix of what was published; after it: the rest, exactly.
        cut = got.index(gaps[0])
        before = [m["id"] for m in got[:cut]]
        after = [m["id"] for m in got[cut + 1 :]]
        assert before == published[: len(before)]
        assert after == published[published.index(after[0]) :], (after, published)
    return gaps


def test_appendable_messages_on_every_master_cross_nodes_resume_and_time_out(cluster, rc):
    """docs/cluster.md, "Appendable messages": the stream script's keys share the topic's slot,
    so it runs on whichever master serves the topic; the timeout sweep reaches every master."""
    a, b = cluster.start_nodes(
        2, "--broker", rc.url(), "--node-name", "n{i}", "--stream-timeout", "2"
    )
    topics = [ts[0] for ts in rc.topics_per_master(1, prefix="s").values()]
    subs = {t: ws_sub(b, t) for t in topics}
    for t in topics:
        sid = _fragment(a, t, "stream=open", "Hel")["stream"]
        _fragment(b, t, f"append_to={sid}", "lo")
        _fragment(a, t, f"append_to={sid}&done=1", "!")
        got = [recv_json(subs[t]) for _ in range(3)]
        assert [(m["seq"], m["data"]) for m in got] == [(1, "Hel"), (2, "lo"), (3, "!")], got
        again = ws_sub(a, t, since=sid)
        folded = recv_json(again)
        assert (folded["type"], folded["data"], folded["done"]) == ("message", "Hello!", True)
        again.close()
        # One left open is closed by the sweep, on this topic's master.
        idle = _fragment(b, t, "stream=open", "idle")["stream"]
        assert recv_json(subs[t])["stream"] == idle
        closing = recv_json(subs[t], timeout=10)
        assert (closing["stream"], closing["reason"]) == (idle, "timeout"), closing
    for ws in subs.values():
        ws.close()


def _fragment(node, topic, query, body):
    status, _, out = node.request(
        "POST", f"/publish/{topic}?{query}", body.encode(), {"Content-Type": "text/plain"}
    )
    assert status == 200, out
    return json.loads(out)


def test_a_killed_master_s_topics_recover_after_promotion_and_the_others_never_notice(
    cluster, rc
):
    a, b = cluster.start_nodes(2, "--broker", rc.url(), "--node-name", "n{i}")
    by_master = rc.topics_per_master(2)
    victim = rc.nodes[0] if rc.nodes[0].port in by_master else rc.masters()[0]
    topics = [t for ts in by_master.values() for t in ts]
    subs = {t: (ws_sub(a, t), ws_sub(b, t)) for t in topics}
    loop = Loop(a, topics)
    loop.start()
    wait_until(lambda: all(len(v) >= 5 for v in loop.ids.values()), 15, "publishing")
    killed_at = time.monotonic()
    victim.kill()
    hit = by_master[victim.port]
    # Its topics publish again once its replica is promoted.
    wait_until(
        lambda: all(any(at > killed_at for at, _ in loop.ids[t]) for t in hit),
        30,
        "the killed master's topics publishing again",
        0.05,
    )
    recovered = max(min(at for at, _ in loop.ids[t] if at > killed_at) for t in hit)
    time.sleep(0.5)
    loop.stop.set()
    loop.join(10)
    took = recovered - killed_at
    print(f"\nkill -9 of master {victim.port}: its topics published again after {took:.2f} s")
    assert took < 15
    assert len(rc.masters()) == 3
    for t in topics:
        published = [i for _, i in loop.ids[t]]
        assert len(published) == len(set(published)), f"an id handed out twice on {t}"
        for ws in subs[t]:
            got = _drain(ws, published[-1])
            if t in hit:
                gaps = _check_stream(published, got, 1)
                assert len(gaps) == 1, f"{t}: no epoch notice after the failover"
            else:
                _check_stream(published, got, 0)
                assert not loop.failed[t], f"{t} (another master) failed: {loop.failed[t]}"
    for n in (a, b):
        n.wait_healthy(10)


def test_resharding_under_load_loses_nothing_and_keeps_the_epoch(cluster, rc):
    a, b = cluster.start_nodes(2, "--broker", rc.url(), "--node-name", "n{i}")
    by_master = rc.topics_per_master(3)
    source, target = rc.masters()[:2]
    moving = by_master[source.port]
    topics = [t for ts in by_master.values() for t in ts]
    subs = {t: (ws_sub(a, t), ws_sub(b, t)) for t in topics}
    loop = Loop(a, topics)
    loop.start()
    wait_until(lambda: all(len(v) >= 3 for v in loop.ids.values()), 15, "publishing")
    out = subprocess.run(
        [REDIS_CLI, "--cluster", "reshard", f"127.0.0.1:{source.port}",
         "--cluster-from", source.node_id(), "--cluster-to", target.node_id(),
         "--cluster-slots", "5461", "--cluster-yes"],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    n_after = {t: len(loop.ids[t]) for t in topics}
    wait_until(
        lambda: all(len(loop.ids[t]) >= n_after[t] + 5 for t in topics), 15, "publishing after"
    )
    loop.stop.set()
    loop.join(10)
    for t in moving:
        assert rc.owner(t).port == target.port, f"{t} did not move"
    # Each node moves its subscription when Redis tells it the slot moved (asynchronously:
    # under load it may land after the publishing loop's last messages).
    wait_until(lambda: _numsub(target, _channel(None, moving[0])) == 2, 30, "subscriptions moved")
    assert _numsub(source, _channel(None, moving[0])) == 0
    failed = {t: f for t, f in loop.failed.items() if f}
    assert not failed, f"publishes failed during the resharding: {failed}"
    for t in topics:
        published = [i for _, i in loop.ids[t]]
        assert len({i.rsplit("-", 1)[0] for i in published}) == 1, f"{t} changed epoch"
        for ws in subs[t]:
            _check_stream(published, _drain(ws, published[-1]), 0)
    print(f"\nresharded 5461 slots under load: {sum(len(v) for v in loop.ids.values())} publishes")


def test_a_cluster_url_at_a_standalone_redis_and_the_reverse_stop_startup_clearly(cluster, rc):
    plain = cluster.redis()
    with pytest.raises(RuntimeError) as e:
        cluster.node("--broker", f"redis+cluster://127.0.0.1:{plain.port}", "--node-name", "x")
    assert "not a Redis Cluster node" in str(e.value), str(e.value)
    with pytest.raises(RuntimeError) as e:
        cluster.node("--broker", f"redis://127.0.0.1:{rc.nodes[0].port}", "--node-name", "y")
    assert "is a Redis Cluster node; use redis+cluster://" in str(e.value), str(e.value)
    with pytest.raises(RuntimeError) as e:
        cluster.node("--broker", f"{rc.url()}/2", "--node-name", "z")
    assert "only database 0" in str(e.value), str(e.value)
    with pytest.raises(RuntimeError) as e:
        cluster.node("--broker", f"{rc.url()},{plain.url}", "--node-name", "w")
    assert "must be the only broker URL" in str(e.value), str(e.value)


def test_presence_and_webhook_occupancy_work_on_the_cluster(cluster, rc):
    """Presence's scripts and per-node keys, and the webhooks' occupancy script, each touch
    one slot only, so they run on a Redis Cluster: one membership across nodes for rooms on
    different masters, liveness keys where partition 0 lives, one `topic_vacated`."""
    import asyncio

    from test_hooks import SECRET as HOOK_SECRET, Receiver
    from test_presence import API_KEY, KEYED, SECRET, member_event, members, next_json, ws
    r = Receiver(secret=HOOK_SECRET)
    a, b = cluster.start_nodes(
        2, "--broker", rc.url(), "--node-name", "n{i}", "--auth-secret", SECRET,
        "--api-key", API_KEY, "--presence-topics", "room.*", "--webhook-url", r.url,
        "--hook-secret", HOOK_SECRET, "--webhook-batch-ms", "20",
    )  # fmt: skip
    rooms = [ts[0] for ts in rc.topics_per_master(1, prefix="room.").values()]

    def listing(node, topic):
        status, _, body = node.request("GET", f"/topics/{topic}/presence", headers=KEYED)
        assert status == 200, body
        return json.loads(body)

    def count(ev, kind):
        return sum(e["type"] == kind and e["topic"] == "shared" for e in ev)

    async def run():
        for room in rooms:
            async with ws(a, "watcher", topic=room) as w:
                await next_json(w, "presence")
                async with ws(b, "zoe", topic=room, presence=False):
                    await member_event(w, "join", "zoe")
                    got = wait_until(
                        lambda: (x := listing(b, room))["connections"] == 2 and x,
                        what=f"zoe counted in {room}",
                    )
                    assert members(got) == ["watcher", "zoe"]
                await member_event(w, "leave", "zoe")
        wa = await ws(a, "u1", topic="shared", presence=False, topics=("shared",))
        r.wait_for(lambda ev: count(ev, "topic_occupied") == 1)
        wb = await ws(b, "u2", topic="shared", presence=False, topics=("shared",))
        await asyncio.sleep(0.5)
        await wa.close()
        await asyncio.sleep(0.5)
        assert count(r.delivered(), "topic_vacated") == 0, "b still holds the topic"
        await wb.close()
        r.wait_for(lambda ev: count(ev, "topic_vacated") == 1)

    asyncio.run(run())
    ev = r.delivered()
    assert count(ev, "topic_occupied") == 1 and count(ev, "topic_vacated") == 1
    r.close()
    # The per-node keys: on the master serving partition 0.
    p0 = rc.owner_of_key("{p0}")
    for n in ("n1", "n2"):
        assert p0.command_reply("EXISTS", f"clarion:{{p0}}:presence:alive:{n}") == 1


# --------------------------------------------------------------------------------------------
# rediss+cluster://: a TLS-only cluster (managed services' usual shape)


class TlsClusterRedis(ClusterRedis):
    """A cluster node with no plaintext port: clients, the cluster bus and replication all over
    TLS, with a certificate for 127.0.0.1 (the address the nodes announce)."""

    def __init__(self, workdir, pki):
        self.pki = pki
        super().__init__(workdir)

    def command(self):
        cert, key = self.pki.server
        client_cert, client_key = self.pki.client
        return [
            *super().command(),
            # The cluster bus always asks the connecting node for a certificate.
            "--tls-client-cert-file", str(client_cert),
            "--tls-client-key-file", str(client_key),
            "--port", "0",
            "--tls-port", str(self.port),
            "--tls-cert-file", str(cert),
            "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(self.pki.ca),
            "--tls-auth-clients", "no",
            "--tls-cluster", "yes",
            "--tls-replication", "yes",
        ]  # fmt: skip

    def _connect(self, timeout):
        import ssl

        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        return ctx.wrap_socket(super()._connect(timeout), server_hostname="127.0.0.1")


def test_a_tls_only_cluster_over_rediss_cluster_urls(cluster, tmp_path):
    # rediss+cluster:// with the test CA: topics on every master, delivery across nodes and an
    # exact resume, every connection (seeds, masters found by CLUSTER SLOTS, subscribers) over
    # TLS; without the CA, the node refuses the cluster's certificates and says so.
    if not shutil.which("redis-cli"):
        missing_service("redis-cli")
    from test_redis_tls import make_pki

    pki = make_pki(tmp_path)
    nodes = []
    for _ in range(6):
        nodes.append(TlsClusterRedis(cluster.dir, pki))
        cluster.brokers.append(nodes[-1])
    out = subprocess.run(
        [REDIS_CLI, "--tls", "--cacert", str(pki.ca), "--cluster", "create",
         *[f"127.0.0.1:{n.port}" for n in nodes], "--cluster-replicas", "1", "--cluster-yes"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    rc = RedisCluster.__new__(RedisCluster)
    rc.nodes = nodes
    wait_until(rc.ok, 20, "cluster_state:ok on every node", 0.1)
    wait_until(lambda: all(n.linked() for n in nodes), 20, "replicas in sync", 0.1)
    url = "rediss+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes[:2])
    a, b = cluster.start_nodes(
        2, "--broker", url, "--redis-tls-ca", pki.ca, "--node-name", "n{i}"
    )
    by_master = rc.topics_per_master(1)
    assert len(by_master) == 3
    topics = [t for ts in by_master.values() for t in ts]
    subs = {t: ws_sub(b, t) for t in topics}
    ids = {t: [a.publish(t, f"{t}-{k}")["id"] for k in range(3)] for t in topics}
    for t, ws in subs.items():
        assert [m["id"] for m in recv_messages(ws, 3)] == ids[t]
        ws.close()
    for t in topics:
        again = ws_sub(a, t, since=ids[t][0])
        assert [m["id"] for m in recv_messages(again, 2)] == ids[t][1:]
        again.close()
    # The same cluster without the CA: no certificate is trusted, and the log says so.
    bare = cluster.node("--broker", url, "--node-name", "bare", name="bare")
    wait_until(lambda: "TLS" in bare.log_text(), 15, "a TLS failure in the log")
    assert bare.healthz()[0] == 503
