#!/usr/bin/env python3
"""Idle-connection benchmark: user-space memory and CPU per idle WebSocket (or SSE) subscriber.

Starts one server process, opens N WebSocket connections subscribed to one topic from several
client processes (each bound to its own loopback source address, each well under the 20,000
open-file limit), and measures:

- RSS per connection: (server RSS with N idle connections - RSS before any) / N, after the
  connections settle, and again after a broadcast burst. The RSS is the anonymous part (heap
  and stacks, `/proc/PID/statm` resident less shared): the program text the page cache maps in
  is shared, not the connections', and a binary just built had more of it mapped at start than
  an older one, which made the older one's connections look up to 70 B dearer;
- idle CPU: the server's utime+stime over a quiet window, from /proc/PID/stat;
- that a burst of broadcasts reaches every connection (bytes counted by the clients).

Every run measures Clarion and, when available, a peer (`--peer socketify`: µWebSockets inside
Python, installed into bench/.venv) in the same invocation, repeats each `--repeats` times and
reports medians and the ratio.

    python3 bench/idle_memory.py                       # Clarion, 15,000 connections, 3 repeats
    python3 bench/idle_memory.py --peer socketify      # and the µWebSockets peer
    python3 bench/idle_memory.py --sse                 # and Clarion with SSE subscribers
    python3 bench/idle_memory.py -n 2000 --repeats 1   # quick look
    python3 bench/idle_memory.py --tls --peer socketify   # TLS 1.3 WebSockets, both servers

With `--tls`, every connection is a TLS 1.3 WebSocket (certificate from `clarion cert --dev`,
trusted by the clients), for Clarion and the peers alike; `--plain` adds the clear-text Clarion
run for the cost of TLS itself.

With `--h2` (issue 32), the same run measures, over TLS 1.3: an idle HTTP/2 connection holding one
SSE stream against an idle HTTP/1.1 SSE connection (N of each), and the cost of an additional
idle stream: `--h2-conns` HTTP/2 connections with one stream each against as many with
`--h2-streams` each ((RSS difference) / (connections x (streams - 1))). The clients speak
HTTP/2 themselves (a few frames and a fixed HPACK block, below), ALPN `h2`. Every SSE request,
HTTP/1.1 or HTTP/2, carries the fields a Chromium EventSource sends (`BROWSER_FIELDS`), and
the HTTP/2 block adds each to the server's HPACK table as a browser does:

    python3 bench/idle_memory.py --h2 -n 15000 --repeats 3 --server-flags '--max-connections 40000'

An HTTP/2 connection and each of its streams both count against Clarion's `max_connections`
(by default the open-files limit less 64, 19,936 here), so 15,000 connections of one stream
need 30,000: `--server-flags` raises the cap (the connections still fit the open-files limit;
the HTTP/1.1 runs are below either cap).

Results from this machine are recorded in docs/benchmarks.md.
"""

import argparse
import base64
import json
import os
import pathlib
import selectors
import shlex
import socket
import ssl
import statistics
import tempfile
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOPIC = "bench"
PAGE = os.sysconf("SC_PAGE_SIZE")
# More `clarion serve` flags for every Clarion run (--server-flags).
SERVER_FLAGS = []
TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- client process


