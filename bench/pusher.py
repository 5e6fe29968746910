#!/usr/bin/env python3
"""The Pusher protocol at scale (issue 50, docs/benchmarks.md "Pusher protocol"): Clarion's
Pusher mode against Sockudo (a Rust Pusher server, built from its source when a path is given),
Soketi (Node, on uWebSockets.js; `--soketi`, installed from npm) and Clarion's own protocol, in
the same run, with the same clients.

Per server and repeat (servers interleaved), N WebSocket connections from client processes on
127.0.0.2.. (no permessage-deflate: the cost of the protocol, not of compression), then:

- **idle**: server RSS per connection once every connection is subscribed to the ticker channel
  (the growth from N more connections, measured after a warm-up of N/10, at most 500, idle
  ones, so that lazily made pools are not charged to them);
- **ticker**: M events, `--interval` apart, to every connection: server CPU-seconds
  (user+system, /proc) per million deliveries, and the age of each delivery (receive time minus
  publish time, p50/p99);
- **burst**: B events back to back: deliveries per second and CPU per million deliveries;
- **presence storm** (Pusher servers): every connection joins a presence channel of 100
  members (`presence-room-K`, signed as a backend's auth endpoint signs) at once: time until
  the last `subscription_succeeded`, and server CPU-seconds for the storm (each join is
  announced to the room's other members).

Events are triggered with Pusher's signed HTTP API (`POST /apps/{id}/events`) on both Pusher
servers; Clarion's own protocol (`own`: `/ws?topic=`, bare payloads) is published on its API.
Every client counts every event: a run that loses one says so.

    cargo build --release -p clarion
    git clone https://github.com/sockudo/sockudo /path/to/sockudo     # optional peer
    python3 bench/pusher.py -n 15000 --sockudo-src /path/to/sockudo --repeats 3
"""

import argparse
import base64
import hashlib
import hmac
import http.client
import json
import os
import pathlib
import queue
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from idle_memory import ROOT, cpu_seconds, free_port, rss  # noqa: E402

APP = {"id": "4242", "key": "bench-key", "secret": "bench-secret"}
CHANNEL = "ticker"
ROOM = 100  # members per presence channel (Pusher's own limit per channel)
PUSHER_QUERY = "protocol=7&client=js&version=8.4.0&flash=false"


# ---------------------------------------------------------------- client process


def masked(payload, opcode=0x1):
    """A masked client text frame."""
    key = os.urandom(4)
    n = len(payload)
    head = struct.pack("!BB", 0x80 | opcode, 0x80 | n) if n < 126 else struct.pack("!BBH", 0x80 | opcode, 0xFE, n)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def upgrade(target, source, path):
    """A socket from `source` that has sent a WebSocket upgrade for `path` to `target`."""
    host, port = target.rsplit(":", 1)
    s = socket.socket()
    s.bind((source, 0))
    s.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: {target}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
               f"Sec-WebSocket-Key: {key}\r\n\r\n").encode())
    return s


def frames(conn):
    """Takes the complete server frames out of `conn["buf"]`: [(opcode, payload)]."""
    out, buf, at = [], conn["buf"], 0
    while len(buf) - at >= 2:
        ln, head = buf[at + 1] & 0x7F, 2
        if ln == 126:
            if len(buf) - at < 4:
                break
            ln, head = struct.unpack_from("!H", buf, at + 2)[0], 4
        elif ln == 127:
            if len(buf) - at < 10:
                break
            ln, head = struct.unpack_from("!Q", buf, at + 2)[0], 10
        if len(buf) - at < head + ln:
            break
        out.append((buf[at] & 0x0F, bytes(buf[at + head:at + head + ln])))
        at += head + ln
    conn["buf"] = buf[at:]
    return out


