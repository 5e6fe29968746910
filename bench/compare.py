#!/usr/bin/env python3
"""Clarion side by side with its peers: the same `clarion bench` run against each server in
turn, and a table of ratios against Clarion.

    bash bench/peers/setup.sh                        # once: installs the peers
    cargo build --release
    python3 bench/compare.py --scenario idle -n 15000 --repeats 3
    python3 bench/compare.py --scenario burst -n 5000 --repeats 3
    python3 bench/compare.py --scenario burst -n 5000 --transport sse --peers clarion,pushpin,nchan
    python3 bench/compare.py --scenario idle -n 15000 --transport sse --peers clarion-grip,pushpin
    CLARION_REF_BIN=/tmp/old/clarion python3 bench/compare.py --scenario burst --peers clarion,clarion-ref

For every repeat, every server in turn (interleaved, so drift on a shared machine hits all
alike; the order rotates from one repeat to the next, so that no server always runs first or
last: an A/A run of one binary against a copy of itself, always in the same order, measured the
second 0.92x the deliveries/s and 1.14x the CPU per delivery over 5 burst repeats): start it on its own loopback ports with a fresh state, run
`clarion bench --scenario S -n N --transport T --server-pid PIDS --json FILE`, stop it. PIDS
are every process of the server (nginx's master and workers, Pushpin's runner and the
processes it starts), summed; the helper processes some peers need (the translator from
Clarion's publish batch to their publish API, Pushpin's GRIP backend) are not counted.

`clarion-grip` is Clarion as a GRIP proxy in Pushpin's place: `clarion serve --grip-routes`
in front of the same backend (grip_backend.py, routes `* 127.0.0.1:PORT`), the clients on the
same URL (`/sse?topic=T`, held by the backend's `Grip-Hold: stream`), publishes through the
same translator into Clarion's Pushpin-compatible `POST /publish/`. With `clarion-grip` among
the peers, ratios are against it when plain `clarion` is not in the run.

`clarion-ref` is another build of Clarion, given by the `CLARION_REF_BIN` environment variable
(say, a release build of the commit before a change), run with the same flags as `clarion`: a
before/after comparison of a change in one run, under the same machine noise. It is skipped with
a note when the variable is not set. Every run's load comes from `clarion bench` of the build
under test (`CLARION_BIN`), so a change to the server is measured with one load generator; with
`--ref-client`, `clarion-ref`'s runs use the reference build's own `clarion bench` instead, for a
change to the load generator itself (its CPU is the "client CPU-s / 1M" column):

    CLARION_REF_BIN=/tmp/before/clarion python3 bench/compare.py --scenario ticker -n 15000 \
        --repeats 3 --peers clarion,clarion-ref --ref-client -- -m 30 --interval-ms 500 --size 32 `clarion-send` and `clarion-uring` are the same binary as
`clarion` with `--io-uring=false` (every delivery its own `send`) and `--io-uring=true` (a
fan-out submitted through io_uring, the default).

`clarion-h2` is Clarion with its subscribers as HTTP/2 streams, one per connection (the bench's
`--http2`: h2c with prior knowledge): SSE streams with `--transport sse`, WebSockets over RFC 8441
(extended CONNECT) with `--transport ws`; `clarion-h2-mux` puts `--h2-streams` of them (default
100) on each connection (`--streams-per-conn`), so `-n 15000` is 150 connections. `clarion-tls`,
`clarion-h2-tls` and `clarion-h2-mux-tls` are the same over TLS 1.3 (a `clarion cert --dev`
certificate made for the run; ALPN chooses h2), the way browsers speak HTTP/2.
`clarion-ref-h2-mux` is `clarion-h2-mux` served by the reference build (`CLARION_REF_BIN`), for
a before/after of the HTTP/2 path, `clarion-ref-h2-tls` is `clarion-h2-tls` served by it (the
same at one stream per TLS connection), and `clarion-ref-tls` is `clarion-tls` served by it, for a
before/after of the TLS path. HTTP/1.1 SSE against HTTP/2 (issue 32):

    python3 bench/compare.py --scenario burst -n 15000 --repeats 3 --transport sse \
        --peers clarion,clarion-h2,clarion-h2-mux --clarion-flags '--max-connections 40000'

(An HTTP/2 connection and each of its streams both count against `max_connections`, by
default the open-files limit less 64: 15,000 connections of one stream need 30,000, hence
`--clarion-flags`, which every Clarion variant gets.)

`uws-cpp` is µWebSockets C++ itself (bench/peers/uws_server.cpp), built at run time by
bench/peers/build_uws.sh from a checkout of uNetworking/uWebSockets (and uSockets) named by
`UWS_SRC` (and `USOCKETS_SRC`), outside this repository; skipped with a note when they are not
set. `centrifuge` is github.com/centrifugal/centrifuge, the Go library Centrifugo is built on
(bench/peers/centrifuge/, fetched from the Go module proxy and built at run time; skipped when
`go` is missing): its clients send `{"id":1,"connect":{}}` (the bench's `--ws-hello`) and are
subscribed server-side.

A peer may name its thread count after `@`: `clarion@1` is `clarion serve --workers 1`,
`uws-cpp@2` runs two µWebSockets event loops, `centrifuge@1` sets GOMAXPROCS=1 (also
`clarion-ref@N`). Without it each runs as it does by default (Clarion: one worker per core;
µWebSockets: one loop; Centrifuge: GOMAXPROCS = cores). Compare peers at equal counts:

    UWS_SRC=/work/peers/uWebSockets python3 bench/compare.py --scenario ticker -n 15000 \
        --repeats 3 --peers clarion,clarion@1,uws-cpp@1,uws-cpp@2,centrifuge@1,centrifuge@2 \
        -- -m 30 --interval-ms 500 --size 32

`clarion-cluster@P` is Clarion as P processes joined by a private Redis (`--processes P
--broker`, default 3); `clarion-rcluster@P` the same over a private Redis Cluster of three
masters (`--broker redis+cluster://...`); `uws-cpp-group@P` is P µWebSockets C++ processes, one loop each, sharing
the client port with SO_REUSEPORT, each told of every publish by `translator.py fanout` (a
helper, not counted; Redis's CPU is reported apart). Use them past one process's open-files
limit, e.g. the ticker to 100,000:

    UWS_SRC=/work/peers/uWebSockets python3 bench/compare.py --scenario ticker -n 100000 \
        --repeats 3 --peers clarion-cluster@6,uws-cpp-group@6 -- -m 20 --interval-ms 1000

`clarion-cluster-tls@P` and `uws-cpp-group-tls@P` are the same groups serving their clients over
TLS 1.3 (a `clarion cert --dev` certificate; µWebSockets built with OpenSSL by
`build_uws.sh --tls`): the Raspberry Pi seed "100k secure WebSockets and a 2-second ticker" is

    UWS_SRC=/work/peers/uWebSockets python3 bench/compare.py --scenario ticker -n 100000 \
        --repeats 3 --peers clarion-cluster-tls@6,uws-cpp-group-tls@6 -- -m 30 --interval-ms 2000

Besides the server's CPU per delivery, the table gives the load client's CPU per message it
received over the same window ("client CPU-s / 1M"): on two cores a client as costly as the
server takes the cores from it. And how often the client's workers were woken per thousand
messages ("client wake-ups / 1k"): over loopback the server's sends wake them, and pay for it,
so two runs that differ in wake-ups differ in server CPU for a reason that is not the server's
(docs/benchmarks.md, "The publishing window, and the clients' wake-ups"). A ticker's table
adds the "p50 floor": half of a round's CPU, the server's and the client's, over the machine's
cores (over the server's threads when it names fewer with `@N`), below which its p50 cannot go
while both share the cores (docs/benchmarks.md, "What sets the ticker's p50"). Under each
table, the ratios to Clarion by pairs: each repeat's own ratio (the servers take turns within
a repeat), their median and range, for the CPU per delivery, the p50 and the p99.

`--watch PATH` keeps one `curl -N http://API/PATH` open on the API listener of each peer named in
`--watch-peers` (default `clarion`) for the whole of its runs, and closes it after: the cost of a
long-lived reader of the API, such as the dashboard's feed, measured against the same server
without it. Compare `--watch /dashboard/feed --peers clarion,clarion-ref` (the feed open on the
new build only) with a run without `--watch`.

Scenarios are clarion bench's: idle (here opened in steps, 1,000 / 5,000 / N, with memory per
connection at each), burst, ticker, topics, churn. Peers that cannot serve a transport are
skipped with a note. Writes --out-json (every run) and --out-md (the table of medians).
"""

