#!/usr/bin/env python3
"""permessage-deflate benchmark: server CPU per million deliveries, bytes on the wire, and
memory per connection, with compression off, shared (the default) and dedicated.

For each mode (interleaved, repeated), starts Clarion, opens N WebSocket subscribers from
client processes on 127.0.0.2.. that offer `permessage-deflate; client_max_window_bits` (what a
browser sends), publishes M messages of about 1 KB of JSON (price ladders that change a little
from one message to the next), and has every client inflate and check every message it gets
(a run that loses or corrupts anything says so). Reports medians of:

- server CPU-seconds (user+system, /proc) per million deliveries during the publish phase;
- bytes on the wire per delivery (frame headers included);
- user-space bytes per idle connection after connecting, and per connection after the burst
  (dedicated mode allocates a compressor per connection at its first message).

    python3 bench/compression.py                     # 1,000 subscribers x 300 messages, 3 repeats
    python3 bench/compression.py -n 2000 -m 500 --repeats 5
"""

import argparse
import base64
import json
import os
import pathlib
import random
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import time
import urllib.request
import zlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from idle_memory import ROOT, cpu_seconds, rss  # noqa: E402

TOPIC = "ladder"


def message(i):
    rnd = random.Random(i // 10)  # ten messages in a row share most of their content
    ladder = [
        {"px": round(1.08 + j / 1e4 + rnd.random() / 1e5, 6), "qty": 1_000_000 + 1000 * j + i % 10}
        for j in range(27)
    ]
    return json.dumps({"type": "book", "symbol": "EURUSD", "seq": i, "bids": ladder})


# ---------------------------------------------------------------- client process


def client_main(target, source, count):
    host, port = target.rsplit(":", 1)
    conns = []
    for _ in range(count):
        s = socket.socket()
        s.bind((source, 0))
        s.connect((host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(
            (
                f"GET /ws?topic={TOPIC} HTTP/1.1\r\nHost: {target}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        head, rest = head.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise SystemExit(f"refused: {head[:60]!r}")
        ext = [l for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-extensions")]
        takeover = bool(ext) and b"server_no_context_takeover" not in ext[0]
        s.setblocking(False)
        conns.append({"sock": s, "buf": rest, "inflater": zlib.decompressobj(-15), "takeover": takeover,
                      "got": 0, "bytes": 0})
    print(f"ready {len(conns)} {int(bool(ext))}", flush=True)
    expected = None
    cache = {}
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "expect":
            n, deadline = int(cmd[1]), time.monotonic() + float(cmd[2])
            expected = [message(i).encode() for i in range(n)]
            sel = selectors.DefaultSelector()
            for c in conns:
                sel.register(c["sock"], selectors.EVENT_READ, c)
            bad = 0
            while time.monotonic() < deadline and any(c["got"] < n for c in conns):
                for key, _ in sel.select(0.2):
                    c = key.data
                    try:
                        data = c["sock"].recv(1 << 16)
                    except BlockingIOError:
                        continue
                    c["bytes"] += len(data)
                    c["buf"] += data
                    while True:
                        buf = c["buf"]
                        if len(buf) < 2:
                            break
                        ln, at = buf[1] & 0x7F, 2
                        if ln == 126:
                            if len(buf) < 4:
                                break
                            ln, at = struct.unpack("!H", buf[2:4])[0], 4
                        elif ln == 127:
                            if len(buf) < 10:
                                break
                            ln, at = struct.unpack("!Q", buf[2:10])[0], 10
                        if len(buf) < at + ln:
                            break
                        payload = buf[at:at + ln]
                        c["buf"] = buf[at + ln:]
                        if buf[0] & 0x40:
                            if c["takeover"]:
                                payload = c["inflater"].decompress(payload + b"\x00\x00\xff\xff")
                            else:
                                hit = cache.get(payload)
                                if hit is None:
                                    hit = zlib.decompressobj(-15).decompress(payload + b"\x00\x00\xff\xff")
                                    cache[payload] = hit
                                payload = hit
                        if c["got"] >= n or payload != expected[c["got"]]:
                            bad += 1
                        c["got"] += 1
            sel.close()
            got = sum(min(c["got"], n) for c in conns)
            print(f"got {got} {sum(c['bytes'] for c in conns)} {bad}", flush=True)
        elif cmd[0] == "quit":
            break


# ---------------------------------------------------------------- driver


def run_once(mode, n, m, procs):
    binary = os.environ.get("CLARION_BIN", str(ROOT / "target" / "release" / "clarion"))
    server = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
         "--max-connections-per-address", "0", "--compression", mode],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        fields = dict(p.split("=", 1) for p in server.stdout.readline().split()[2:])
        time.sleep(0.5)
        pids = [server.pid]
        base = rss(pids)
        per = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        clients = [
            subprocess.Popen([sys.executable, __file__, "--client", fields["clients"],
                              f"127.0.0.{2 + i}", str(c)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for i, c in enumerate(per)
        ]
        opened = 0
        for c in clients:
            _, k, _ = c.stdout.readline().split()
            opened += int(k)
        time.sleep(1)
        idle = rss(pids)
        for c in clients:
            c.stdin.write(f"expect {m} 120\n")
            c.stdin.flush()
        cpu0 = cpu_seconds(pids)
        api = fields["api"]
        for i in range(m):
            req = urllib.request.Request(f"http://{api}/publish/{TOPIC}", data=message(i).encode(),
                                         method="POST")
            urllib.request.urlopen(req, timeout=30).read()
        results = [c.stdout.readline().split() for c in clients]
        cpu = cpu_seconds(pids) - cpu0
        after = rss(pids)
        got = sum(int(r[1]) for r in results)
        wire = sum(int(r[2]) for r in results)
        bad = sum(int(r[3]) for r in results)
        for c in clients:
            c.stdin.write("quit\n")
            c.stdin.flush()
            c.wait(timeout=60)
        return {
            "mode": mode, "connections": opened, "messages": m, "delivered": got,
            "expected": opened * m, "corrupt": bad,
            "cpu_s_per_million": cpu / got * 1e6 if got else float("nan"),
            "wire_bytes_per_delivery": wire / got if got else float("nan"),
            "rss_per_conn_idle": (idle - base) / opened,
            "rss_per_conn_after": (after - base) / opened,
            "payload_bytes": statistics.mean(len(message(i)) for i in range(m)),
        }
    finally:
        server.terminate()
        server.wait(timeout=30)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--connections", type=int, default=1000)
    ap.add_argument("-m", "--messages", type=int, default=300)
    ap.add_argument("--client-procs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write all results to this file")
    args = ap.parse_args()
    modes = ["off", "shared", "dedicated"]
    results = {mode: [] for mode in modes}
    for r in range(args.repeats):
        for mode in modes:
            res = run_once(mode, args.connections, args.messages, args.client_procs)
            results[mode].append(res)
            print(f"[{r + 1}/{args.repeats}] {mode}: {res['cpu_s_per_million']:.2f} CPU-s/M, "
                  f"{res['wire_bytes_per_delivery']:.0f} B/delivery, "
                  f"{res['rss_per_conn_idle']:.0f} B/conn idle, {res['rss_per_conn_after']:.0f} after, "
                  f"delivered {res['delivered']}/{res['expected']}, corrupt {res['corrupt']}", flush=True)
    med = lambda mode, k: statistics.median(x[k] for x in results[mode])  # noqa: E731
    payload = results["off"][0]["payload_bytes"]
    print(f"\nmedians over {args.repeats} runs; {args.connections} subscribers x {args.messages} "
          f"messages of {payload:.0f} B JSON:")
    print(f"{'mode':<10} {'CPU-s/M deliveries':>19} {'wire B/delivery':>16} {'B/conn idle':>12} "
          f"{'B/conn after':>13} {'delivered':>10} {'corrupt':>8}")
    for mode in modes:
        print(f"{mode:<10} {med(mode, 'cpu_s_per_million'):>19.2f} "
              f"{med(mode, 'wire_bytes_per_delivery'):>16.0f} {med(mode, 'rss_per_conn_idle'):>12.0f} "
              f"{med(mode, 'rss_per_conn_after'):>13.0f} "
              f"{min(x['delivered'] / x['expected'] for x in results[mode]):>10.2%} "
              f"{max(x['corrupt'] for x in results[mode]):>8}")
    for mode in ("shared", "dedicated"):
        print(f"{mode} / off: CPU {med(mode, 'cpu_s_per_million') / med('off', 'cpu_s_per_million'):.2f}, "
              f"wire {med(mode, 'wire_bytes_per_delivery') / med('off', 'wire_bytes_per_delivery'):.2f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
