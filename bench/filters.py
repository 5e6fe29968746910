#!/usr/bin/env python3
"""Filters at scale (issue 51, docs/filters.md): server CPU per delivery of a firehose topic
that N subscribers follow through 100 distinct filters, against the same messages split over
100 topics that the same subscribers follow without a filter.

For each mode (interleaved, repeated), starts Clarion, opens N plain WebSocket subscribers
from client processes on 127.0.0.2.. (at most 20,000 sockets each), subscriber i following
symbol `s{i % 100}`:

- `filter`: `/ws?topic=fire&filter=sym == "s{i % 100}"`; each message is published to `fire`
  with the tag `sym`;
- `topics`: `/ws?topic=t.s{i % 100}`; each message is published to its symbol's topic.

Then publishes R rounds of 100 messages (one per symbol, one batch `POST /publish` a round,
`--interval` apart): every message reaches N / 100 subscribers in both modes, so both deliver
the same R x N messages. Reports the server's CPU-seconds (user+system, /proc) per million
deliveries during the publish phase (medians), the ratio filter / topics, and
`clarion_filter_evaluations_total` (messages x distinct filters, not x subscribers).

    python3 bench/filters.py -n 15000 --rounds 40 --repeats 3
"""

import argparse
import base64
import json
import os
import pathlib
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from idle_memory import ROOT, cpu_seconds  # noqa: E402

SYMBOLS = 100
PAYLOAD = json.dumps({"px": 101.25, "qty": 1500, "pad": "x" * 150})


def path_for(mode, i):
    sym = f"s{i % SYMBOLS}"
    if mode == "filter":
        return "/ws?topic=fire&filter=" + urllib.parse.quote(f'sym == "{sym}"')
    return f"/ws?topic=t.{sym}"


def client_main(target, source, mode, first, count):
    host, port = target.rsplit(":", 1)
    socks = []
    for i in range(first, first + count):
        s = socket.socket()
        s.bind((source, 0))
        s.connect((host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(
            (f"GET {path_for(mode, i)} HTTP/1.1\r\nHost: {target}\r\nUpgrade: websocket\r\n"
             f"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n").encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        head, rest = head.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise SystemExit(f"refused: {head[:80]!r}")
        s.setblocking(False)
        socks.append([s, rest, 0])
    print(f"ready {len(socks)}", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] != "expect":
            break
        want, deadline = int(cmd[1]), time.monotonic() + float(cmd[2])
        sel = selectors.DefaultSelector()
        for c in socks:
            sel.register(c[0], selectors.EVENT_READ, c)
        got = 0
        while got < want and time.monotonic() < deadline:
            for key, _ in sel.select(0.2):
                c = key.data
                try:
                    data = c[0].recv(1 << 16)
                except BlockingIOError:
                    continue
                buf = c[1] + data
                while len(buf) >= 2:
                    n, at = buf[1] & 0x7F, 2
                    if n == 126:
                        if len(buf) < 4:
                            break
                        n, at = struct.unpack("!H", buf[2:4])[0], 4
                    if len(buf) < at + n:
                        break
                    if buf[0] & 0x0F in (1, 2):
                        got += 1
                    buf = buf[at + n:]
                c[1] = buf
        sel.close()
        print(f"got {got}", flush=True)


def run_once(mode, n, rounds, procs, interval):
    binary = os.environ.get("CLARION_BIN", str(ROOT / "target" / "release" / "clarion"))
    server = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
         "--max-connections-per-address", "0", "--max-connections", str(n + 100)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    clients = []
    try:
        fields = dict(p.split("=", 1) for p in server.stdout.readline().split()[2:])
        time.sleep(0.5)
        per = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        first = 0
        for i, c in enumerate(per):
            clients.append(subprocess.Popen(
                [sys.executable, __file__, "--client", fields["clients"], f"127.0.0.{2 + i}", mode, str(first), str(c)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            first += c
        for c in clients:
            c.stdout.readline()
        time.sleep(1)
        # Every subscriber gets one message of its symbol per round.
        expected = [rounds * c for c in per]
        for c, want in zip(clients, expected):
            c.stdin.write(f"expect {want} {60 + rounds * interval * 2}\n")
            c.stdin.flush()
        api = fields["api"]

        def evaluations():
            text = urllib.request.urlopen(f"http://{api}/metrics", timeout=30).read().decode()
            return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                       if ln.startswith("clarion_filter_evaluations_total"))

        ev0 = evaluations()
        cpu0 = cpu_seconds([server.pid])
        for r in range(rounds):
            batch = []
            for s in range(SYMBOLS):
                if mode == "filter":
                    batch.append({"topic": "fire", "data": PAYLOAD, "tags": {"sym": f"s{s}"}})
                else:
                    batch.append({"topic": f"t.s{s}", "data": PAYLOAD})
            req = urllib.request.Request(f"http://{api}/publish", data=json.dumps({"messages": batch}).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=30).read()
            time.sleep(interval)
        got = sum(int(c.stdout.readline().split()[1]) for c in clients)
        cpu = cpu_seconds([server.pid]) - cpu0
        ev = evaluations() - ev0
        return {"mode": mode, "delivered": got, "expected": sum(expected),
                "cpu_s_per_million": cpu / got * 1e6 if got else float("nan"), "evaluations": ev}
    finally:
        for c in clients:
            try:
                c.stdin.write("quit\n")
                c.stdin.flush()
            except OSError:
                pass
            c.wait(timeout=60)
        server.terminate()
        server.wait(timeout=60)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--connections", type=int, default=15000)
    ap.add_argument("--rounds", type=int, default=40, help="batches of 100 messages (one per symbol)")
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between batches")
    ap.add_argument("--client-procs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.connections > 20000 * args.client_procs:
        raise SystemExit("at most 20,000 sockets per client process: raise --client-procs")
    modes = ["topics", "filter"]
    results = {m: [] for m in modes}
    for r in range(args.repeats):
        for mode in modes:
            res = run_once(mode, args.connections, args.rounds, args.client_procs, args.interval)
            results[mode].append(res)
            print(f"[{r + 1}/{args.repeats}] {mode}: {res['cpu_s_per_million']:.2f} CPU-s/M deliveries, "
                  f"delivered {res['delivered']}/{res['expected']}, filter evaluations {res['evaluations']:.0f}",
                  flush=True)
    med = {m: statistics.median(x["cpu_s_per_million"] for x in results[m]) for m in modes}
    print(f"\nmedians over {args.repeats} runs; {args.connections} subscribers, {SYMBOLS} symbols, "
          f"{args.rounds} x {SYMBOLS} messages:")
    for m in modes:
        print(f"{m:<7} {med[m]:.2f} CPU-s per million deliveries")
    print(f"filter / topics: {med['filter'] / med['topics']:.2f} (per repeat: "
          + ", ".join(f"{f['cpu_s_per_million'] / t['cpu_s_per_million']:.2f}"
                      for f, t in zip(results["filter"], results["topics"])) + ")")


if __name__ == "__main__":
    main()