import argparse
import hashlib
import json
import os
import pathlib
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from compare_table import fmt, median, metrics, table

ROOT = pathlib.Path(__file__).resolve().parents[1]
PEERS_DIR = ROOT / "bench" / "peers"
ENV = PEERS_DIR / ".env"
CLARION = pathlib.Path(os.environ.get("CLARION_BIN") or ROOT / "target" / "release" / "clarion")
CLARION_REF = pathlib.Path(os.environ["CLARION_REF_BIN"]) if os.environ.get("CLARION_REF_BIN") \
    else None
VENV_PY = ENV / "venv" / "bin" / "python"
ALL = ["clarion", "uws", "socketify", "ws", "socketio", "websockets", "pushpin", "nchan",
       "clarion-grip", "clarion-ref", "clarion-send", "clarion-uring", "clarion-durable",
       "clarion-durable-sync", "clarion-redis", "clarion-cluster", "clarion-rcluster",
       "uws-cpp", "uws-cpp-group", "centrifuge", "clarion-h2", "clarion-h2-mux", "clarion-tls",
       "clarion-h2-tls", "clarion-h2-mux-tls", "clarion-ref-h2-mux", "clarion-ref-tls",
       "clarion-ref-h2-tls",
       "clarion-cluster-tls", "uws-cpp-group-tls"]
