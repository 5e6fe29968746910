"""deploy/compose/: no container engine runs here, so the topology runs for real without one:
Debian's haproxy with the SAME haproxy.cfg, in front of three `clarion serve` processes given
the environment compose.yaml gives its nodes, and a redis-server, all on loopback. A publish
through one node reaches clients connected through the balancer (WebSocket and SSE); a node
killed with its clients on it, and another drained with SIGTERM: each client comes back
through the balancer to a node that is up and resumes exactly (every message once, in order).

compose.sentinel.yaml's Redis side runs as written too: the primary and the replica with
their services' arguments, three sentinels with the configuration lines their command writes
(names mapped to loopback ports); two nodes with that file's broker URL find the primary
through them and deliver a publish.

Both Compose files are checked as Compose would read them (YAML, anchors merged): the
services, every image pinned by a tag, healthchecks, the nodes' settings, the balancer's
environment covering every variable haproxy.cfg names."""

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time

import pytest
import yaml
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from cluster_util import (  # noqa: F401  (cluster: the fixture)
    REDIS,
    Broker,
    Redis,
    cluster,
    free_port,
    missing_service,
    wait_until,
)
from conftest import ROOT

pytestmark = pytest.mark.timeout(120)

COMPOSE = ROOT / "deploy" / "compose"
HAPROXY_CFG = COMPOSE / "haproxy.cfg"
KEY = "compose-test-key"
NODES = ("clarion-1", "clarion-2", "clarion-3")


def load(name):
    return yaml.safe_load((COMPOSE / name).read_text())


def interpolate(value, env):
    """Compose's variable syntax: ${A}, ${A:-default}, ${A:?error} and $$ for a dollar."""

    def one(m):
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op == ":-":
            return arg
        if op == ":?":
            raise KeyError(f"{name}: {arg}")
        return ""

    text = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:[-?])([^}]*))?\}", one, str(value))
    return text.replace("$$", "$")


def version():
    out = subprocess.run([str(ROOT / "packaging" / "version.sh")], capture_output=True, text=True)
    return out.stdout.strip()


def cfg_variables():
    return set(re.findall(r"\$\{([A-Z0-9_]+)\}", HAPROXY_CFG.read_text()))


# --------------------------------------------------------------------------------------------
# The files, as Compose reads them


@pytest.mark.parametrize("name", ["compose.yaml", "compose.sentinel.yaml"])
def test_the_compose_files_pin_images_check_health_and_configure_every_node(name):
    doc = load(name)
    services = doc["services"]
    assert set(NODES) | {"haproxy"} <= set(services)
    for svc_name, svc in services.items():
        image = interpolate(svc["image"], {})
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and re.match(r"\d+\.\d+\.\d+", tag), (
            f"{svc_name}: {image} is not pinned to a version tag"
        )
        if svc_name not in NODES:
            assert svc["healthcheck"]["test"][0] == "CMD", f"{svc_name} has no healthcheck"
            assert svc.get("restart") == "unless-stopped", svc_name
    assert interpolate(services["clarion-1"]["image"], {}) == f"localhost/clarion:{version()}", (
        "the default image is the one packaging/container/build.sh makes of this version"
    )
    names, brokers = set(), set()
    for n in NODES:
        svc = services[n]
        env = svc["environment"]
        names.add(env["CLARION_NODE_NAME"])
        brokers.add(env["CLARION_BROKER"])
        with pytest.raises(KeyError):
            interpolate(env["CLARION_API_KEY"], {})  # compose refuses to start without a key
        grace = int(svc["stop_grace_period"].rstrip("s"))
        drain = int(env["CLARION_DRAIN_PERIOD"]) + int(env["CLARION_SHUTDOWN_TIMEOUT"])
        assert grace > drain, f"{n}: stop_grace_period {grace} s must exceed the drain {drain} s"
        assert env["CLARION_MAX_CONNECTIONS_PER_ADDRESS"] == "0", "all come from the balancer"
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"]
        assert svc["ulimits"]["nofile"]["soft"] >= 1 << 20
        assert "healthcheck" not in svc, "the image has no client to run one: HAProxy checks"
        for dep, cond in svc["depends_on"].items():
            assert dep in services and cond["condition"] == "service_healthy"
    assert names == set(NODES), "one node name each"
    (broker,) = brokers
    hosts = re.sub(r"^[a-z+]+://", "", broker).split("/")[0].split(",")
    for host in hosts:
        assert host.split(":")[0] in services, f"the broker names {host}, not a service"
    hap = services["haproxy"]
    env = hap["environment"]
    assert cfg_variables() == set(env), "the balancer gets exactly what haproxy.cfg names"
    for i, n in enumerate(NODES, 1):
        assert env[f"NODE{i}_HOST"] == n
        assert env[f"NODE{i}_PORT"] == "8080" and env[f"NODE{i}_API_PORT"] == "8081"
    assert "./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in hap["volumes"]
    assert "127.0.0.1:8081:8081" in hap["ports"], "the publish API on the host's loopback only"
    assert not any(svc.get("ports") for n, svc in services.items() if n != "haproxy")


