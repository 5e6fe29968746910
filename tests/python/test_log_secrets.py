"""No broker password, token or hook query token reaches Clarion's output: every broker URL
form, with the broker reachable and not, and the failure paths (a wrong password, a malformed
URL, an unsupported hook URL), at the default log level and at debug. Every line of stdout and
stderr is searched for each secret."""

import os
import signal
import subprocess
import time
import urllib.request

import pytest

from cluster_util import Nats, Redis, free_port
from conftest import _binary

REDIS_PW = "redis-pw-4f1c"
ACL_PW = "acl-pw-9b2e"
NATS_PW = "nats-pw-77aa"
NATS_TOKEN = "nats-token-3c5d"
SENTINEL_PW = "sentinel-pw-e0e0"
HOOK_TOKEN = "hook-token-12ab"
SECRETS = [REDIS_PW, ACL_PW, NATS_PW, NATS_TOKEN, SENTINEL_PW, HOOK_TOKEN]


class SecretRedis(Redis):
    """A private redis-server that requires `REDIS_PW` (default user) and has an ACL user
    `alice` with `ACL_PW`."""

    def command(self):
        return super().command() + [
            "--requirepass", REDIS_PW,
            "--user", "alice", "on", f">{ACL_PW}", "~*", "&*", "+@all",
        ]  # fmt: skip

    def ping(self):
        import socket

        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(f"AUTH {REDIS_PW}\r\nPING\r\n".encode())
            data = b""
            while b"PONG" not in data:
                chunk = s.recv(100)
                if not chunk:
                    return False
                data += chunk
            return True


class UserNats(Nats):
    def command(self):
        return super().command() + ["--user", "u", "--pass", NATS_PW]

    def ping(self, timeout=1.0):
        return _nats_answers(self.port, '"user":"u","pass":"%s"' % NATS_PW, timeout)


class TokenNats(Nats):
    def command(self):
        return super().command() + ["--auth", NATS_TOKEN]

    def ping(self, timeout=1.0):
        return _nats_answers(self.port, '"auth_token":"%s"' % NATS_TOKEN, timeout)


def _nats_answers(port, creds, timeout):
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        data = b""
        while b"\r\n" not in data:
            data += s.recv(4096)
        s.sendall(b'CONNECT {"verbose":false,%s}\r\nPING\r\n' % creds.encode())
        data = b""
        while b"PONG" not in data and b"-ERR" not in data:
            chunk = s.recv(4096)
            if not chunk:
                return False
            data += chunk
        return b"PONG" in data