TRANSPORTS = {
    "clarion": {"ws", "sse"}, "uws": {"ws"}, "socketify": {"ws"}, "ws": {"ws"},
    "socketio": {"ws"}, "websockets": {"ws"}, "pushpin": {"sse"}, "nchan": {"ws", "sse"},
    "clarion-grip": {"sse"}, "clarion-ref": {"ws", "sse"}, "clarion-send": {"ws", "sse"},
    "clarion-uring": {"ws", "sse"}, "clarion-durable": {"ws", "sse"},
    "clarion-durable-sync": {"ws", "sse"},
    "clarion-redis": {"ws", "sse"}, "clarion-cluster": {"ws", "sse"},
    "clarion-rcluster": {"ws", "sse"}, "uws-cpp": {"ws"},
    "uws-cpp-group": {"ws"}, "centrifuge": {"ws"},
    "clarion-h2": {"ws", "sse"}, "clarion-h2-mux": {"ws", "sse"}, "clarion-tls": {"ws", "sse"},
    "clarion-h2-tls": {"ws", "sse"}, "clarion-h2-mux-tls": {"ws", "sse"},
    "clarion-ref-h2-mux": {"ws", "sse"}, "clarion-ref-tls": {"ws", "sse"},
    "clarion-ref-h2-tls": {"ws", "sse"},
    "clarion-cluster-tls": {"ws", "sse"}, "uws-cpp-group-tls": {"ws"},
}
LABELS = {
    "clarion": "Clarion", "uws": "uWebSockets.js (npm uwebsockets)",
    "socketify": "socketify (µWebSockets in CPython)", "ws": "Node ws",
    "socketio": "Socket.IO (websocket transport)", "websockets": "Python websockets",
    "pushpin": "Pushpin (GRIP stream, all processes)", "nchan": "nchan (nginx, all processes)",
    "clarion-grip": "Clarion GRIP proxy (GRIP stream)",
    "clarion-ref": "Clarion, reference build (CLARION_REF_BIN)",
    "clarion-send": "Clarion, one send per delivery (--io-uring=false)",
    "clarion-uring": "Clarion, fan-outs through io_uring (--io-uring)",
    "clarion-durable": "Clarion, history on disk (--history-dir, fsync every 1 s)",
    "clarion-durable-sync": "Clarion, history on disk, fsync before every ack (--history-fsync-ms 0)",
    "clarion-redis": "Clarion, one process with a Redis broker",
    "clarion-cluster": "Clarion, processes joined by Redis (--processes)",
    "clarion-rcluster": "Clarion, processes joined by a Redis Cluster of 3 masters (--processes)",
    "uws-cpp": "µWebSockets C++ (built from its repository)",
    "uws-cpp-group": "µWebSockets C++, a process per loop, each told of every publish",
    "uws-cpp-group-tls": "µWebSockets C++ with OpenSSL (TLS 1.3), a process per loop, each told "
                         "of every publish",
    "clarion-cluster-tls": "Clarion over TLS 1.3, processes joined by Redis (--processes)",
    "centrifuge": "Centrifuge (Go)",
    "clarion-h2": "Clarion, HTTP/2 (h2c), 1 stream per connection",
    "clarion-h2-mux": "Clarion, HTTP/2 (h2c), {streams} streams per connection",
    "clarion-tls": "Clarion, HTTP/1.1 over TLS 1.3",
    "clarion-h2-tls": "Clarion, HTTP/2 over TLS 1.3, 1 stream per connection",
    "clarion-h2-mux-tls": "Clarion, HTTP/2 over TLS 1.3, {streams} streams per connection",
    "clarion-ref-h2-mux": "Clarion, reference build (CLARION_REF_BIN), HTTP/2 (h2c), "
                          "{streams} streams per connection",
    "clarion-ref-tls": "Clarion, reference build (CLARION_REF_BIN), HTTP/1.1 over TLS 1.3",
    "clarion-ref-h2-tls": "Clarion, reference build (CLARION_REF_BIN), HTTP/2 over TLS 1.3, "
                          "1 stream per connection",
}
# Streams per connection of the -mux peers (--h2-streams).
H2_STREAMS = 100
# More `clarion serve` flags for every Clarion variant (--clarion-flags).
CLARION_FLAGS = []
# Peers that run with a private redis-server (its CPU is reported apart from the server's).
WITH_REDIS = {"clarion-redis", "clarion-cluster", "clarion-rcluster", "clarion-cluster-tls"}
# Peers that take a thread count after `@`.
THREADED = {"clarion", "clarion-ref", "clarion-send", "clarion-uring", "clarion-durable",
            "clarion-durable-sync", "uws-cpp", "centrifuge", "clarion-h2", "clarion-h2-mux",
            "clarion-tls", "clarion-h2-tls", "clarion-h2-mux-tls", "clarion-ref-h2-mux",
            "clarion-ref-tls", "clarion-ref-h2-tls"}
# Peers that are the Clarion binary with extra flags.
CLARION_VARIANTS = ("clarion", "clarion-ref", "clarion-send", "clarion-uring", "clarion-durable",
                    "clarion-durable-sync", "clarion-h2", "clarion-h2-mux", "clarion-tls",
                    "clarion-h2-tls", "clarion-h2-mux-tls", "clarion-ref-h2-mux", "clarion-ref-tls",
                    "clarion-ref-h2-tls")
# The peers run by the reference build (CLARION_REF_BIN).
CLARION_REFS = {"clarion-ref", "clarion-ref-h2-mux", "clarion-ref-tls", "clarion-ref-h2-tls"}
# Clarion peers served over TLS: the client port is the TLS listener (clear text on port + 2).
CLARION_TLS = {"clarion-tls", "clarion-h2-tls", "clarion-h2-mux-tls", "clarion-cluster-tls",
               "clarion-ref-tls", "clarion-ref-h2-tls"}
# Peers whose clients connect over TLS 1.3 with the run's development certificate.
SERVED_TLS = CLARION_TLS | {"uws-cpp-group-tls"}
# What the load generator adds for a peer that speaks HTTP/2.
H2_FLAGS = {"clarion-h2": [], "clarion-h2-tls": [], "clarion-h2-mux": ["mux"],
            "clarion-h2-mux-tls": ["mux"], "clarion-ref-h2-mux": ["mux"], "clarion-ref-h2-tls": []}