class Clients:
    """One client process's connections and what they received."""

    def __init__(self, target, source, count, protocol):
        self.protocol, self.conns = protocol, []
        path = f"/app/{APP['key']}?{PUSHER_QUERY}" if protocol == "pusher" else f"/ws?topic={CHANNEL}"
        for _ in range(count):
            self.conns.append({"sock": upgrade(target, source, path), "buf": b"", "head": False, "socket_id": None,
                               "subscribed": False, "joined": False, "got": 0})
        self.sel = selectors.DefaultSelector()
        for c in self.conns:
            c["sock"].setblocking(False)
            self.sel.register(c["sock"], selectors.EVENT_READ, c)
        self.ages, self.seen = [], {}

    def pump(self, until, seconds):
        """Reads until `until()` or `seconds` pass; handles every frame as it comes."""
        deadline = time.monotonic() + seconds
        while not until() and time.monotonic() < deadline:
            for key, _ in self.sel.select(0.1):
                c = key.data
                try:
                    data = c["sock"].recv(1 << 16)
                except (BlockingIOError, InterruptedError):
                    continue
                if not data:
                    raise SystemExit("a connection was closed by the server")
                c["buf"] += data
                if not c["head"]:
                    if b"\r\n\r\n" not in c["buf"]:
                        continue
                    head, c["buf"] = c["buf"].split(b"\r\n\r\n", 1)
                    if not head.startswith(b"HTTP/1.1 101"):
                        raise SystemExit(f"refused: {head[:80]!r}")
                    c["head"] = True
                    # Clarion's own protocol subscribes in the upgrade itself.
                    c["subscribed"] = self.protocol != "pusher"
                for opcode, payload in frames(c):
                    self.frame(c, opcode, payload)
        return until()

    def frame(self, c, opcode, payload):
        now = time.time()
        if opcode == 0x9:
            c["sock"].sendall(masked(payload, 0xA))
            return
        if opcode != 0x1:
            return
        if self.protocol != "pusher":
            self.delivered(c, payload, now)
            return
        # Every subscriber gets the same bytes: parse each distinct event once.
        m = self.seen.get(payload)
        if m is None:
            m = json.loads(payload)
            if m.get("event") == CHANNEL:
                self.seen[payload] = m
        event = m.get("event")
        if event == CHANNEL:
            self.delivered(c, m["data"].encode(), now)
        elif event == "pusher:connection_established":
            c["socket_id"] = json.loads(m["data"])["socket_id"]
            c["sock"].sendall(masked(json.dumps(
                {"event": "pusher:subscribe", "data": {"channel": CHANNEL}}).encode()))
        elif event == "pusher_internal:subscription_succeeded":
            if m.get("channel") == CHANNEL:
                c["subscribed"] = True
            else:
                c["joined"] = True
        elif event == "pusher:ping":
            c["sock"].sendall(masked(b'{"event":"pusher:pong","data":{}}'))
        elif event == "pusher:error":
            raise SystemExit(f"pusher:error {m.get('data')}")

    def delivered(self, c, data, now):
        c["got"] += 1
        sent = data.split(b",", 1)[0]  # "SENT_TIME,SEQ,padding"
        if sent != b"0":
            self.ages.append(now - float(sent))

    def join(self, index0):
        for i, c in enumerate(self.conns):
            member = index0 + i
            channel = f"presence-room-{member // ROOM}"
            data = json.dumps({"user_id": f"u{member}", "user_info": {"n": member}}, separators=(",", ":"))
            sig = hmac.new(APP["secret"].encode(), f"{c['socket_id']}:{channel}:{data}".encode(),
                           hashlib.sha256).hexdigest()
            c["sock"].sendall(masked(json.dumps({"event": "pusher:subscribe", "data": {
                "channel": channel, "auth": f"{APP['key']}:{sig}", "channel_data": data}}).encode()))