def _run(args, level, tmp_path, work=None):
    """Runs `clarion serve ARGS` with CLARION_LOG=level: until it exits (a failure path) or,
    once ready, after one publish and one subscriber (with a webhook to call) and a SIGTERM.
    Returns everything it wrote to stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    env["CLARION_LOG"] = level
    api = free_port()
    out = tmp_path / f"out-{time.monotonic_ns()}.log"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [_binary(), "serve", "--listen", f"127.0.0.1:{free_port()}",
             "--api-listen", f"127.0.0.1:{api}", "--broker-timeout-ms", "500", *args],
            stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and proc.poll() is None:
                if b"clarion ready" in out.read_bytes():
                    break
                time.sleep(0.05)
            if proc.poll() is None:
                if work:
                    work(api)
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    return out.read_text(errors="replace")


def _publish(api):
    req = urllib.request.Request(
        f"http://127.0.0.1:{api}/publish/news", data=b"hi", method="POST",
        headers={"Content-Type": "text/plain"},
    )  # fmt: skip
    try:
        urllib.request.urlopen(req, timeout=5).read()
    except OSError:
        pass
    time.sleep(0.3)


@pytest.mark.parametrize("level", ["info", "debug"])
def test_no_broker_password_or_token_in_any_log_line(tmp_path, level, request):
    redis = SecretRedis(tmp_path)
    request.addfinalizer(redis.kill)
    user_nats = UserNats(tmp_path)
    request.addfinalizer(user_nats.kill)
    token_nats = TokenNats(tmp_path)
    request.addfinalizer(token_nats.kill)
    closed = free_port()
    closed2 = free_port()
    hook = f"?token={HOOK_TOKEN}"
    webhook = ["--webhook-url", f"http://127.0.0.1:{closed}/events{hook}"]
    runs = {
        # Reachable: the "joined the cluster through ..." line.
        "redis default user": [f"redis://:{REDIS_PW}@127.0.0.1:{redis.port}", *webhook],
        "redis ACL user": [f"redis://alice:{ACL_PW}@127.0.0.1:{redis.port}/0"],
        "nats user": [f"nats://u:{NATS_PW}@127.0.0.1:{user_nats.port}"],
        "nats token": [f"nats://{NATS_TOKEN}@127.0.0.1:{token_nats.port}"],
        # Refused: a wrong password.
        "redis wrong password": [f"redis://:{REDIS_PW}x@127.0.0.1:{redis.port}"],
        "redis wrong ACL password": [f"redis://alice:{ACL_PW}x@127.0.0.1:{redis.port}"],
        "nats wrong password": [f"nats://u:{NATS_PW}x@127.0.0.1:{user_nats.port}"],
        # Not reachable: "started without the broker at ...", "not reachable yet".
        "redis down": [f"redis://:{REDIS_PW}@127.0.0.1:{closed}"],
        "redis ACL down": [f"redis://alice:{ACL_PW}@127.0.0.1:{closed}"],
        "rediss down": [f"rediss://:{REDIS_PW}@127.0.0.1:{closed}"],
        "sentinel down": [
            f"redis+sentinel://alice:{ACL_PW}@127.0.0.1:{closed},127.0.0.1:{closed2}/mymaster",
            "--redis-sentinel-password", SENTINEL_PW,
        ],
        "cluster down": [f"redis+cluster://:{REDIS_PW}@127.0.0.1:{closed},127.0.0.1:{closed2}"],
        "nats down": [f"nats://u:{NATS_PW}@127.0.0.1:{closed}"],
        "nats token down": [f"nats://{NATS_TOKEN}@127.0.0.1:{closed}"],
        # Malformed: the URL is quoted in the error that stops the start.
        "redis no host": [f"redis://:{REDIS_PW}@"],
        "redis bad database": [f"redis://:{REDIS_PW}@127.0.0.1:{closed}/x"],
        "cluster database": [f"redis+cluster://:{REDIS_PW}@127.0.0.1:{closed}/3"],
        "sentinel no master": [f"redis+sentinel://:{REDIS_PW}@127.0.0.1:{closed}"],
        "unknown scheme": [f"mqtt://u:{NATS_PW}@127.0.0.1:{closed}"],
        "nats with a path": [f"nats://u:{NATS_PW}@127.0.0.1:{closed}/x"],
    }
    leaks = {}
    outputs = {}
    for name, (url, *rest) in runs.items():
        text = _run(["--broker", url, *rest], level, tmp_path, _publish)
        outputs[name] = text
        found = [s for s in SECRETS if s in text]
        if found:
            leaks[name] = [line for line in text.splitlines() if any(s in line for s in found)]
    # Hook URLs: an unsupported scheme is refused with the URL quoted.
    text = _run(["--hook-connect-url", f"https://127.0.0.1:{closed}/c{hook}"], level, tmp_path)
    outputs["hook scheme"] = text
    if HOOK_TOKEN in text:
        leaks["hook scheme"] = [line for line in text.splitlines() if HOOK_TOKEN in line]
    assert not leaks, leaks
    # The runs did reach the lines that used to carry the URL (the test is not vacuous).
    assert "joined the cluster through redis://:***@" in outputs["redis default user"]
    assert "joined the cluster through redis://alice:***@" in outputs["redis ACL user"]
    assert "joined the cluster through nats://u:***@" in outputs["nats user"]
    assert "joined the cluster through nats://***@" in outputs["nats token"]
    assert "started without the broker at redis://:***@" in outputs["redis down"]
    assert "not reachable yet" in outputs["nats down"]
    assert "redis://:***@" in outputs["redis no host"]