# Peers that take a process count after `@` (default 3), one event loop each: past one
# process's open-files limit (20,000 here), a server is several processes.
GROUPS = {"clarion-cluster", "clarion-rcluster", "uws-cpp-group", "clarion-cluster-tls",
          "uws-cpp-group-tls"}
GROUP_SIZE = 3
# What a client of the peer says first, once its WebSocket is open (`clarion bench --ws-hello`).
HELLO = {"centrifuge": '{"id":1,"connect":{}}'}
UWS_BIN = ENV / "uws_server"
UWS_TLS_BIN = ENV / "uws_server_tls"
CENTRIFUGE_BIN = ENV / "centrifuge-peer"


def split_peer(spec):
    """`name@threads` -> (name, threads or None)."""
    name, _, threads = spec.partition("@")
    if threads and (name not in THREADED | GROUPS or not threads.isdigit() or int(threads) < 1):
        raise SystemExit(f"{spec}: a thread or process count is for "
                         f"{', '.join(sorted(THREADED | GROUPS))} only")
    return name, int(threads) if threads else None


def label(spec):
    name, threads = split_peer(spec)
    text = LABELS[name].replace("{streams}", str(H2_STREAMS))
    if name in GROUPS:
        return f"{text}, {threads or GROUP_SIZE} processes"
    if threads is None:
        return text
    return f"{text}, {threads} thread{'s' if threads > 1 else ''}"


def dev_cert(workdir):
    """ca.pem, cert.pem and key.pem from `clarion cert --dev`, made once per run."""
    d = pathlib.Path(workdir) / "cert"
    if not (d / "ca.pem").exists():
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(CLARION), "cert", "--dev", "--dir", str(d)], check=True,
                       capture_output=True)
    return d


def client_flags(base, workdir):
    """What `clarion bench` adds for peer `base`: TLS trust and HTTP/2."""
    flags = []
    if base in SERVED_TLS:
        flags += ["--tls-ca", str(dev_cert(workdir) / "ca.pem")]
    if base in H2_FLAGS:
        flags.append("--http2")
        if "mux" in H2_FLAGS[base]:
            flags += ["--streams-per-conn", str(H2_STREAMS)]
    return flags


def build_uws(tls=False):
    """Builds µWebSockets C++ from UWS_SRC into .env (with OpenSSL when `tls`); None when done,
    or why it was skipped."""
    if not os.environ.get("UWS_SRC"):
        return "skipped (set UWS_SRC to a checkout of github.com/uNetworking/uWebSockets)"
    argv = ["--tls", str(UWS_TLS_BIN)] if tls else [str(UWS_BIN)]
    r = subprocess.run(["sh", str(PEERS_DIR / "build_uws.sh"), *argv],
                       capture_output=True, text=True)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return f"skipped ({why})"
    return None


def build_centrifuge():
    """Builds the Centrifuge peer with the Go toolchain; None when done, or why it was skipped."""
    if not shutil.which("go"):
        return "skipped (no Go toolchain: https://go.dev/dl/)"
    ENV.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["go", "build", "-o", str(CENTRIFUGE_BIN), "."],
                       cwd=PEERS_DIR / "centrifuge", capture_output=True, text=True)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return f"skipped (go build failed: {why})"
    return None
# The per-process open-files limit here is 20,000 (hard); servers get all of it.
NOFILE = 20000


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else NOFILE
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, max(soft, NOFILE)), hard))


