"""Fixtures for cluster tests: private brokers and several Clarion nodes, all on loopback.

- `Redis`: Debian's `redis-server` on a free port, without persistence (`--save ""
  --appendonly no`), in its own temp dir: a restart loses every key, like a crashed cache.
- `Nats`: Debian's `nats-server` on a free port, with its HTTP monitoring port (`/subsz`,
  `/connz`) for interest checks.
- Both: `restart()` (same port), `pause()`/`resume()` (SIGSTOP/SIGCONT: a stalled broker that
  still accepts TCP connections), `kill()`, `ping()`, `.url`, `.port`.
- `Node`: `clarion serve` on its own client and API ports (chosen free, kept across
  `restart()`), with any extra arguments passed through (`--broker URL --node-name n1`); all
  conftest `Server` helpers (`publish`, `request`, `metrics`, `ws_url`, `stop`), plus
  `kill9()`, `restart()`, `healthz()`, `wait_healthy()` and its log (`log_text()`).
- `Cluster`: owns all of the above for one test and tears everything down at the end.

Use the `cluster` fixture (import it into the test module: `from cluster_util import cluster`):

    def test_x(cluster):
        redis = cluster.redis()
        a, b = cluster.start_nodes(2, "--broker", redis.url, "--node-name", "n{i}")

Every wait is bounded; a broker binary that is not installed skips the test with a note
(`.ci/run` installs both).
"""

import json
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import Server, _binary

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"
NATS = shutil.which("nats-server") or "/usr/sbin/nats-server"