def client_main(target, source, count, path):
    """Opens `count` connections from `source`, then follows the parent's commands on stdin.
    A path starting with /sse opens Server-Sent Events streams, `h2:S:/sse...` HTTP/2
    connections of S SSE streams each, anything else WebSockets."""
    if path.startswith("h2:"):
        _, streams, path = path.split(":", 2)
        return h2_client_main(target, source, count, int(streams), path)
    host, port = target.rsplit(":", 1)
    socks = []
    sse = path.startswith("/sse")
    ca = os.environ.get("BENCH_TLS_CA")
    ctx = ssl.create_default_context(cafile=ca) if ca else None
    if sse:
        fields = "".join(f"{name}: {value}\r\n" for name, _, value in BROWSER_FIELDS)
        request = f"GET {path} HTTP/1.1\r\nHost: {target}\r\nAccept: text/event-stream\r\n{fields}\r\n"
        ok = b"HTTP/1.1 200"
    else:
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {target}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n"
        )
        ok = b"HTTP/1.1 101"
    for _ in range(count):
        s = socket.socket()
        s.bind((source, 0))
        s.connect((host, int(port)))
        if ctx:
            s = ctx.wrap_socket(s, server_hostname="localhost")
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(request.replace("{key}", key).encode())
        head = b""
        while not handshake_done(head, sse):
            chunk = s.recv(1024)
            if not chunk:
                raise SystemExit(f"server closed during handshake after {len(socks)} connections")
            head += chunk
        if not head.startswith(ok):
            raise SystemExit(f"handshake refused: {head[:40]!r}")
        s.setblocking(False)
        socks.append(s)
    print(f"ready {len(socks)}", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "expect":
            # Messages per connection: WebSocket frames are 32 bytes; SSE events are counted
            # by their `data:` lines (ids vary in length).
            want, deadline = int(cmd[1]) * len(socks), time.monotonic() + float(cmd[2])
            sel = selectors.DefaultSelector()
            for s in socks:
                sel.register(s, selectors.EVENT_READ, [0, b""])
            got = 0
            while got < want and time.monotonic() < deadline:
                for key, _ in sel.select(0.2):
                    try:
                        data = key.fileobj.recv(65536)
                        while ctx and key.fileobj.pending():
                            data += key.fileobj.recv(65536)
                    except (BlockingIOError, ssl.SSLWantReadError):
                        continue
                    if sse:
                        tail = key.data[1] + data
                        got += tail.count(b"data: ")
                        key.data[1] = tail[-5:]
                    else:
                        key.data[0] += len(data)
                        got += (key.data[0] // 32) - ((key.data[0] - len(data)) // 32)
            sel.close()
            print(f"got {got}", flush=True)
        elif cmd[0] == "quit":
            break
    for s in socks:
        s.close()


# ---------------------------------------------------------------- HTTP/2 client

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_MAX_WINDOW = 2**31 - 1


def h2_frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") \
        + payload


def hpack_int(first, prefix_bits, value):
    """An HPACK integer (RFC 7541 §5.1) with `first`'s high bits as flags."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out, value = [first | limit], value - limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    return bytes(out + [value])


def hpack_string(s):
    b = s.encode()
    return hpack_int(0x00, 7, len(b)) + b


def hpack_indexed(name, value):
    """A literal field with incremental indexing (RFC 7541 §6.2.1), as a browser sends most
    fields: its name from the static table (an index) or new (a string), its value raw."""
    if isinstance(name, int):
        return hpack_int(0x40, 6, name) + hpack_string(value)
    return b"\x40" + hpack_string(name) + hpack_string(value)


# The fields a Chromium EventSource sends besides the request line (its version strings
# abridged to a typical length), in both the HTTP/1.1 and the HTTP/2 requests.
BROWSER_FIELDS = [
    ("cache-control", 24, "no-cache"),
    ("user-agent", 58, "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/131.0.0.0 Safari/537.36"),
    ("accept-encoding", 16, "gzip, deflate, br, zstd"),
    ("accept-language", 17, "en-US,en;q=0.9"),
    ("sec-ch-ua", None, '"Chromium";v="131", "Not_A Brand";v="24"'),
    ("sec-ch-ua-platform", None, '"Linux"'),
]


def h2_request(authority, path, tls):
    """The HEADERS block of a GET for `path` as a browser's first request on a connection:
    static :method GET and :scheme, then :authority, :path, accept and `BROWSER_FIELDS`, each
    added to the server's dynamic table (so the server holds them until it may drop them)."""
    block = b"\x82" + (b"\x87" if tls else b"\x86") + hpack_indexed(1, authority) \
        + hpack_indexed(4, path) + hpack_indexed(19, "text/event-stream")
    for name, index, value in BROWSER_FIELDS:
        block += hpack_indexed(index if index is not None else name, value)
    return block


def h2_frames(buf):
    """Complete frames at the start of `buf` as (kind, flags, stream, payload), and the rest."""
    out = []
    while len(buf) >= 9:
        n = int.from_bytes(buf[:3], "big")
        if len(buf) < 9 + n:
            break
        out.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & H2_MAX_WINDOW,
                    buf[9:9 + n]))
        buf = buf[9 + n:]
    return out, buf