def test_the_sentinel_file_differs_from_the_plain_one_only_in_its_broker():
    plain, sentinel = load("compose.yaml")["services"], load("compose.sentinel.yaml")["services"]
    for n in NODES:
        a, b = dict(plain[n]), dict(sentinel[n])
        a_env, b_env = dict(a.pop("environment")), dict(b.pop("environment"))
        a.pop("depends_on"), b.pop("depends_on")
        assert a == b, n
        assert a_env.pop("CLARION_BROKER") == "redis://redis:6379"
        assert b_env.pop("CLARION_BROKER").startswith("redis+sentinel://")
        assert a_env == b_env, n
    assert plain["haproxy"] == sentinel["haproxy"]
    conf = sentinel["sentinel-1"]["command"][2]
    assert "sentinel monitor clarion redis-primary 6379 2" in conf, "quorum 2 of 3, the master"
    replica = sentinel["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1] == "redis-primary"


# --------------------------------------------------------------------------------------------
# The topology, on loopback


def haproxy_binary():
    path = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.access(path, os.X_OK):
        missing_service("haproxy")
    return path


class Balancer:
    """haproxy -db with deploy/compose/haproxy.cfg and the given variables."""

    def __init__(self, workdir, env):
        self.log = pathlib.Path(workdir) / "haproxy.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [haproxy_binary(), "-db", "-f", str(HAPROXY_CFG)],
                env={"PATH": os.environ.get("PATH", ""), **env},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def node_env(service, redis):
    """The environment compose.yaml gives a node, its hosts mapped to loopback."""
    env = {k: interpolate(v, {"CLARION_API_KEY": KEY}) for k, v in service["environment"].items()}
    env["CLARION_BROKER"] = env["CLARION_BROKER"].replace("redis:6379", f"127.0.0.1:{redis.port}")
    # The drain of this test's SIGTERM: short, the grace arithmetic is checked above.
    env["CLARION_DRAIN_PERIOD"] = "1"
    env["CLARION_SHUTDOWN_TIMEOUT"] = "5"
    return env


@pytest.fixture
def topology(cluster, tmp_path):
    compose = load("compose.yaml")["services"]
    redis = cluster.redis()
    nodes = []
    for n in NODES:
        node = cluster.node(env=node_env(compose[n], redis), name=n)
        nodes.append(node)
    lb_port, lb_api, lb_health = free_port(), free_port(), free_port()
    env = {
        "LB_BIND": f"127.0.0.1:{lb_port}",
        "LB_API_BIND": f"127.0.0.1:{lb_api}",
        "LB_HEALTH_BIND": f"127.0.0.1:{lb_health}",
        "LB_MAXCONN": "1000",
    }
    for i, node in enumerate(nodes, 1):
        env[f"NODE{i}_HOST"] = "127.0.0.1"
        env[f"NODE{i}_PORT"] = str(node.client_port)
        env[f"NODE{i}_API_PORT"] = str(node.api_port)
    lb = Balancer(tmp_path, env)
    try:
        wait_until(lambda: http_status(lb_health, "/healthz") == 200, 10, "haproxy up")
        # Every node checked up (rise 2 at 2 s) before clients come.
        wait_until(lambda: http_status(lb_api, "/healthz") == 200, 10, "a node through the LB")
        yield redis, nodes, lb, lb_port, lb_api
    finally:
        lb.stop()


def http_status(port, path, method="GET", body=b"", headers=""):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(
                f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                f"Content-Length: {len(body)}\r\n{headers}\r\n".encode() + body
            )
            head = s.recv(4096)
    except OSError:
        return None
    m = re.match(rb"HTTP/1\.[01] (\d+)", head)
    return int(m.group(1)) if m else None


def publish(node, topic, data):
    out = node.publish(topic, data, headers={"Authorization": f"Bearer {KEY}"})
    return out["id"]


class Sse:
    """An SSE stream through the balancer, that reconnects (with Last-Event-ID) when its
    node goes away, as an EventSource does."""

    def __init__(self, port, topic):
        self.port, self.topic, self.last, self.sock, self.buf = port, topic, None, None, b""
        self.reconnects = 0
        self.open()

    def open(self):
        extra = f"Last-Event-ID: {self.last}\r\n" if self.last else ""
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        self.sock.sendall(
            f"GET /sse?topic={self.topic} HTTP/1.1\r\nHost: x\r\n"
            f"Accept: text/event-stream\r\n{extra}\r\n".encode()
        )
        self.buf = b""
        head = self._until(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise ConnectionError(head[:200])

    def _until(self, marker):
        while marker not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        part, self.buf = self.buf.split(marker, 1)
        return part

    def event(self, deadline):
        """(id, data) of the next message, reconnecting as often as it takes."""
        while True:
            assert time.monotonic() < deadline, "no SSE event in time"
            try:
                block = self._until(b"\n\n").decode()
            except OSError:
                self.sock.close()
                self.reconnects += 1
                self._reopen(deadline)
                continue
            fields = {}
            for line in block.split("\n"):
                if line.startswith(":") or ":" not in line:
                    continue
                k, v = line.split(":", 1)
                fields[k] = v[1:] if v.startswith(" ") else v
            if "data" in fields and fields.get("id"):
                self.last = fields["id"]
                return fields["id"], fields["data"]

    def _reopen(self, deadline):
        while True:
            try:
                return self.open()
            except OSError:
                assert time.monotonic() < deadline, "the SSE client found no node"
                time.sleep(0.2)


class Ws:
    """A clarion.v1 WebSocket through the balancer that resumes with since= when closed."""

    def __init__(self, port, topic):
        self.port, self.topic, self.last, self.ws, self.reconnects = port, topic, None, None, 0
        self.closes = []
        self.open()

    def open(self):
        url = f"ws://127.0.0.1:{self.port}/ws?topic={self.topic}"
        if self.last:
            url += f"&since={self.last}"
        self.ws = connect(url, subprotocols=["clarion.v1"], open_timeout=5, legacy=True)

    def message(self, deadline):
        while True:
            assert time.monotonic() < deadline, "no WebSocket message in time"
            try:
                m = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            except ConnectionClosed as e:
                self.closes.append(e.rcvd.code if e.rcvd else None)
                self.reconnects += 1
                while True:
                    try:
                        self.open()
                        break
                    except (OSError, Exception) as err:  # refused, 503 while HAProxy learns
                        assert time.monotonic() < deadline, f"no node took the client: {err}"
                        time.sleep(0.2)
                continue
            if "id" in m and "data" in m:
                self.last = m["id"]
                return m["id"], m["data"]
            assert m.get("type") != "gap", m

    def close(self):
        self.ws.close()


def holder(nodes, transport):
    """The node holding a connection of `transport` now."""
    for node in nodes:
        if node.running and node.metrics().get(f'clarion_connections{{transport="{transport}"}}'):
            return node
    return None


def expect(client, ids, deadline):
    got = []
    while len(got) < len(ids):
        got.append(client.message(deadline) if isinstance(client, Ws) else client.event(deadline))
    assert [i for i, _ in got] == ids, "every message once, in order"
    return got


def test_clients_through_haproxy_get_publishes_from_any_node_and_resume_on_another(topology):
    redis, nodes, lb, lb_port, lb_api = topology
    ws, sse = Ws(lb_port, "news"), Sse(lb_port, "news")
    wait_until(lambda: holder(nodes, "ws") and holder(nodes, "sse"), 10, "clients on nodes")
    ws_node, sse_node = holder(nodes, "ws"), holder(nodes, "sse")
    deadline = time.monotonic() + 60
    ids = [publish(nodes[0], "news", f"m{i}") for i in range(5)]
    assert [d for _, d in expect(ws, ids, deadline)] == [f"m{i}" for i in range(5)]
    expect(sse, ids, deadline)
    # Through the balancer's API too, with the key (and refused without it).
    assert http_status(lb_api, "/publish/news", "POST", b"x") == 401
    status = http_status(
        lb_api, "/publish/news", "POST", b"via-lb", f"Authorization: Bearer {KEY}\r\n"
    )
    assert status == 200
    ids = [ids[-1][: ids[-1].index("-")] + f"-{6}"]
    expect(ws, ids, deadline)
    expect(sse, ids, deadline)

    # A crash: the WebSocket's node is killed; what is published meanwhile on another node
    # reaches the client once it is back through the balancer on a node that is up.
    ws_node.kill9()
    survivor = next(n for n in nodes if n.running)
    ids = [publish(survivor, "news", f"k{i}") for i in range(5)]
    expect(ws, ids, deadline)
    assert ws.reconnects >= 1
    expect(sse, ids, deadline)

    # A drain: SIGTERM to the SSE stream's node (if it still runs, else to the WebSocket's
    # new one): /healthz turns 503, HAProxy stops sending it clients, the node ends its
    # streams and closes WebSockets with 1001, and they come back elsewhere.
    drained = sse_node if sse_node.running else holder(nodes, "ws")
    before = (sse.reconnects, len(ws.closes))
    drained.proc.send_signal(signal.SIGTERM)
    survivor = next(n for n in nodes if n.running and n is not drained)
    ids = [publish(survivor, "news", f"d{i}") for i in range(5)]
    expect(ws, ids, deadline)
    expect(sse, ids, deadline)
    assert drained.proc.wait(timeout=15) == 0
    if drained is sse_node:
        assert sse.reconnects > before[0], "the drained node ended the stream"
    else:
        assert ws.closes[before[1]:] == [1001], "the drained node said going away"
    ws.close()


# --------------------------------------------------------------------------------------------
# compose.sentinel.yaml's Redis side, run as written


class ComposeRedis(Redis):
    """redis-server with a Compose service's own arguments, its names mapped to loopback."""

    def __init__(self, workdir, args):
        self.args = args
        super().__init__(workdir)

    def command(self):
        return [self.binary, *self.args, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--daemonize", "no", "--logfile", ""]  # fmt: skip


class ComposeSentinel(Broker):
    """redis-server --sentinel with the configuration lines a Compose sentinel writes."""

    name = "redis-sentinel"
    binary = REDIS

    def __init__(self, workdir, lines):
        self.lines = lines
        super().__init__(workdir)

    def command(self):
        conf = self.dir / "sentinel.conf"
        if not conf.exists():
            lines = [
                f"port {self.port}" if l.startswith("port ") else
                f"dir {self.dir}" if l.startswith("dir ") else l
                for l in self.lines
            ]  # fmt: skip
            conf.write_text("\n".join(["bind 127.0.0.1", *lines]) + "\n")
        return [self.binary, str(conf), "--sentinel"]

    def ping(self):
        return Redis.command_reply(self, "PING", timeout=1.0) == "PONG"

    def command_reply(self, *args, timeout=5.0):
        return Redis.command_reply(self, *args, timeout=timeout)


def mapped(words, names):
    """`words` with each Compose host name (and `name port` pair) replaced by loopback."""
    text = "\0".join(words)
    for name, port in names.items():
        text = re.sub(rf"{name}(\0| |:){'6379' if 'redis' in name else '26379'}\b",
                      lambda m, p=port: f"127.0.0.1{m.group(1)}{p}", text)  # fmt: skip
        text = text.replace(name, "127.0.0.1")
    return text.split("\0")


def test_the_sentinel_files_redis_and_sentinels_run_as_written_and_serve_the_nodes(
    cluster, tmp_path
):
    services = load("compose.sentinel.yaml")["services"]
    names = {}
    primary_args = services["redis-primary"]["command"][1:]
    primary = ComposeRedis(tmp_path, mapped(primary_args, names))
    cluster.brokers.append(primary)
    names["redis-primary"] = primary.port
    replica = ComposeRedis(tmp_path, mapped(services["redis-replica"]["command"][1:], names))
    cluster.brokers.append(replica)
    sentinels = []
    for i in (1, 2, 3):
        script = shlex.split(services[f"sentinel-{i}"]["command"][2])
        lines = script[script.index("%s\\n") + 1 : script.index(">")]
        lines = [interpolate(l, {}).replace("$(hostname)", "127.0.0.1") for l in lines]
        s = ComposeSentinel(tmp_path, mapped(lines, names))
        cluster.brokers.append(s)
        sentinels.append(s)
        names[f"sentinel-{i}"] = s.port
    wait_until(
        lambda: all(len(s.command_reply("SENTINEL", "sentinels", "clarion")) == 2
                    and s.command_reply("SENTINEL", "replicas", "clarion") for s in sentinels),
        30, "three sentinels that know each other and the replica",
    )  # fmt: skip
    env = node_env(services["clarion-1"], primary)
    env["CLARION_BROKER"] = mapped([env["CLARION_BROKER"]], names)[0]
    a = cluster.node(env=env, name="clarion-1")
    env = node_env(services["clarion-2"], primary)
    env["CLARION_BROKER"] = mapped([env["CLARION_BROKER"]], names)[0]
    b = cluster.node(env=env, name="clarion-2")
    deadline = time.monotonic() + 20
    ws = connect(
        f"ws://{b.clients}/ws?topic=s", subprotocols=["clarion.v1"], open_timeout=5, legacy=True
    )
    time.sleep(0.2)
    ids = [publish(a, "s", f"m{i}") for i in range(3)]
    got = []
    while len(got) < 3:
        m = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        if "id" in m:
            got.append(m["id"])
    assert got == ids
    ws.close()