def wait_until(predicate, timeout=10.0, what="condition", interval=0.02):
    """Polls `predicate` until it returns a truthy value (returned) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


_handed_out = set()


def missing_service(name):
    """A test whose service is not installed: skipped on a developer's machine (and listed by
    `pytest -rs`), failed under CI (`CI=true`), where .ci/run must have installed it."""
    message = f"note: {name} is not installed (.ci/run installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(message + "; under CI=true a missing service fails the run", pytrace=False)
    pytest.skip(message)


def free_port():
    """A loopback port below the kernel's ephemeral range (32768-60999 by default), never
    handed out twice in this run: a restarted server can take its port back, and no outgoing
    connection takes it meanwhile. The probe sets SO_REUSEADDR as Clarion, Redis and nats-server
    do on their listeners, so TIME-WAIT sockets left by a load run do not count as taken."""
    for _ in range(200):
        port = random.randrange(10000, 32000)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port in 10000-32000")


# --------------------------------------------------------------------------------------------
# Brokers



def stop_all_threads(proc):
    """SIGSTOP to `proc`, returning once every thread is stopped: a signal is delivered
    asynchronously, and a thread of a multi-threaded server running on the other core can still
    answer a connection in between (seen with nats-server: a ping right after the pause got its
    PONG; and with Clarion: a connection accepted and refused before its request arrived)."""
    proc.send_signal(signal.SIGSTOP)
    tasks = pathlib.Path(f"/proc/{proc.pid}/task")

    def stopped():
        try:
            states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return False
        return bool(states) and all(st in ("T", "t") for st in states)

    deadline = time.monotonic() + 5
    while not stopped():
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {proc.pid} did not stop after SIGSTOP")
        time.sleep(0.005)

class Broker:
    """A broker process on a fixed loopback port, in a private directory, logging to a file.
    Subclasses give `name`, `binary`, `command()` and `ping()`."""

    name = "broker"
    binary = None

    def __init__(self, workdir):
        if not self.binary or not os.access(self.binary, os.X_OK):
            missing_service(self.name)
        self.dir = pathlib.Path(workdir) / f"{self.name}-{id(self):x}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc = None
        self.start()

    def start(self, timeout=10.0):
        """Starts the process (on the same port as before) and waits until it answers."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        log = open(self.dir / "server.log", "ab")
        self.proc = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.dir,
            start_new_session=True,
        )
        log.close()
        try:
            wait_until(self._answers, timeout, f"{self.name} on port {self.port}", 0.05)
        except BaseException:
            self.kill()
            raise

    def _answers(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {self.log_text()[-2000:]}")
        try:
            return self.ping()
        except OSError:
            return False

    def restart(self, timeout=10.0):
        """Kills it (SIGKILL: nothing is saved) and starts it again on the same port."""
        self.kill()
        self.start(timeout)

    def pause(self):
        """SIGSTOP: the process stops, the kernel still accepts connections for it (see
        `stop_all_threads`)."""
        stop_all_threads(self.proc)

    def resume(self):
        """SIGCONT after `pause()`."""
        self.proc.send_signal(signal.SIGCONT)

    def kill(self):
        """SIGKILL (a paused process too) and reap it; a no-op when it is not running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def log_text(self):
        try:
            return (self.dir / "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def _connect(self, timeout):
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)


def _recv_until(sock, marker, limit=1 << 20):
    """Reads from `sock` until `marker` is in what was read (bounded by the socket's timeout
    and `limit` bytes)."""
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before {marker!r}: {data[-200:]!r}")
        data += chunk
        if len(data) > limit:
            raise ConnectionError("answer too long")
    return data


class Redis(Broker):
    """A private redis-server without persistence."""

    name = "redis-server"
    binary = REDIS

    def command(self):
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def command_reply(self, *args, timeout=5.0):
        """Sends one command (RESP array of bulk strings) and returns its decoded reply:
        str for simple strings, int, bytes or None for bulk strings, lists for arrays;
        an error reply raises `RedisError`."""
        out = f"*{len(args)}\r\n".encode()
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += f"${len(a)}\r\n".encode() + a + b"\r\n"
        with self._connect(timeout) as s:
            s.settimeout(timeout)
            s.sendall(out)
            reader = _RespReader(s)
            return reader.reply()

    def ping(self):
        return self.command_reply("PING", timeout=1.0) == "PONG"


class RedisError(Exception):
    """An error reply from Redis."""


class _RespReader:
    """Just enough RESP2 to read one reply from a socket."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise ConnectionError(f"unexpected RESP line {line!r}")


class Nats(Broker):
    """A private nats-server (core NATS, no JetStream) with HTTP monitoring."""

    name = "nats-server"
    binary = NATS

    def __init__(self, workdir):
        self.monitor_port = free_port()
        super().__init__(workdir)

    def command(self):
        return [
            self.binary,
            "-a", "127.0.0.1",
            "-p", str(self.port),
            "-m", str(self.monitor_port),
            "-n", f"test-{self.port}",
        ]  # fmt: skip

    @property
    def url(self):
        return f"nats://127.0.0.1:{self.port}"

    def ping(self, timeout=1.0):
        """Connects as a client: INFO, CONNECT, PING, then PONG within `timeout`."""
        with self._connect(timeout) as s:
            s.settimeout(timeout)
            info = _recv_until(s, b"\r\n")
            if not info.upper().startswith(b"INFO "):
                return False
            s.sendall(b'CONNECT {"verbose":false,"name":"cluster_util"}\r\nPING\r\n')
            return b"PONG\r\n" in _recv_until(s, b"PONG\r\n")

    def monitor(self, endpoint, timeout=5.0):
        """The JSON of a monitoring endpoint: "varz", "connz", "subsz?subs=1", ..."""
        url = f"http://127.0.0.1:{self.monitor_port}/{endpoint}"
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())

    def subjects(self):
        """Every subject a client connection is subscribed to now, by client name (the name
        in CONNECT, "" when none): {name: [subject, ...]}. The server's own internal
        subscriptions are left out."""
        out = {}
        for conn in self.monitor("connz?subs=1&limit=1024").get("connections", []):
            name = conn.get("name", "")
            out.setdefault(name, []).extend(conn.get("subscriptions_list", []))
        return out

    def subscriptions(self):
        """How many subscriptions client connections hold now."""
        return sum(len(subjects) for subjects in self.subjects().values())


# --------------------------------------------------------------------------------------------
# Clarion nodes


