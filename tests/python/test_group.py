"""`clarion serve --processes N`: a supervisor and N processes sharing the ports, the group's
/metrics and /healthz on the API address, restarts, stopping, and the port guard that refuses
a second server on a port another process holds (issue 23).

Delivery across the processes goes through the broker and is tested with the cluster tests;
these start a private redis-server only because a group refuses to start without a broker.
"""

import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

import rawws
from cluster_util import Redis
from conftest import _binary, dashboard_stats


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A broker URL for the group: a private redis-server (cluster_util's) for this module."""
    redis = Redis(tmp_path_factory.mktemp("redis"))
    yield redis.url
    redis.kill()


def children(pid):
    """Process ids whose parent is `pid`, from /proc."""
    out = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(entry.name))
    return sorted(out)


def alive(pid):
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(check, timeout=15, step=0.1):
    """Polls `check` until it returns something true, at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def node_values(metrics, family, **labels):
    """{node: value} of the per-node samples of `family` with `labels`."""
    out = {}
    for key, value in metrics.items():
        m = re.fullmatch(re.escape(family) + r"\{node=\"([^\"]+)\"(.*)\}", key)
        if not m:
            continue
        rest = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if all(rest.get(k) == v for k, v in labels.items()):
            out[m.group(1)] = value
    return out


def group_healthy(server, n):
    status, _, body = server.request("GET", "/healthz")
    return status == 200 and body.decode().startswith(f"ok ({n} of {n} processes)")


@pytest.fixture
def group(start_server, broker):
    server = start_server("--processes", 3, "--broker", broker, "--node-name", "grp", "--shutdown-timeout", 3)
    # Every process answers its own /healthz (its broker link included) before the tests use it.
    assert wait_for(lambda: group_healthy(server, 3)), server.request("GET", "/healthz")
    return server


def test_processes_above_one_without_a_broker_are_refused():
    proc = subprocess.run(
        [_binary(), "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", "--processes", "2"],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if not k.startswith("CLARION_")},
    )
    assert proc.returncode != 0
    assert "processes = 2 needs a broker" in proc.stderr and "--broker" in proc.stderr, proc.stderr
    assert "clarion ready" not in proc.stdout


def test_three_processes_start_and_each_shows_in_metrics_and_the_process_table(group):
    pids = children(group.proc.pid)
    assert len(pids) == 3, pids
    for pid in pids:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"serve" in cmdline and b"--processes" in cmdline, cmdline
    _, headers, body = group.request("GET", "/metrics")
    text = body.decode()
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    names = {f"grp-{i}" for i in range(3)}
    metrics = group.metrics()
    assert node_values(metrics, "clarion_group_node_up") == {n: 1.0 for n in names}
    assert set(node_values(metrics, "clarion_connections", transport="ws")) == names
    assert metrics["clarion_group_processes"] == 3
    # The text format: one HELP and one TYPE per family, its samples together.
    types = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert len(types) == len(set(types)), types
    assert len(re.findall(r"^# HELP ", text, re.M)) == len(types)
    family = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            family = line.split()[2]
        elif not line.startswith("#"):
            assert line.startswith(family), (line, family)
    _, _, health = group.request("GET", "/healthz")
    assert health.decode().startswith("ok (3 of 3 processes)"), health


def test_connections_spread_over_the_processes(group):
    socks = [rawws.connect(group.clients, "/ws?topic=spread") for _ in range(30)]

    def counted():
        m = group.metrics()
        per_node = node_values(m, "clarion_connections", transport="ws")
        return per_node if sum(per_node.values()) == 30 else None

    per_node = wait_for(counted, timeout=10)
    assert per_node, group.metrics()
    assert group.metrics()['clarion_connections{transport="ws"}'] == 30
    # The kernel hashes each connection to one listener: 30 on one of 3 has odds of 3^-29.
    assert sum(1 for v in per_node.values() if v > 0) >= 2, per_node
    for sock, _, _ in socks:
        sock.close()


def test_a_killed_process_is_restarted(group):
    before = children(group.proc.pid)
    victim = before[0]
    os.kill(victim, signal.SIGKILL)
    after = wait_for(lambda: (lambda c: c if len(c) == 3 and victim not in c else None)(children(group.proc.pid)))
    assert after, children(group.proc.pid)

    assert wait_for(lambda: group_healthy(group, 3)), group.request("GET", "/healthz")
    restarts = node_values(group.metrics(), "clarion_group_restarts_total")
    assert sorted(restarts.values()) == [0, 0, 1], restarts
    # The restarted process shares the port again: new connections still work.
    sock, _, _ = rawws.connect(group.clients, "/ws?topic=after")
    sock.close()


@pytest.mark.parametrize(
    "sig, close",
    [(signal.SIGTERM, (1001, "server shutting down")), (signal.SIGUSR2, (1012, "service restart"))],
)
def test_a_signal_to_the_supervisor_stops_every_process(group, sig, close):
    # SIGTERM stops the group; SIGUSR2 stops it as a restart (WebSockets get 1012).
    pids = children(group.proc.pid)
    socks = [rawws.connect(group.clients, "/ws?topic=t") for _ in range(6)]
    code, stderr = group.stop(sig, timeout=30)
    assert code == 0, stderr
    for sock, _, rest in socks:
        assert rawws.Reader(sock, rest).close_code() == close
    assert not any(alive(p) for p in pids), pids
    assert "stopped: all 3 processes exited" in stderr


def roll(group, timeout=120):
    """SIGUSR1, then waits until three new processes serve; returns the /healthz counts seen."""
    before = set(children(group.proc.pid))
    serving = []

    def up_count():
        _, _, body = group.request("GET", "/healthz")
        m = re.search(r"\((\d+) of 3 processes\)", body.decode())
        serving.append(int(m.group(1)) if m else 0)
        return serving[-1]

    group.proc.send_signal(signal.SIGUSR1)
    replaced = wait_for(
        lambda: (lambda now: now if len(now) == 3 and not now & before and up_count() == 3 else None)(
            set(children(group.proc.pid))
        ),
        timeout=timeout,
        step=0.05,
    )
    assert replaced, (before, children(group.proc.pid))
    return serving


def test_sigusr1_replaces_the_processes_one_at_a_time(group):
    # A rolling upgrade: each process in turn hands its listeners and WebSockets to a successor
    # (started from the binary on disk) before the next one's turn, so the group never has
    # fewer than 2 of its 3 processes serving; every process ends up replaced, and the sockets
    # carry on (test_group_handover.py checks delivery under a publishing loop).
    socks = [rawws.connect(group.clients, "/ws?topic=roll") for _ in range(30)]
    serving = roll(group, timeout=60)
    assert min(serving) >= 2, serving
    restarts = node_values(group.metrics(), "clarion_group_restarts_total")
    assert sorted(restarts.values()) == [1, 1, 1], restarts
    # The group serves on: the same sockets get a publish, and so does a new subscriber.
    sock, _, rest = rawws.connect(group.clients, "/ws?topic=roll")
    time.sleep(0.2)
    group.request("POST", "/publish/roll", b"hello")
    assert rawws.Reader(sock, rest).frame()[2] == b"hello"
    sock.close()
    for sock, _, rest in socks:
        assert rawws.Reader(sock, rest).frame()[2] == b"hello"
    code, stderr = group.stop(signal.SIGTERM, timeout=30)
    assert code == 0, stderr
    assert "rolling upgrade done: 3 processes handed over (30 connections moved)" in stderr


def test_processes_stop_when_the_supervisor_is_killed(group):
    pids = children(group.proc.pid)
    assert len(pids) == 3
    group.proc.kill()
    group.proc.wait(timeout=10)
    assert wait_for(lambda: not any(alive(p) for p in pids), timeout=20), pids


def test_processes_stop_when_the_supervisor_is_killed_and_nobody_reads_stderr(broker):
    # The log shipper (here: this test) went away before the supervisor died: every line the
    # members log on the way out meets a closed pipe, and must not stop them from stopping.
    proc = subprocess.Popen(
        [_binary(), "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
         "--processes", "3", "--broker", broker, "--shutdown-timeout", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("CLARION_")},
    )
    pids = []
    try:
        assert "clarion ready" in proc.stdout.readline()
        pids = wait_for(lambda: (lambda c: c if len(c) == 3 else None)(children(proc.pid)))
        assert pids, children(proc.pid)
        proc.stderr.close()
        proc.kill()
        proc.wait(timeout=10)
        assert wait_for(lambda: not any(alive(p) for p in pids), timeout=20), pids
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in pids or []:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_second_server_on_a_held_port_refuses_to_start(server, group):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}

    def serve(*args):
        return subprocess.run(
            [_binary(), "serve", *args], capture_output=True, text=True, timeout=30, env=env
        )

    for held in (server, group):
        port = held.port
        out = serve("--listen", f"127.0.0.1:{port}", "--api-listen", "127.0.0.1:0")
        assert out.returncode != 0 and "clarion ready" not in out.stdout
        assert f"port {port} (client address" in out.stderr, out.stderr
        assert "held by another process" in out.stderr, out.stderr
        api_port = int(held.api.rsplit(":", 1)[1])
        out = serve("--listen", "127.0.0.1:0", "--api-listen", held.api)
        assert out.returncode != 0
        assert f"port {api_port} (API address" in out.stderr, out.stderr
    # The wildcard address covers a port held on loopback; a whole group is refused too.
    out = serve(
        "--listen", f"0.0.0.0:{server.port}", "--api-listen", "127.0.0.1:0",
        "--processes", "2", "--broker", "redis://127.0.0.1:1",
    )
    assert out.returncode != 0 and f"port {server.port}" in out.stderr, out.stderr
    # Both servers still serve.
    for held in (server, group):
        sock, _, _ = rawws.connect(held.clients, "/ws?topic=still")
        sock.close()


def test_sighup_is_passed_on_and_a_tls_group_shares_the_tls_port(start_server, broker, tmp_path):
    from test_tls import make_dev_cert, peer_cert

    dev = make_dev_cert(tmp_path / "tls")
    group = start_server(
        "--processes", 2, "--broker", broker, "--node-name", "tls",
        "--tls-listen", "127.0.0.1:0", "--tls-cert", dev["cert"], "--tls-key", dev["key"],
        "--shutdown-timeout", 2,
    )
    assert group.tls and group.tls != group.clients
    pids = children(group.proc.pid)
    for _ in range(6):
        assert peer_cert(group.tls, dev["ca"])
    group.proc.send_signal(signal.SIGHUP)
    # The members' reloaders look for SIGHUP once a second.
    time.sleep(2.5)
    assert group.proc.poll() is None
    assert children(group.proc.pid) == pids
    code, stderr = group.stop(signal.SIGTERM, timeout=30)
    assert code == 0, stderr
    assert "SIGHUP: passed on to 2 processes" in stderr
    for i in range(2):
        assert f"[tls-{i}] TLS certificates reloaded (SIGHUP)" in stderr, stderr


def test_a_publish_on_the_group_api_reaches_subscribers_on_every_process(group):
    socks = [rawws.connect(group.clients, "/ws?topic=everyone") for _ in range(15)]
    per_node = wait_for(
        lambda: (lambda v: v if sum(v.values()) == 15 else None)(
            node_values(group.metrics(), "clarion_subscriptions")
        ),
        timeout=10,
    )
    assert per_node and sum(1 for v in per_node.values() if v > 0) >= 2, per_node
    for i in range(3):
        group.publish("everyone", f"m{i}")
    for sock, _, rest in socks:
        sock.settimeout(10)
        reader = rawws.Reader(sock, rest)
        assert [reader.frame()[2] for _ in range(3)] == [b"m0", b"m1", b"m2"]
        sock.close()
    delivered = group.metrics()["clarion_messages_delivered_total"]
    assert delivered == 45, delivered


def test_metrics_auth_covers_the_group_and_the_scrape_still_works(start_server, broker):
    server = start_server("--processes", 2, "--broker", broker, "--api-key", "k", "--metrics-auth")
    assert wait_for(lambda: group_healthy(server, 2)), server.request("GET", "/healthz")
    assert server.request("GET", "/metrics")[0] == 401
    status, _, body = server.request("GET", "/metrics", headers={"Authorization": "Bearer k"})
    assert status == 200, body
    text = body.decode()
    assert "clarion_group_processes 2" in text, text[:500]
    assert text.count('clarion_group_node_up{node="') == 2 and ' 0\n' not in "".join(
        line + "\n" for line in text.splitlines() if line.startswith("clarion_group_node_up")
    ), text


def test_the_dashboard_feed_shows_the_whole_group(start_server, broker):
    # Whichever process accepts the feed, it shows the group: totals as /metrics merges them,
    # and one row per process (four opens used to show 4, 4, 2, 2 of 6 connections).
    server = start_server("--processes", 2, "--broker", broker, "--node-name", "dash", "--shutdown-timeout", 3)
    assert wait_for(lambda: group_healthy(server, 2)), server.request("GET", "/healthz")
    socks = [rawws.connect(server.clients, "/ws?topic=spread") for _ in range(20)]

    def spread():
        per_node = node_values(server.metrics(), "clarion_connections", transport="ws")
        return per_node if sum(per_node.values()) == 20 else None

    per_node = wait_for(spread, timeout=10)
    assert per_node and all(v > 0 for v in per_node.values()) and len(per_node) == 2, per_node
    for _ in range(4):
        [stats] = dashboard_stats(server.api)
        assert stats["connections_total"] == 20, stats
        rows = {n["name"]: n["connections"] for n in stats["nodes"]}
        assert rows == {name: int(v) for name, v in per_node.items()}, (rows, per_node)
        assert all(n["state"] == "up" and n["pid"] > 0 for n in stats["nodes"]), stats["nodes"]
        assert [t["topic"] for t in stats["top_topics"]] == ["spread"], stats["top_topics"]
        assert stats["top_topics"][0]["subscribers"] == 20
        assert "group of 2 processes" in stats["scope"], stats["scope"]
    for sock, _, _ in socks:
        sock.close()


def test_the_group_keeps_its_files_in_the_users_private_directory(start_server, broker, tmp_path):
    """The nodes file lives in the user's private directory (the hand-over socket's,
    mode 0700), not at a predictable name in the shared temporary directory that another
    local user could take first and so keep the group from starting."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o1777)
    env = {"TMPDIR": str(tmp), "XDG_RUNTIME_DIR": "", "RUNTIME_DIRECTORY": ""}
    start_server("--processes", 2, "--broker", broker, "--shutdown-timeout", 3, env=env)
    private = tmp / f"clarion-{os.getuid()}"
    assert sorted(p.name for p in tmp.iterdir()) == [private.name]
    assert private.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in private.iterdir() if p.name.startswith("clarion-group-")]