def client_main(target, source, count, protocol, index0):
    clients = Clients(target, source, count, protocol)
    if not clients.pump(lambda: all(c["subscribed"] for c in clients.conns), 120):
        raise SystemExit("not every connection subscribed in 120 s")
    print("ready", flush=True)
    # Commands come on stdin; frames are read as they arrive in between (ages are true).
    commands = queue.Queue()

    def read_commands():
        for line in sys.stdin:
            commands.put(line.split())
        commands.put(["quit"])

    threading.Thread(target=read_commands, daemon=True).start()
    while True:
        clients.pump(lambda: not commands.empty(), 3600)
        cmd = commands.get()
        if cmd[0] == "expect":
            n, seconds = int(cmd[1]), float(cmd[2])
            ok = clients.pump(lambda: all(c["got"] >= n for c in clients.conns), seconds)
            got = sum(c["got"] for c in clients.conns)
            ages = sorted(clients.ages)
            clients.ages = []
            print(json.dumps({"ok": ok, "got": got, "ages": ages[:: max(1, len(ages) // 2000)]}), flush=True)
        elif cmd[0] == "join":
            clients.join(index0)
            ok = clients.pump(lambda: all(c["joined"] for c in clients.conns), float(cmd[1]))
            print(json.dumps({"ok": ok, "at": time.time()}), flush=True)
        else:
            return


# ---------------------------------------------------------------- servers


def pusher_signed(path, body):
    """The query string of a signed Pusher API request (auth_version 1.0)."""
    params = {"auth_key": APP["key"], "auth_timestamp": str(int(time.time())), "auth_version": "1.0",
              "body_md5": hashlib.md5(body).hexdigest()}
    query = "&".join(f"{k}={params[k]}" for k in sorted(params))
    sig = hmac.new(APP["secret"].encode(), f"POST\n{path}\n{query}".encode(), hashlib.sha256).hexdigest()
    return f"{path}?{query}&auth_signature={sig}"


class Server:
    name, protocol = "", "pusher"

    def publish(self, data):
        """One event to the channel: Pusher's signed trigger, or Clarion's own publish."""
        if self.protocol == "pusher":
            path = f"/apps/{APP['id']}/events"
            body = json.dumps({"name": CHANNEL, "channel": CHANNEL, "data": data}).encode()
            url = pusher_signed(path, body)
        else:
            url, body = f"/publish/{CHANNEL}", data.encode()
        kind = "application/json" if self.protocol == "pusher" else "text/plain"
        self.http.request("POST", url, body, {"Content-Type": kind})
        r = self.http.getresponse()
        out = r.read()
        if r.status != 200:
            raise SystemExit(f"{self.name}: publish answered {r.status}: {out[:200]!r}")

    def pids(self):
        return [self.proc.pid]

    def stop(self):
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Clarion(Server):
    name = "clarion-pusher"

    def __init__(self):
        binary = os.environ.get("CLARION_BIN", str(ROOT / "target" / "release" / "clarion"))
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
             # thousands of clients from each address, connecting at once: neither limit
             # is what is measured (as Sockudo's rate limiter is off)
             "--max-connections-per-address", "0", "--max-handshakes", "0", "--compression", "off",
             "--pusher-app-id", APP["id"], "--pusher-app-key", APP["key"],
             "--pusher-app-secret", APP["secret"]],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        fields = dict(p.split("=", 1) for p in self.proc.stdout.readline().split()[2:])
        self.clients, api = fields["clients"], fields["api"]
        self.http = http.client.HTTPConnection(api, timeout=30)


class ClarionOwn(Clarion):
    name, protocol = "clarion-own", "own"


class Sockudo(Server):
    name = "sockudo"

    def __init__(self, binary):
        port = free_port()
        env = dict(os.environ, HOST="127.0.0.1", PORT=str(port), METRICS_ENABLED="false",
                   LOG_LEVEL="warn", ADAPTER_DRIVER="local", CACHE_DRIVER="memory",
                   QUEUE_DRIVER="memory", RATE_LIMITER_DRIVER="memory", APP_MANAGER_DRIVER="memory",
                   SOCKUDO_DEFAULT_APP_ID=APP["id"], SOCKUDO_DEFAULT_APP_KEY=APP["key"],
                   SOCKUDO_DEFAULT_APP_SECRET=APP["secret"], SOCKUDO_DEFAULT_APP_ENABLED="true",
                   SOCKUDO_DEFAULT_APP_MAX_CONNECTIONS="0",
                   SOCKUDO_DEFAULT_APP_MAX_BACKEND_EVENTS_PER_SECOND="1000000",
                   SOCKUDO_DEFAULT_APP_MAX_READ_REQUESTS_PER_SECOND="1000000",
                   SOCKUDO_DEFAULT_APP_MAX_PRESENCE_MEMBERS_PER_CHANNEL=str(ROOM),
                   # the equivalent of Clarion's --max-connections-per-address 0 here: thousands
                   # of clients share each loopback source address
                   RATE_LIMITER_ENABLED="false")
        self.proc = subprocess.Popen([binary], env=env, cwd=pathlib.Path(binary).parent,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.clients = f"127.0.0.1:{port}"
        wait_listening(self, port)
        self.http = http.client.HTTPConnection(self.clients, timeout=30)


class Soketi(Server):
    name = "soketi"

    def __init__(self, directory):
        port, metrics = free_port(), free_port()
        env = dict(os.environ, SOKETI_HOST="127.0.0.1", SOKETI_PORT=str(port),
                   SOKETI_METRICS_ENABLED="false", SOKETI_METRICS_SERVER_PORT=str(metrics),
                   SOKETI_DEFAULT_APP_ID=APP["id"], SOKETI_DEFAULT_APP_KEY=APP["key"],
                   SOKETI_DEFAULT_APP_SECRET=APP["secret"], SOKETI_PRESENCE_MAX_MEMBERS=str(ROOM))
        binary = pathlib.Path(directory) / "node_modules" / ".bin" / "soketi"
        self.proc = subprocess.Popen([str(binary), "start"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.clients = f"127.0.0.1:{port}"
        wait_listening(self, port)
        self.http = http.client.HTTPConnection(self.clients, timeout=30)


def install_soketi():
    """Soketi 1.6.1 from npm into target/peers/soketi. It pins uWebSockets.js to a GitHub
    tag, which the registry cannot serve: the npm repackaging of uWebSockets.js's prebuilt
    binaries (`uwebsockets`, as bench/peers/setup.sh uses for the uws peer) stands in."""
    directory = ROOT / "target" / "peers" / "soketi"
    if not (directory / "node_modules" / ".bin" / "soketi").exists():
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "package.json").write_text(json.dumps({
            "name": "soketi-peer", "private": True, "dependencies": {"@soketi/soketi": "1.6.1"},
            "overrides": {"uWebSockets.js": "npm:uwebsockets@3.0.6"}}))
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts"],
                       cwd=directory, check=True)
    return str(directory)


def wait_listening(server, port):
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if server.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{server.name} did not start (run it by hand to see why)")
            time.sleep(0.2)


def build_sockudo(src):
    """Builds Sockudo's server from its source tree (default features: the local adapter;
    one of its dependencies needs `protoc`: `apt-get install protobuf-compiler`); its target
    directory is kept under this repository's target/."""
    target = ROOT / "target" / "peers" / "sockudo"
    subprocess.run(["cargo", "build", "--release", "--locked", "-p", "sockudo", "--bin", "sockudo"],
                   cwd=src, env=dict(os.environ, CARGO_TARGET_DIR=str(target)), check=True)
    return str(target / "release" / "sockudo")


# ---------------------------------------------------------------- one run


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run_once(server, n, procs, args):
    share = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    pid = server.pids()
    # The memory figure is the slope past a warm-up: a server's first connections also pay for
    # its lazily made pools and buffers, which 15,000 connections should not be charged for.
    warm = warm_up(server, f"127.0.0.{2 + procs}", min(500, max(1, n // 10)))
    time.sleep(1)
    base_rss = rss(pid)
    kids, index0 = [], 0
    for i, count in enumerate(share):
        kids.append(subprocess.Popen(
            [sys.executable, __file__, "--client", server.clients, f"127.0.0.{2 + i}", str(count),
             server.protocol, str(index0)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        index0 += count
    for k in kids:
        if k.stdout.readline().strip() != "ready":
            raise SystemExit(f"{server.name}: a client process failed")
    time.sleep(args.settle)
    now_rss = rss(pid)
    out = {"server": server.name, "n": n, "rss_per_conn": (now_rss - base_rss) / n,
           "rss_mb": now_rss / 2**20}

    def tell(cmd):
        for k in kids:
            k.stdin.write(cmd + "\n")
            k.stdin.flush()

    def ask(cmd):
        tell(cmd)
        return [json.loads(k.stdout.readline()) for k in kids]

    pad = "x" * args.size
    cpu0 = cpu_seconds(pid)
    for i in range(args.messages):
        server.publish(f"{time.time():.6f},{i},{pad}")
        time.sleep(args.interval)
    got = ask(f"expect {args.messages} 60")
    cpu = cpu_seconds(pid) - cpu0
    deliveries = sum(g["got"] for g in got)
    ages = sorted(a for g in got for a in g["ages"])
    out.update(ticker_ok=all(g["ok"] for g in got) and deliveries == n * args.messages,
               ticker_cpu_per_m=cpu / deliveries * 1e6,
               ticker_p50_ms=percentile(ages, 0.5) * 1e3, ticker_p99_ms=percentile(ages, 0.99) * 1e3)

    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    for i in range(args.burst):
        server.publish(f"0,{i},{pad}")
    total = args.messages + args.burst
    got = ask(f"expect {total} 60")
    took, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0
    burst = sum(g["got"] for g in got) - deliveries
    out.update(burst_ok=all(g["ok"] for g in got) and burst == n * args.burst,
               burst_per_s=burst / took, burst_cpu_per_m=cpu / burst * 1e6)

    if server.protocol == "pusher":
        cpu0, t0 = cpu_seconds(pid), time.time()
        got = ask("join 120")
        out.update(join_ok=all(g["ok"] for g in got), join_s=max(g["at"] for g in got) - t0,
                   join_cpu_s=cpu_seconds(pid) - cpu0)
    tell("quit")
    for k in kids:
        k.wait(timeout=30)
    for sock in warm:
        sock.close()
    return out


def warm_up(server, source, count):
    """`count` idle WebSockets (Pusher: established, in no channel; own: on no topic)."""
    path = f"/app/{APP['key']}?{PUSHER_QUERY}" if server.protocol == "pusher" else "/ws"
    socks = [upgrade(server.clients, source, path) for _ in range(count)]
    for s in socks:
        s.settimeout(30)
        if not s.recv(4096).startswith(b"HTTP/1.1 101"):
            raise SystemExit(f"{server.name}: a warm-up connection was refused")
    return socks


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=15000, help="connections per run")
    p.add_argument("--procs", type=int, default=3, help="client processes (≤ 7,000 connections each)")
    p.add_argument("-m", "--messages", type=int, default=30, help="ticker events")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between ticker events")
    p.add_argument("--burst", type=int, default=20, help="events of the burst")
    p.add_argument("--size", type=int, default=64, help="padding bytes per event")
    p.add_argument("--settle", type=float, default=3.0, help="seconds idle before the memory reading")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sockudo-src", help="Sockudo's source tree (built here); skipped when absent")
    p.add_argument("--sockudo-bin", help="a Sockudo binary already built")
    p.add_argument("--soketi", action="store_true", help="also Soketi (installed from npm)")
    p.add_argument("--client", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        target, source, count, protocol, index0 = args.client
        return client_main(target, source, int(count), protocol, int(index0))

    makers = [("clarion-pusher", Clarion), ("clarion-own", ClarionOwn)]
    binary = args.sockudo_bin
    if not binary and args.sockudo_src and pathlib.Path(args.sockudo_src, "Cargo.toml").exists():
        binary = build_sockudo(args.sockudo_src)
    if binary:
        makers.append(("sockudo", lambda: Sockudo(binary)))
    else:
        print("sockudo: skipped (no --sockudo-src or --sockudo-bin)", file=sys.stderr)
    if args.soketi:
        soketi = install_soketi()
        makers.append(("soketi", lambda: Soketi(soketi)))
    results = []
    for r in range(args.repeats):
        for name, make in makers:
            server = make()
            try:
                row = run_once(server, args.n, args.procs, args)
            finally:
                server.stop()
            row["repeat"] = r
            results.append(row)
            print(json.dumps(row), flush=True)
    report(results)


def report(results):
    keys = ["rss_per_conn", "ticker_cpu_per_m", "ticker_p50_ms", "ticker_p99_ms", "burst_per_s",
            "burst_cpu_per_m", "join_s", "join_cpu_s"]
    names = list(dict.fromkeys(r["server"] for r in results))
    med = {s: {k: statistics.median([r[k] for r in results if r["server"] == s and k in r] or [float("nan")])
               for k in keys} for s in names}
    print(f"\nmedians of {max(r['repeat'] for r in results) + 1} repeats, N = {results[0]['n']}")
    print(f"{'figure':<34}" + "".join(f"{s:>16}" for s in names))
    for k in keys:
        print(f"{k:<34}" + "".join(f"{med[s][k]:>16.2f}" for s in names))
    def ratio(a, b, k):
        # A short run can read no CPU tick at all: no ratio then.
        return f"{med[a][k] / med[b][k]:.3f}" if med[b][k] else "n/a (nothing measured)"

    for peer in ("sockudo", "soketi"):
        if peer in med:
            for k in ("rss_per_conn", "ticker_cpu_per_m", "burst_cpu_per_m", "join_cpu_s"):
                print(f"clarion-pusher / {peer}, {k}: {ratio('clarion-pusher', peer, k)}")
    for k in ("ticker_cpu_per_m", "burst_cpu_per_m", "rss_per_conn"):
        print(f"clarion-pusher / clarion-own, {k}: {ratio('clarion-pusher', 'clarion-own', k)}")
    bad = [r for r in results if not (r["ticker_ok"] and r["burst_ok"] and r.get("join_ok", True))]
    print("every event delivered to every connection" if not bad else f"LOSSES in {len(bad)} runs")


if __name__ == "__main__":
    main()