class Node(Server):
    """`clarion serve` on fixed free client and API ports; extra `args` are passed as they are.
    Its stderr goes to a log file (a pipe nobody reads could fill and stall the node)."""

    def __init__(self, args, workdir, name, env=None, timeout=15.0):
        self.name = name
        self.args = [str(a) for a in args]
        self.env = env
        self.dir = pathlib.Path(workdir) / f"node-{name}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.client_port = free_port()
        self.api_port = free_port()
        self.api_scheme = "http"
        self.api_context = None
        self.tls = None
        self.proc = None
        self.start(timeout)

    def start(self, timeout=15.0):
        """Starts the process (again, on the same ports) and waits for its ready line."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
        full_env.update(self.env or {})
        self._log = open(self.dir / "stderr.log", "ab")
        self.proc = subprocess.Popen(
            [
                _binary(), "serve",
                "--listen", f"127.0.0.1:{self.client_port}",
                "--api-listen", f"127.0.0.1:{self.api_port}",
                *self.args,
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            text=True,
            env=full_env,
            cwd=self.dir,
        )  # fmt: skip
        self._log.close()
        line = self._ready_line(timeout)
        if not line.startswith("clarion ready"):
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise RuntimeError(f"node {self.name} did not start: {line!r} {self.log_text()}")
        fields = dict(part.split("=", 1) for part in line.split()[2:])
        self.clients = fields["clients"]
        self.api = fields["api"]
        self.port = int(self.clients.rsplit(":", 1)[1])
        self.tls = fields.get("tls")

    def _ready_line(self, timeout):
        """The first stdout line, or "" when none comes within `timeout` (bounded read)."""
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                return ""
        return self.proc.stdout.readline()

    def kill9(self):
        """SIGKILL, as a crash: no shutdown, no goodbye to clients or the broker."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def restart(self, timeout=15.0):
        """Kills it if it runs and starts it again with the same ports and arguments."""
        if self.proc.poll() is None:
            self.kill9()
        self.start(timeout)

    @property
    def running(self):
        return self.proc.poll() is None

    def healthz(self):
        """(status, parsed JSON or raw text) of GET /healthz; (None, error) when unreachable."""
        try:
            status, _, body = self.request("GET", "/healthz")
        except OSError as e:
            return None, str(e)
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body.decode(errors="replace")

    def wait_healthy(self, timeout=10.0, predicate=None):
        """Waits until /healthz answers 200 (and `predicate(body)` holds, if given); returns
        the body."""

        def ok():
            status, body = self.healthz()
            return status == 200 and (predicate is None or predicate(body))

        wait_until(ok, timeout, f"node {self.name} healthy", 0.05)
        return self.healthz()[1]

    def log_text(self):
        try:
            return (self.dir / "stderr.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig=signal.SIGTERM, timeout=15):
        """Signals the node and returns (exit code, its log)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise
        return code, self.log_text()


class Cluster:
    """Everything one test starts; `close()` kills it all."""

    def __init__(self, workdir):
        self.dir = pathlib.Path(workdir)
        self.brokers = []
        self.nodes = []

    def redis(self):
        """A new private Redis (skips the test when redis-server is missing)."""
        r = Redis(self.dir)
        self.brokers.append(r)
        return r

    def nats(self):
        """A new private NATS server (skips the test when nats-server is missing)."""
        n = Nats(self.dir)
        self.brokers.append(n)
        return n

    def node(self, *args, name=None, env=None):
        """Starts one Clarion node with `args` passed through."""
        name = name or f"n{len(self.nodes) + 1}"
        node = Node(args, self.dir, name, env=env)
        self.nodes.append(node)
        return node

    def start_nodes(self, count, *args, env=None):
        """Starts `count` nodes; "{i}" in an argument becomes the node's number (1-based), so
        `start_nodes(3, "--node-name", "n{i}")` names them n1, n2, n3."""
        return [
            self.node(*(str(a).replace("{i}", str(i)) for a in args), name=f"n{i}", env=env)
            for i in range(1, count + 1)
        ]

    def close(self):
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.kill()
            try:
                node.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if node.proc.stdout:
                node.proc.stdout.close()
        for broker in self.brokers:
            broker.kill()


@pytest.fixture
def cluster(tmp_path):
    """A `Cluster` whose brokers and nodes are all killed when the test ends."""
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()