def h2_control(sock, kind, flags, payload):
    """Answers what a server expects answered: its SETTINGS and PINGs. Raises on GOAWAY."""
    if kind == 0x4 and not flags & 1:
        sock.sendall(h2_frame(0x4, 1, 0))
    elif kind == 0x6 and not flags & 1:
        sock.sendall(h2_frame(0x6, 1, 0, payload))
    elif kind == 0x7:
        raise SystemExit(f"GOAWAY from the server: code {int.from_bytes(payload[4:8], 'big')}")


def h2_client_main(target, source, count, streams, path):
    """`count` HTTP/2 connections of `streams` SSE streams each, every stream answered 200
    before the next connection; then the parent's commands, as client_main."""
    host, port = target.rsplit(":", 1)
    ca = os.environ.get("BENCH_TLS_CA")
    ctx = None
    if ca:
        ctx = ssl.create_default_context(cafile=ca)
        ctx.set_alpn_protocols(["h2"])
    block = h2_request(target, path, ctx is not None)
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.bind((source, 0))
        s.connect((host, int(port)))
        if ctx:
            s = ctx.wrap_socket(s, server_hostname="localhost")
            if s.selected_alpn_protocol() != "h2":
                raise SystemExit(f"ALPN chose {s.selected_alpn_protocol()!r}, not h2")
        settings = (2).to_bytes(2, "big") + (0).to_bytes(4, "big") \
            + (4).to_bytes(2, "big") + H2_MAX_WINDOW.to_bytes(4, "big")
        out = H2_PREFACE + h2_frame(0x4, 0, 0, settings) \
            + h2_frame(0x8, 0, 0, (H2_MAX_WINDOW - 65535).to_bytes(4, "big"))
        for i in range(streams):
            out += h2_frame(0x1, 0x5, 2 * i + 1, block)
        s.sendall(out)
        answered, buf = 0, b""
        while answered < streams:
            chunk = s.recv(65536)
            if not chunk:
                raise SystemExit(f"server closed during handshake after {len(socks)} connections")
            frames, buf = h2_frames(buf + chunk)
            for kind, flags, stream, payload in frames:
                h2_control(s, kind, flags, payload)
                if kind == 0x1:
                    # The server's blocks start with table size updates (0x20..0x3f), then
                    # :status; 0x88 is the static ":status: 200".
                    fields = payload.lstrip(bytes(range(0x20, 0x40)))
                    if not fields.startswith(b"\x88"):
                        raise SystemExit(f"stream {stream} refused: {payload[:16].hex()}")
                    answered += 1
                elif kind == 0x3:
                    raise SystemExit(f"stream {stream} reset: {payload.hex()}")
        s.setblocking(False)
        socks.append((s, buf))
    print(f"ready {len(socks) * streams} {len(socks)}", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "expect":
            # Messages per stream, counted by their `data:` lines in DATA frames.
            want, deadline = int(cmd[1]) * len(socks) * streams, time.monotonic() + float(cmd[2])
            sel = selectors.DefaultSelector()
            for s, buf in socks:
                sel.register(s, selectors.EVENT_READ, [buf])
            got = 0
            while got < want and time.monotonic() < deadline:
                for key, _ in sel.select(0.2):
                    s = key.fileobj
                    try:
                        data = s.recv(65536)
                        while ctx and s.pending():
                            data += s.recv(65536)
                    except (BlockingIOError, ssl.SSLWantReadError):
                        continue
                    frames, key.data[0] = h2_frames(key.data[0] + data)
                    for kind, flags, _, payload in frames:
                        if kind == 0x0:
                            got += payload.count(b"data: ")
                        else:
                            s.setblocking(True)
                            h2_control(s, kind, flags, payload)
                            s.setblocking(False)
            sel.close()
            print(f"got {got}", flush=True)
        elif cmd[0] == "quit":
            break
    for s, _ in socks:
        s.close()


def handshake_done(head, sse):
    """Whether `head` holds the whole answer head (and, for SSE, the `retry:` block after it)."""
    if b"\r\n\r\n" not in head:
        return False
    return not sse or b"\n\n" in head.split(b"\r\n\r\n", 1)[1]


# ---------------------------------------------------------------- server side


def rss(pids):
    """Anonymous resident bytes: resident less file-backed and shared (see the top)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/statm") as f:
            fields = f.read().split()
        total += (int(fields[1]) - int(fields[2])) * PAGE
    return total


def cpu_seconds(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / TICK


def descendants(pid):
    pids = [pid]
    for p in pathlib.Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    pids.extend(descendants(int(p.name)))
            except (OSError, IndexError, ValueError):
                pass
    return pids


class Clarion:
    name = "clarion"

    def __init__(self):
        binary = os.environ.get("CLARION_BIN", str(ROOT / "target" / "release" / "clarion"))
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
             # thousands of clients share each loopback source address here
             "--max-connections-per-address", "0", *SERVER_FLAGS],
            stdout=subprocess.PIPE, text=True,
        )
        fields = dict(p.split("=", 1) for p in self.proc.stdout.readline().split()[2:])
        self.clients, self.api = fields["clients"], fields["api"]
        self.path = f"/ws?topic={TOPIC}"

    def publish(self, payload):
        req = urllib.request.Request(
            f"http://{self.api}/publish/{TOPIC}", data=payload.encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())["subscribers"]

    def pids(self):
        return [self.proc.pid]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


class ClarionSSE(Clarion):
    """Clarion with Server-Sent Events subscribers instead of WebSockets."""

    name = "clarion-sse"

    def __init__(self):
        super().__init__()
        self.path = f"/sse?topic={TOPIC}"


class ClarionTLS(Clarion):
    """Clarion with TLS 1.3 WebSocket subscribers (a dev certificate made for the run)."""

    name = "clarion-tls"
    tls = True

    def __init__(self):
        binary = os.environ.get("CLARION_BIN", str(ROOT / "target" / "release" / "clarion"))
        d = dev_cert()
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
             "--max-connections-per-address", "0", "--tls-listen", "127.0.0.1:0",
             "--tls-cert", f"{d}/cert.pem", "--tls-key", f"{d}/key.pem", *SERVER_FLAGS],
            stdout=subprocess.PIPE, text=True,
        )
        fields = dict(p.split("=", 1) for p in self.proc.stdout.readline().split()[2:])
        self.clients, self.api = fields["tls"], fields["api"]
        self.path = f"/ws?topic={TOPIC}"


class ClarionSSETLS(ClarionTLS):
    """Clarion with HTTP/1.1 SSE subscribers over TLS 1.3."""

    name = "clarion-sse-tls"

    def __init__(self):
        super().__init__()
        self.path = f"/sse?topic={TOPIC}"


def clarion_h2(streams):
    """Clarion with HTTP/2 (TLS 1.3, ALPN h2) connections of `streams` SSE streams each."""

    class ClarionH2(ClarionTLS):
        name = f"clarion-h2-tls-x{streams}"

        def __init__(self):
            super().__init__()
            self.path = f"h2:{streams}:/sse?topic={TOPIC}"

    return ClarionH2


_DEV_CERT = None


def dev_cert():
    """A directory with ca.pem, cert.pem and key.pem from `clarion cert --dev` (made once)."""
    global _DEV_CERT
    if _DEV_CERT is None:
        _DEV_CERT = tempfile.mkdtemp(prefix="clarion-bench-tls-")
        binary = os.environ.get("CLARION_BIN", str(ROOT / "target" / "release" / "clarion"))
        subprocess.run([binary, "cert", "--dev", "--dir", _DEV_CERT], check=True,
                       capture_output=True)
    return _DEV_CERT


class Socketify:
    """µWebSockets through its Python binding, running bench/peers/socketify_server.py."""

    name = "socketify"
    tls_args = []

    def __init__(self):
        python = ROOT / "bench" / ".venv" / "bin" / "python"
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(python.parents[1])], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", "socketify"], check=True)
        port = free_port()
        self.proc = subprocess.Popen(
            [str(python), str(ROOT / "bench" / "peers" / "socketify_server.py"), str(port),
             *self.tls_args],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout.readline().startswith("ready")
        self.clients = self.api = f"127.0.0.1:{port}"
        self.path = f"/ws?topic={TOPIC}"

    def publish(self, payload):
        # The peer serves its publish route on its (TLS) client port.
        scheme, ctx = "http", None
        if getattr(self, "tls", False):
            scheme, ctx = "https", ssl.create_default_context(cafile=f"{dev_cert()}/ca.pem")
        req = urllib.request.Request(
            f"{scheme}://localhost:{self.api.rsplit(':', 1)[1]}/publish/{TOPIC}",
            data=payload.encode(), method="POST",
        )
        with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
            return int(r.read())

    def pids(self):
        return descendants(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


class SocketifyTLS(Socketify):
    """µWebSockets with its OpenSSL TLS (SSLApp), same certificate as Clarion's run."""

    name = "socketify-tls"
    tls = True

    def __init__(self):
        d = dev_cert()
        self.tls_args = [f"{d}/cert.pem", f"{d}/key.pem"]
        super().__init__()


def free_port():
    """A port below the ephemeral range, so the thousands of client connections of an earlier
    repeat (whose source ports linger in TIME_WAIT) can never be holding it."""
    import random
    for _ in range(100):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000..32000")


def run_once(server_cls, n, procs, idle_seconds, burst, settle=4):
    server = server_cls()
    try:
        time.sleep(1)
        pids = server.pids()
        base_rss = rss(pids)
        per = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        env = dict(os.environ)
        if getattr(server, "tls", False):
            env["BENCH_TLS_CA"] = f"{dev_cert()}/ca.pem"
        clients = [
            subprocess.Popen(
                [sys.executable, __file__, "--client", server.clients, f"127.0.0.{2 + i}",
                 str(count), server.path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            )
            for i, count in enumerate(per)
        ]
        started = time.monotonic()
        # "ready N" (a connection per subscriber), or "ready STREAMS CONNECTIONS" (HTTP/2).
        readies = [c.stdout.readline().split()[1:] for c in clients]
        if any(not r for r in readies):
            raise RuntimeError(f"{server.name}: a client failed; see its stderr")
        opened = sum(int(r[0]) for r in readies)
        conns = sum(int(r[-1]) for r in readies)
        connect_rate = conns / (time.monotonic() - started)
        # Settle: a TLS connection's keys, expanded for its first records, are dropped by the
        # server's sweep after a quiet second, and the heap a storm of handshakes left free
        # is given back one second later; idle means after both. A longer settle (--settle)
        # measures after the SSE keep-alives (every 20 s) have woken every connection once.
        time.sleep(settle)
        idle_rss = rss(pids)
        cpu0 = cpu_seconds(pids)
        time.sleep(idle_seconds)
        idle_cpu = cpu_seconds(pids) - cpu0

        payload = "x" * 30  # a 32-byte frame: 2 header bytes + 30
        for c in clients:
            c.stdin.write(f"expect {burst} 60\n")
            c.stdin.flush()
        reached = [server.publish(payload) for _ in range(burst)]
        received = sum(int(c.stdout.readline().split()[1]) for c in clients)
        time.sleep(1)
        burst_rss = rss(pids)
        for c in clients:
            c.stdin.write("quit\n")
            c.stdin.flush()
        for c in clients:
            c.wait(timeout=60)
        return {
            "connections": conns,
            "subscribers": opened,
            "connect_rate": connect_rate,
            "base_rss": base_rss,
            "idle_rss": idle_rss,
            "rss_per_conn": (idle_rss - base_rss) / conns,
            "rss_per_conn_after_burst": (burst_rss - base_rss) / conns,
            "idle_cpu_ms": idle_cpu * 1000,
            "idle_seconds": idle_seconds,
            "delivered": received,
            "expected": burst * opened,
            "reached": min(reached),
        }
    finally:
        server.stop()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--connections", type=int, default=15000)
    ap.add_argument("--client-procs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--idle-seconds", type=float, default=10)
    ap.add_argument("--burst", type=int, default=20, help="broadcasts after the idle window")
    ap.add_argument("--settle", type=float, default=4,
                    help="seconds between the last connection and the idle measurement")
    ap.add_argument("--peer", choices=["socketify"], action="append", default=[])
    ap.add_argument("--sse", action="store_true", help="also measure Clarion with SSE subscribers")
    ap.add_argument("--tls", action="store_true",
                    help="TLS 1.3 WebSockets (Clarion and peers alike)")
    ap.add_argument("--plain", action="store_true",
                    help="with --tls, also measure clear-text Clarion")
    ap.add_argument("--h2", action="store_true",
                    help="HTTP/2 over TLS: a connection of one SSE stream against an HTTP/1.1 "
                         "SSE connection, and the cost of each additional stream")
    ap.add_argument("--h2-conns", type=int, default=200,
                    help="--h2: connections of the additional-stream runs")
    ap.add_argument("--h2-streams", type=int, default=50,
                    help="--h2: streams per connection of the additional-stream run")
    ap.add_argument("--server-flags", default="",
                    help="more `clarion serve` flags for every Clarion run, e.g. "
                         "'--max-connections 40000'")
    ap.add_argument("--json", help="also write all results to this file")
    args = ap.parse_args()
    SERVER_FLAGS.extend(shlex.split(args.server_flags))

    if args.h2:
        return h2_main(args)
    if args.tls:
        classes = [ClarionTLS] + ([Clarion] if args.plain else [])
        classes += [{"socketify": SocketifyTLS}[p] for p in args.peer]
    else:
        classes = [Clarion] + ([ClarionSSE] if args.sse else [])
        classes += [{"socketify": Socketify}[p] for p in args.peer]
    results = {c.name: [] for c in classes}
    for r in range(args.repeats):
        for cls in classes:  # interleaved, so drift on the shared machine hits both alike
            res = run_once(cls, args.connections, args.client_procs, args.idle_seconds, args.burst,
                           args.settle)
            results[cls.name].append(res)
            print(f"[{r + 1}/{args.repeats}] {cls.name}: {res['rss_per_conn']:.0f} B/conn idle, "
                  f"{res['rss_per_conn_after_burst']:.0f} after burst, "
                  f"idle CPU {res['idle_cpu_ms']:.0f} ms in {args.idle_seconds:.0f} s, "
                  f"delivered {res['delivered']}/{res['expected']}", flush=True)

    def med(name, key):
        return statistics.median(x[key] for x in results[name])

    print(f"\nmedians over {args.repeats} runs, {args.connections} idle subscribers:")
    print(f"{'server':<12} {'B/conn idle':>12} {'B/conn burst':>13} {'idle CPU ms':>12} "
          f"{'connects/s':>11} {'base RSS MiB':>13} {'delivered':>10}")
    for name in results:
        print(f"{name:<12} {med(name, 'rss_per_conn'):>12.0f} "
              f"{med(name, 'rss_per_conn_after_burst'):>13.0f} {med(name, 'idle_cpu_ms'):>12.0f} "
              f"{med(name, 'connect_rate'):>11.0f} {med(name, 'base_rss') / 2**20:>13.1f} "
              f"{min(x['delivered'] / x['expected'] for x in results[name]):>10.2%}")
    first = classes[0].name
    for cls in classes[1:]:
        if cls.name.startswith("socketify"):
            ratio = med(first, "rss_per_conn") / med(cls.name, "rss_per_conn")
            print(f"{first} / {cls.name} memory per connection: {ratio:.2f}")
    if args.tls and args.plain:
        extra = med("clarion-tls", "rss_per_conn") - med("clarion", "rss_per_conn")
        print(f"TLS adds {extra:.0f} B per idle connection to Clarion")
    if args.sse:
        ratio = med("clarion-sse", "rss_per_conn") / med("clarion", "rss_per_conn")
        print(f"clarion SSE / WebSocket memory per connection: {ratio:.2f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


def h2_main(args):
    """--h2: HTTP/1.1 SSE over TLS against HTTP/2 with one stream per connection (-n of each),
    then --h2-conns connections of one stream against as many of --h2-streams streams; every
    kind once per repeat, interleaved."""
    one, many = clarion_h2(1), clarion_h2(args.h2_streams)
    plan = [(ClarionSSETLS, args.connections, "h1"), (one, args.connections, "h2"),
            (one, args.h2_conns, "h2-x1"), (many, args.h2_conns, f"h2-x{args.h2_streams}")]
    results = {tag: [] for _, _, tag in plan}
    for r in range(args.repeats):
        for cls, n, tag in plan:
            res = run_once(cls, n, args.client_procs, args.idle_seconds, args.burst, args.settle)
            results[tag].append(res)
            print(f"[{r + 1}/{args.repeats}] {tag} ({res['connections']} connections, "
                  f"{res['subscribers']} streams): {res['rss_per_conn']:.0f} B/conn idle, "
                  f"{res['rss_per_conn_after_burst']:.0f} after burst, "
                  f"idle CPU {res['idle_cpu_ms']:.0f} ms, "
                  f"delivered {res['delivered']}/{res['expected']}", flush=True)

    def med(tag, key):
        return statistics.median(x[key] for x in results[tag])

    print(f"\nmedians over {args.repeats} runs (TLS 1.3):")
    print(f"{'run':<10} {'conns':>6} {'streams':>8} {'B/conn idle':>12} {'B/conn burst':>13} "
          f"{'idle CPU ms':>12} {'connects/s':>11} {'delivered':>10}")
    for tag in results:
        print(f"{tag:<10} {med(tag, 'connections'):>6.0f} {med(tag, 'subscribers'):>8.0f} "
              f"{med(tag, 'rss_per_conn'):>12.0f} {med(tag, 'rss_per_conn_after_burst'):>13.0f} "
              f"{med(tag, 'idle_cpu_ms'):>12.0f} {med(tag, 'connect_rate'):>11.0f} "
              f"{min(x['delivered'] / x['expected'] for x in results[tag]):>10.2%}")
    ratio = med("h2", "rss_per_conn") / med("h1", "rss_per_conn")
    print(f"HTTP/2 connection with one SSE stream / HTTP/1.1 SSE connection, TLS: {ratio:.2f} "
          f"(goal <= 1.15, issue 53)")
    # Per repeat, so each difference is of two runs close in time; then the median.
    extra = [(m["idle_rss"] - m["base_rss"] - (o["idle_rss"] - o["base_rss"]))
             / (m["subscribers"] - o["subscribers"])
             for o, m in zip(results["h2-x1"], results[f"h2-x{args.h2_streams}"])]
    print(f"each additional idle stream: {statistics.median(extra):.0f} B "
          f"(per repeat: {', '.join(f'{x:.0f}' for x in extra)}; goal <= 200)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"results": results, "h2_over_h1_tls": ratio, "bytes_per_extra_stream": extra},
            indent=1))


if __name__ == "__main__":
    main()