def descendants(pid):
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def wait_port(port, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


class Server:
    """One peer, started on (port, api): `main` is the server process (whose descendants are
    counted), `helpers` are not counted."""

    def __init__(self, spec, port, api, workdir):
        name, self.threads = split_peer(spec)
        self.name, self.port, self.api, self.workdir = name, port, api, workdir
        self.main, self.helpers, self.redis = None, [], None
        self.redis_cluster = []
        self.log = open(workdir / f"{spec}.log", "w")

    def spawn(self, argv, **kw):
        return subprocess.Popen([str(a) for a in argv], stdout=self.log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=raise_nofile,
                                start_new_session=True, **kw)

    def start(self):
        p, a, n = self.port, self.api, self.name
        if n in CLARION_VARIANTS:
            binary = CLARION_REF if n in CLARION_REFS else CLARION
            workers = ["--workers", self.threads] if self.threads else []
            plain = {"clarion-send": ["--io-uring=false"],
                     "clarion-uring": ["--io-uring=true"]}.get(n, [])
            if n.startswith("clarion-durable"):
                # A fresh, empty history directory for every start.
                hist = tempfile.mkdtemp(prefix=f"{n}-", dir=self.workdir)
                plain = ["--history-dir", hist]
                if n == "clarion-durable-sync":
                    plain += ["--history-fsync-ms", "0"]
            listen = p
            if n in CLARION_TLS:
                d = dev_cert(self.workdir)
                listen = p + 2
                plain = ["--tls-listen", f"127.0.0.1:{p}", "--tls-cert", d / "cert.pem",
                         "--tls-key", d / "key.pem"]
            self.main = self.spawn([binary, "serve", "--listen", f"127.0.0.1:{listen}",
                                    "--api-listen", f"127.0.0.1:{a}",
                                    "--max-connections-per-address", 0, *workers, *plain,
                                    *CLARION_FLAGS])
        elif n == "uws-cpp":
            self.main = self.spawn([UWS_BIN, p, a, self.threads or 1])
        elif n in ("uws-cpp-group", "uws-cpp-group-tls"):
            # Every process takes clients on the shared port (uSockets listens with
            # SO_REUSEPORT) and publishes on its own API port (api + 5000 + i, away from the
            # other peers' PORT_BASE + 10 i); the translator on the API port hands each publish
            # batch to all of them (a helper, not counted). One shell is the parent of the
            # group, so the group's CPU is its descendants'. The -tls group serves its clients
            # over TLS with the run's development certificate (its API stays clear text).
            ports = [a + 5000 + i for i in range(self.threads or GROUP_SIZE)]
            tls = ""
            if n == "uws-cpp-group-tls":
                d = dev_cert(self.workdir)
                tls = f' "{d / "cert.pem"}" "{d / "key.pem"}"'
            group = " & ".join(f'"$0" {p} {q} 1{tls}' for q in ports) + " & wait"
            self.main = self.spawn(["sh", "-c", group,
                                    UWS_TLS_BIN if n == "uws-cpp-group-tls" else UWS_BIN])
            for q in ports:
                wait_port(q)
            self.helpers.append(self.spawn([sys.executable, PEERS_DIR / "translator.py",
                                            "fanout", a, ",".join(map(str, ports))]))
        elif n == "centrifuge":
            self.main = self.spawn([CENTRIFUGE_BIN, p, a, *([self.threads] if self.threads else [])])
        elif n == "clarion-rcluster":
            # Three cluster masters on api + 5..7 (no replicas, no persistence), made into one
            # Redis Cluster; the broker URL names them as seeds.
            ports = [a + 5 + i for i in range(3)]
            for q in ports:
                d = pathlib.Path(self.workdir) / f"rc{q}"
                d.mkdir(exist_ok=True)
                (d / "nodes.conf").unlink(missing_ok=True)  # a new cluster every run
                self.redis_cluster.append(self.spawn(
                    ["redis-server", "--port", q, "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no", "--cluster-enabled", "yes",
                     "--cluster-config-file", d / "nodes.conf"], cwd=d))
                wait_port(q)
            subprocess.run(["redis-cli", "--cluster", "create",
                            *[f"127.0.0.1:{q}" for q in ports], "--cluster-yes"],
                           stdout=self.log, stderr=subprocess.STDOUT, check=True, timeout=60)
            for _ in range(200):
                info = subprocess.run(["redis-cli", "-p", str(ports[0]), "cluster", "info"],
                                      capture_output=True, text=True).stdout
                if "cluster_state:ok" in info:
                    break
                time.sleep(0.05)
            self.main = self.spawn([CLARION, "serve", "--listen", f"127.0.0.1:{p}",
                                    "--api-listen", f"127.0.0.1:{a}",
                                    "--max-connections-per-address", 0,
                                    "--processes", self.threads or GROUP_SIZE,
                                    "--broker", "redis+cluster://"
                                    + ",".join(f"127.0.0.1:{q}" for q in ports)])
        elif n in WITH_REDIS:
            # Redis on api + 5, without persistence: the broker's own cost, not the disk's.
            self.redis = self.spawn(["redis-server", "--port", a + 5, "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no"], cwd=self.workdir)
            wait_port(a + 5)
            extra = ["--processes", self.threads or GROUP_SIZE] \
                if n in ("clarion-cluster", "clarion-cluster-tls") else []
            listen = p
            if n in CLARION_TLS:
                d = dev_cert(self.workdir)
                listen = p + 2
                extra += ["--tls-listen", f"127.0.0.1:{p}", "--tls-cert", d / "cert.pem",
                          "--tls-key", d / "key.pem"]
            self.main = self.spawn([CLARION, "serve", "--listen", f"127.0.0.1:{listen}",
                                    "--api-listen", f"127.0.0.1:{a}",
                                    "--max-connections-per-address", 0,
                                    "--broker", f"redis://127.0.0.1:{a + 5}", *extra])
        elif n in ("ws", "socketio", "uws"):
            self.main = self.spawn(["node", PEERS_DIR / "node_server.js", n, p, a])
        elif n in ("websockets", "socketify"):
            self.main = self.spawn([VENV_PY, PEERS_DIR / "py_server.py", n, p, a])
        elif n == "pushpin":
            self.start_pushpin()
        elif n == "clarion-grip":
            self.start_clarion_grip()
        elif n == "nchan":
            self.start_nchan()
        else:
            raise SystemExit(f"unknown peer {n}")
        ok = wait_port(p) and wait_port(a)
        time.sleep(1.0)  # multi-process servers: let every process finish starting
        if not ok or self.main.poll() is not None:
            self.stop()
            raise RuntimeError(f"{n} did not start; see {self.log.name}")

    def start_pushpin(self):
        # Ports: the backend on api + 2, Pushpin's publish API on api + 4 and its other ZeroMQ
        # ports next to it (instead of the system's 5560 to 5563).
        backend, publish = self.api + 2, self.api + 4
        run = self.workdir / "pushpin"
        (run / "run").mkdir(parents=True, exist_ok=True)
        (run / "log").mkdir(exist_ok=True)
        (run / "routes").write_text(f"* 127.0.0.1:{backend}\n")
        conf = pathlib.Path("/etc/pushpin/pushpin.conf").read_text()
        conf = (conf.replace("rundir=/var/run/pushpin", f"rundir={run / 'run'}")
                .replace("logdir=/var/log/pushpin", f"logdir={run / 'log'}")
                .replace("http_port=7999", f"http_port={self.port}")
                .replace("client_maxconn=50000", "client_maxconn=19000")
                # Defaults cap deliveries at 2,500/s and queue 25,000, dropping the rest of a
                # burst; raised so the benchmark measures the cost of delivering everything.
                .replace("message_rate=2500", "message_rate=1000000")
                .replace("message_hwm=25000", "message_hwm=1000000")
                # Requests to the origin go through zurl, a system service by default: the
                # runner starts its own here.
                .replace("services=condure,pushpin-proxy,pushpin-handler",
                         "services=condure,zurl,pushpin-proxy,pushpin-handler")
                .replace("[proxy]\n", "[proxy]\n"
                         "zurl_out_specs=ipc://{rundir}/{ipc_prefix}zurl-in\n"
                         "zurl_out_stream_specs=ipc://{rundir}/{ipc_prefix}zurl-in-stream\n"
                         "zurl_in_specs=ipc://{rundir}/{ipc_prefix}zurl-out\n")
                .replace("routesfile=routes", f"routesfile={run / 'routes'}")
                .replace("push_in_spec=tcp://127.0.0.1:5560",
                         f"push_in_spec=tcp://127.0.0.1:{self.api + 3}")
                .replace("push_in_http_port=5561", f"push_in_http_port={publish}")
                .replace("push_in_sub_specs=tcp://127.0.0.1:5562",
                         f"push_in_sub_specs=tcp://127.0.0.1:{self.api + 5}")
                .replace("command_spec=tcp://127.0.0.1:5563",
                         f"command_spec=tcp://127.0.0.1:{self.api + 6}")
                .replace("log_level=2", f"log_level={os.environ.get('PUSHPIN_LOG_LEVEL', '2')}"))
        (run / "pushpin.conf").write_text(conf)
        self.helpers.append(self.spawn([sys.executable, PEERS_DIR / "grip_backend.py", backend]))
        self.main = self.spawn(["pushpin", "--config", run / "pushpin.conf"])
        wait_port(publish)
        self.helpers.append(self.spawn([sys.executable, PEERS_DIR / "translator.py", "pushpin",
                                        self.api, publish]))
        # Pushpin's processes find each other over ZeroMQ after they listen: until a stream
        # request goes through, early clients get 502. Wait for one to.
        self.wait_stream()

    def wait_stream(self, seconds=30):
        """Waits until a GRIP stream request through the proxy answers 200."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    s.sendall(b"GET /sse?topic=warmup HTTP/1.1\r\nHost: x\r\n\r\n")
                    if s.recv(64).startswith(b"HTTP/1.1 200"):
                        return True
            except OSError:
                pass
            time.sleep(0.3)
        return False

    def start_clarion_grip(self):
        # Ports: clients on port, the translator (what the bench publishes to) on api, the
        # backend on api + 1, Clarion's own API (Pushpin's /publish/) on api + 2.
        backend, clarion_api = self.api + 1, self.api + 2
        routes = self.workdir / "clarion-grip.routes"
        routes.write_text(f"* 127.0.0.1:{backend}\n")
        self.helpers.append(self.spawn([sys.executable, PEERS_DIR / "grip_backend.py", backend]))
        wait_port(backend)
        self.main = self.spawn([CLARION, "serve", "--listen", f"127.0.0.1:{self.port}",
                                "--api-listen", f"127.0.0.1:{clarion_api}",
                                "--grip-routes", routes, "--max-connections-per-address", 0])
        wait_port(clarion_api)
        self.helpers.append(self.spawn([sys.executable, PEERS_DIR / "translator.py", "pushpin",
                                        self.api, clarion_api]))
        wait_port(self.port)
        self.wait_stream()

    def start_nchan(self):
        pub = self.api + 2
        d = self.workdir / "nginx"
        d.mkdir(parents=True, exist_ok=True)
        (d / "nginx.conf").write_text(f"""
load_module /usr/lib/nginx/modules/ngx_nchan_module.so;
user root;
daemon off;
worker_processes 2;
worker_rlimit_nofile 19500;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 19000; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  nchan_shared_memory_size 256M;
  server {{
    listen 127.0.0.1:{self.port} backlog=4096;
    location = /ws {{ nchan_subscriber websocket; nchan_channel_id $arg_topic; }}
    location = /sse {{ nchan_subscriber eventsource; nchan_channel_id $arg_topic; }}
  }}
  server {{
    listen 127.0.0.1:{pub};
    location = /pub {{ nchan_publisher; nchan_channel_id $arg_id; }}
  }}
}}
""")
        self.main = self.spawn(["nginx", "-p", d, "-c", d / "nginx.conf"])
        wait_port(pub)
        self.helpers.append(self.spawn([sys.executable, PEERS_DIR / "translator.py", "nchan",
                                        self.api, pub]))

    def pids(self):
        return descendants(self.main.pid)

    def redis_cpu(self):
        """CPU seconds the private Redis (all its cluster masters) has used so far (None
        without one)."""
        procs = self.redis_cluster or ([self.redis] if self.redis is not None else [])
        if not procs:
            return None
        total = 0.0
        for proc in procs:
            try:
                fields = pathlib.Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1]
                utime, stime = fields.split()[11:13]
                total += (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
            except (OSError, ValueError, IndexError):
                return None
        return total

    def stop(self):
        if self.redis is not None:
            self.helpers.append(self.redis)
        self.helpers.extend(self.redis_cluster)
        for p in [self.main, *self.helpers]:
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for p in [self.main, *self.helpers]:
            if p is None:
                continue
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.log.close()


def planned_steps(args):
    return sorted({s for s in args.steps if s < args.n} | {args.n}) if args.scenario == "idle" \
        else []


def bench_args(args):
    a = ["--scenario", args.scenario, "-n", str(args.n)]
    if args.scenario == "idle":
        a += ["--steps", ",".join(map(str, planned_steps(args)))]
    if args.scenario == "churn":
        a += ["--rounds", str(args.rounds)]
    return a + args.bench_extra


def run_one(name, transport, args, port, workdir, tag):
    server = Server(name, port, port + 1, workdir)
    base, _ = split_peer(name)
    try:
        server.start()
    except (RuntimeError, OSError) as e:
        return {"error": str(e)}
    out = workdir / f"{tag}.json"
    pids = server.pids()
    watcher = None
    if args.watch and (name in args.watch_peers or base in args.watch_peers):
        # A reader of the API for the whole run (the dashboard's feed, say); not counted in the
        # server's CPU (curl is its own process), only what serving it costs the server is.
        watcher = subprocess.Popen(["curl", "-sN", "-o", "/dev/null",
                                    f"http://127.0.0.1:{port + 1}{args.watch}"],
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        time.sleep(1.5)
        if watcher.poll() is not None:
            server.stop()
            return {"error": f"--watch {args.watch}: curl exited with {watcher.returncode}"}
    # The load generator: the build under test's, or with --ref-client the reference build's own
    # for the reference's runs.
    client = CLARION_REF if args.ref_client and base == "clarion-ref" else CLARION
    cmd = [str(client), "bench", "--target", f"127.0.0.1:{port}", "--api", f"127.0.0.1:{port + 1}",
           "--server-pid", ",".join(map(str, pids)), "--transport", transport,
           *(["--ws-hello", HELLO[base]] if base in HELLO else []),
           *client_flags(base, workdir),
           # Source addresses of this run's own (127.0.0.B and up), away from the .2 and .3
           # that another `clarion bench` on the machine uses by default.
           "--source-base", str(args.source_base),
           "--json", str(out), *bench_args(args)]
    started = time.time()
    redis_before = server.redis_cpu()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        text = proc.stdout + proc.stderr
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        text, rc = f"timed out after {args.timeout} s", -1
    finally:
        redis_after = server.redis_cpu()
        if watcher is not None:
            watcher.terminate()
            watcher.wait()
        server.stop()
    result = {"cmd": " ".join(cmd), "returncode": rc, "seconds": round(time.time() - started, 1),
              "pids": len(pids), "output": text[-3000:]}
    if redis_before is not None and redis_after is not None:
        result["redis_cpu_s"] = round(redis_after - redis_before, 2)
    if rc == 0 and out.exists():
        result["bench"] = json.loads(out.read_text())
        result["bench"].pop("samples", None)
    else:
        result["error"] = text.strip().splitlines()[-1] if text.strip() else f"exit {rc}"
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", choices=["burst", "idle", "ticker", "topics", "churn"],
                    default="burst")
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--peers", default=",".join(ALL))
    ap.add_argument("--transport", default="ws", help="ws, sse, or ws,sse")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--steps", default="1000,5000,15000", help="idle: connection steps")
    ap.add_argument("--rounds", type=int, default=3, help="churn: connect/disconnect cycles")
    ap.add_argument("--timeout", type=int, default=400, help="seconds per bench run")
    ap.add_argument("--ref-client", action="store_true",
                    help="clarion-ref's runs use CLARION_REF_BIN's own clarion bench as the load "
                         "generator (a change to the bench itself)")
    ap.add_argument("--out-json", default=None)
    ap.add_argument("--out-md", default=None)
    ap.add_argument("--watch", default=None, metavar="PATH",
                    help="keep `curl -N` open on this API path during runs (e.g. /dashboard/feed)")
    ap.add_argument("--watch-peers", default="clarion",
                    help="peers whose runs --watch applies to (comma-separated)")
    ap.add_argument("--port-base", type=int, default=19000,
                    help="peer i listens on PORT_BASE + 10 i and the next ports (default 19000)")
    ap.add_argument("--source-base", type=int, default=100,
                    help="the bench's clients connect from 127.0.0.B and up (default 100)")
    ap.add_argument("--clarion-flags", default="",
                    help="more `clarion serve` flags for every Clarion variant (clarion, "
                         "clarion-ref, clarion-h2, ...), e.g. '--max-connections 40000'")
    ap.add_argument("--h2-streams", type=int, default=100,
                    help="SSE streams per connection of clarion-h2-mux and clarion-h2-mux-tls")
    ap.add_argument("--table-from", help="print the table of an earlier --out-json, run nothing")
    ap.add_argument("bench_extra", nargs="*", help="more clarion bench flags, after --")
    args = ap.parse_args()
    args.steps = [int(s) for s in args.steps.split(",") if s]
    args.transports = [t for t in args.transport.split(",") if t]
    args.watch_peers = [p for p in args.watch_peers.split(",") if p]
    args.cores = os.cpu_count()
    global H2_STREAMS
    H2_STREAMS = args.h2_streams
    CLARION_FLAGS.extend(shlex.split(args.clarion_flags))
    if args.table_from:
        saved = json.loads(pathlib.Path(args.table_from).read_text())
        args.scenario, args.n = saved["scenario"], saved["n"]
        args.steps = saved.get("steps", args.steps)
        H2_STREAMS = saved.get("h2_streams", H2_STREAMS)
        args.cores = (saved.get("machine") or {}).get("nproc") or args.cores
        results = {tuple(k.split("/")): v for k, v in saved["runs"].items()}
        args.transports = list(dict.fromkeys(t for _, t in results))
        print(table(args, results, saved.get("notes", []), planned_steps(args), split_peer,
                    label))
        return
    peers = [p for p in args.peers.split(",") if p]
    if not CLARION.exists():
        raise SystemExit("build first: cargo build --release")
    notes, plan = [], []
    for p in peers:
        if split_peer(p)[0] not in TRANSPORTS:
            raise SystemExit(f"unknown peer {p}; known: {','.join(ALL)}")
    # Peers built at run time, from sources outside the repository or the Go module proxy.
    builders = {"uws-cpp": build_uws, "uws-cpp-group": build_uws,
                "uws-cpp-group-tls": lambda: build_uws(tls=True), "centrifuge": build_centrifuge}
    unbuilt = {}
    for b in dict.fromkeys(split_peer(p)[0] for p in peers):
        if b in builders:
            print(f"building {b} ...", flush=True)
            why = builders[b]()
            if why:
                unbuilt[b] = why
                notes.append(f"{LABELS[b]}: {why}")
    for t in args.transports:
        for i, p in enumerate(peers):
            base = split_peer(p)[0]
            if base in unbuilt:
                continue
            if base in CLARION_REFS and CLARION_REF is None:
                if t == args.transports[0]:
                    notes.append(f"{label(p)}: skipped (CLARION_REF_BIN is not set)")
                continue
            if base in CLARION_REFS and not CLARION_REF.exists():
                raise SystemExit(f"CLARION_REF_BIN: no such file: {CLARION_REF}")
            if t not in TRANSPORTS[base]:
                notes.append(f"{label(p)}: skipped for {t.upper()} (it does not serve it here)")
                continue
            plan.append((p, t, args.port_base + 10 * i))
    # The Node and Python peers live in bench/peers/.env; Pushpin and nchan are Debian packages.
    system = {"pushpin": "pushpin", "nchan": "nginx"}
    built = (*CLARION_VARIANTS, "clarion-grip", *WITH_REDIS, *builders)
    missing = [p for p, _, _ in plan if split_peer(p)[0] not in built
               and (not shutil.which(system[p]) if p in system else not ENV.exists())]
    if missing:
        raise SystemExit("peers are not installed: bash bench/peers/setup.sh")
    binary_at_start = hashlib.sha256(CLARION.read_bytes()).hexdigest()[:16]
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="clarion-compare-"))
    results = {(p, t): [] for p, t, _ in plan}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_json = pathlib.Path(args.out_json or f"compare-{args.scenario}-{stamp}.json")
    out_md = pathlib.Path(args.out_md or out_json.with_suffix(".md"))
    for rep in range(args.repeats):
        turn = rep % len(plan)
        for p, t, port in plan[turn:] + plan[:turn]:
            print(f"[{rep + 1}/{args.repeats}] {p} {t} ...", end=" ", flush=True)
            r = run_one(p, t, args, port, workdir, f"{p}-{t}-{rep}")
            results[(p, t)].append(r)
            if "bench" in r:
                m = metrics(r["bench"])
                print(f"{r['seconds']} s: {fmt(m['bytes_per_conn'])} B/conn, "
                      f"{fmt(m['cpu_per_million'], 1)} CPU-s/1M, lost {m['lost']}")
            else:
                print(f"FAILED: {r.get('error')}")
            time.sleep(2)  # let the kernel reap the closed sockets before the next server
    binary_at_end = hashlib.sha256(CLARION.read_bytes()).hexdigest()[:16]
    if binary_at_end != binary_at_start:
        notes.append(f"the clarion binary changed during the run ({binary_at_start} -> "
                      f"{binary_at_end}): repeats used different builds")
    for (p, t), runs in results.items():
        cpu = [r["redis_cpu_s"] for r in runs if "bench" in r and "redis_cpu_s" in r]
        if cpu:
            notes.append(f"{label(p)} {t.upper()}: Redis used {median(cpu):.2f} CPU-s per run "
                         f"(median of {len(cpu)})")
        bad = [r.get("error") for r in runs if "bench" not in r]
        if bad:
            notes.append(f"{label(p)} {t.upper()}: {len(bad)} of {len(runs)} runs failed: {bad[0]}")
    md = table(args, results, notes, planned_steps(args), split_peer, label)
    print(md)
    out_json.write_text(json.dumps({
        "scenario": args.scenario, "n": args.n, "repeats": args.repeats, "steps": args.steps,
        "h2_streams": H2_STREAMS,
        "machine": {"nproc": os.cpu_count(), "kernel": os.uname().release},
        "clarion_sha256": binary_at_start,
        "runs": {f"{p}/{t}": runs for (p, t), runs in results.items()}, "notes": notes,
    }, indent=1))
    if args.watch:
        md += f"\n\nDuring the runs of {', '.join(args.watch_peers)}, `curl -N` held {args.watch} open."
    out_md.write_text(md + "\n")
    print(f"\nwrote {out_json} and {out_md}")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
