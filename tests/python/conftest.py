"""Fixtures that run the real `clarion` binary on ephemeral loopback ports.

The binary is taken from $CLARION_BIN, else target/release/clarion, else target/debug/clarion
(building it with cargo if neither exists). Each server prints one ready line,
`clarion ready clients=ADDR api=ADDR`, once both listeners are bound and signals are armed.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Every process this run starts inherits this variable, so the run can find each `clarion`
# it started, successors of an upgrade included: those are started by the old server, not by
# the test, and no fixture holds them.
RUN_MARK = "PYTEST_CLARION_RUN"
os.environ[RUN_MARK] = uuid.uuid4().hex


def _binary() -> str:
    if os.environ.get("CLARION_BIN"):
        return os.environ["CLARION_BIN"]
    for profile in ("release", "debug"):
        path = ROOT / "target" / profile / "clarion"
        if path.exists():
            return str(path)
    subprocess.run(["cargo", "build", "--release", "-p", "clarion"], cwd=ROOT, check=True)
    return str(ROOT / "target" / "release" / "clarion")


class Server:
    """A running `clarion serve` with helpers for its API."""

    def __init__(self, args, env=None, cwd=None, preexec_fn=None):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [_binary(), "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            cwd=cwd,
            preexec_fn=preexec_fn,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("clarion ready"):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        fields = dict(part.split("=", 1) for part in line.split()[2:])
        self.clients = fields["clients"]
        self.api = fields["api"]
        self.port = int(self.clients.rsplit(":", 1)[1])
        # The TLS client listener, when one is configured.
        self.tls = fields.get("tls")
        self.api_scheme = "http"
        self.api_context = None

    def ws_url(self, path="/ws", **query):
        return f"ws://{self.clients}{path}" + (
            "?" + "&".join(f"topic={t}" for t in query["topics"]) if query.get("topics") else ""
        )

    def request(self, method, path, body=None, headers=None):
        """(status, headers, body bytes) of an API request."""
        req = urllib.request.Request(
            f"{self.api_scheme}://{self.api}{path}", data=body, method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.api_context) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def publish(self, topic, data, binary=False, headers=None):
        hdrs = {"Content-Type": "application/octet-stream" if binary else "text/plain"}
        hdrs.update(headers or {})
        body = data if isinstance(data, bytes) else data.encode()
        status, _, out = self.request("POST", f"/publish/{topic}", body, hdrs)
        assert status == 200, out
        return json.loads(out)

    def metrics(self):
        """Metric name (with labels) to float."""
        _, _, body = self.request("GET", "/metrics")
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def stop(self, sig=signal.SIGTERM, timeout=15):
        """Signals the server and returns (exit code, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return code, self.proc.stderr.read()


@pytest.fixture
def start_server():
    """Factory: start_server(*args, env=None) -> Server; every server is stopped afterwards."""
    servers = []

    def start(*args, env=None, cwd=None, preexec_fn=None):
        s = Server([str(a) for a in args], env=env, cwd=cwd, preexec_fn=preexec_fn)
        servers.append(s)
        return s

    yield start
    for s in servers:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


@pytest.fixture
def server(start_server):
    return start_server()


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    """A directory with a development certificate and key (`clarion cert --dev`): cert.pem and
    key.pem, for localhost."""
    d = tmp_path_factory.mktemp("devcert")
    subprocess.run([_binary(), "cert", "--dev", "--dir", str(d)], check=True, capture_output=True)
    return d


def seq(message_id: str) -> int:
    """The SEQ part of an EPOCH-SEQ message id."""
    epoch, _, n = message_id.partition("-")
    assert epoch and n.isdigit(), message_id
    return int(n)


def dashboard_stats(addr, count=1, timeout=10):
    """The first `count` `stats` events of a fresh dashboard feed on the API at `addr`."""
    host, port = addr.rsplit(":", 1)
    out = []
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(b"GET /dashboard/feed HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        buf = b""
        while len(out) < count:
            chunk = sock.recv(65536)
            assert chunk, buf
            buf += chunk
            while b"\n\n" in buf:
                event, _, buf = buf.partition(b"\n\n")
                lines = event.decode().split("\n")
                if "event: stats" in lines:
                    data = next(l for l in lines if l.startswith("data: "))
                    out.append(json.loads(data[len("data: "):]))
    return out


# --------------------------------------------------------------------------------------------
# No server outlives its test


def _status(pid):
    """(name, state, ppid) of a process from /proc, or None when it is gone."""
    try:
        text = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
    return fields.get("Name", "").strip(), fields.get("State", "?")[0], int(fields.get("PPid", 0))


def marked_servers():
    """pid -> ppid of every live `clarion` process this run started (zombies are not live)."""
    mark = f"{RUN_MARK}={os.environ[RUN_MARK]}".encode()
    found = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        st = _status(pid)
        # `clarion`, or a copy of it under another name (`CLARION_BIN=/tmp/clarion-x`).
        if st is None or not st[0].startswith("clarion") or st[1] == "Z":
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if mark in environ.split(b"\0"):
            found[pid] = st[2]
    return found


def _kill_and_wait(pids, timeout=10.0):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((_status(p) or ("", "Z", 0))[1] == "Z" for p in pids):
            return
        time.sleep(0.05)


def _ancestors(pid, parents):
    seen = set()
    while pid in parents and pid not in seen:
        seen.add(pid)
        pid = parents[pid]
        yield pid


@pytest.fixture(autouse=True)
def no_server_outlives_its_test():
    """Kills every `clarion` a test started and left running: the successor of an upgrade, a
    server started without a fixture. Servers of module fixtures (started before the test)
    and their children (a group's members replaced during a roll) are kept."""
    before = set(marked_servers())
    yield
    after = marked_servers()
    left = [
        pid
        for pid in after
        if pid not in before and not any(a in before for a in _ancestors(pid, after))
    ]
    if left:
        _kill_and_wait(left)


def pytest_sessionfinish(session, exitstatus):
    """Fails the run when a `clarion` it started is still running at its end (and stops it)."""
    left = marked_servers()
    if left:
        _kill_and_wait(list(left))
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"FAILED: {len(left)} clarion process(es) outlived the test run: {sorted(left)}",
            red=True,
        )
        session.exitstatus = 1
