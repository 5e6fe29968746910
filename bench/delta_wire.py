#!/usr/bin/env python3
"""Delta compression at scale (issue 51, docs/delta.md): bytes on the wire and server CPU per
delivery of an order-book ticker, with deltas and without, both with permessage-deflate.

For each mode (interleaved, repeated), starts Clarion with `--delta-topics book`, opens N
`clarion.v1` WebSocket subscribers from client processes on 127.0.0.2.. that offer
`permessage-deflate; client_max_window_bits` (what a browser sends), publishes M order books
(about 2 KB of JSON, 70 levels a side; each update changes 20 quantities, `seq` and `ts`: about
5 % of the bytes), and has every client inflate, apply deltas (checksum verified) and compare
every message with what was published (a run that loses or corrupts anything says so). Modes:

- `full`: no `delta=1`, the server's default shared deflate (each frame alone);
- `delta`: `delta=1`, the same deflate (delta, then deflate);
- `full-takeover`: no `delta=1`, `--compression dedicated` (a deflate context per connection,
  which carries the previous messages: what context takeover alone does across messages);
- `delta-takeover`: both.

Reports medians of server CPU-seconds (user+system, /proc) per million deliveries during the
publish phase and bytes on the wire per delivery (frame headers included), and the ratios.

    python3 bench/delta_wire.py -n 15000 -m 40              # the issue's N
    python3 bench/delta_wire.py -n 2000 -m 100 --repeats 3 --modes full,delta,full-takeover
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

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python" / "client" / "src"))
from idle_memory import ROOT, cpu_seconds  # noqa: E402
from clarion_client.fossil import apply as apply_delta  # noqa: E402

TOPIC = "book"


def books(n, seed=51):
    """`n` successive order books (JSON text, about 2 KB): 70 levels a side; 20 quantities,
    `seq` and `ts` changed per update (about 5 % of the bytes), now and then a price level
    moved."""
    rng = random.Random(seed)
    side = lambda p0, s: [[round(p0 + s * i * 0.05, 2), rng.randint(1, 99999)] for i in range(70)]  # noqa: E731
    book = {"symbol": "BTC-USD", "seq": 0, "ts": 1764300000000, "bids": side(100.0, -1), "asks": side(100.05, 1)}
    out = []
    for i in range(n):
        book["seq"] = i
        book["ts"] += rng.randint(5, 500)
        for _ in range(20):
            levels = book["bids"] if rng.random() < 0.5 else book["asks"]
            levels[rng.randrange(70)][1] = rng.randint(1, 99999)
        if rng.random() < 0.1:
            levels = book["bids"] if rng.random() < 0.5 else book["asks"]
            levels[rng.randrange(70)][0] = round(levels[0][0] + rng.randint(-9, 9) * 0.01, 2)
        out.append(json.dumps(book, separators=(",", ":")))
    return out


# ---------------------------------------------------------------- client process


def client_main(target, source, count, delta):
    host, port = target.rsplit(":", 1)
    path = f"/ws?topic={TOPIC}" + ("&delta=1" if delta else "")
    conns = []
    for _ in range(count):
        s = socket.socket()
        s.bind((source, 0))
        s.connect((host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: {target}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Protocol: clarion.v1\r\n"
                "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        head, rest = head.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise SystemExit(f"refused: {head[:60]!r}")
        ext = [h for h in head.split(b"\r\n") if h.lower().startswith(b"sec-websocket-extensions")]
        takeover = bool(ext) and b"server_no_context_takeover" not in ext[0]
        s.setblocking(False)
        conns.append({"sock": s, "buf": rest, "inflater": zlib.decompressobj(-15), "takeover": takeover,
                      "got": 0, "bytes": 0, "last": None, "deltas": 0})
    print(f"ready {len(conns)} {int(bool(ext))}", flush=True)
    # Shared frames are the same bytes for every subscriber: inflate, parse and apply each once.
    inflated, parsed, applied, closes = {}, {}, {}, {}
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] != "expect":
            break
        n, deadline = int(cmd[1]), time.monotonic() + float(cmd[2])
        expected = books(n)
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
                    if buf[0] & 0x0F == 0x8:
                        closes[payload[:2] + payload[2:40]] = closes.get(payload[:2] + payload[2:40], 0) + 1
                        continue
                    if buf[0] & 0x0F != 0x1:
                        continue  # a ping: the server's keep-alive, not a message
                    if buf[0] & 0x40:
                        if c["takeover"]:
                            payload = c["inflater"].decompress(payload + b"\x00\x00\xff\xff")
                        else:
                            hit = inflated.get(payload)
                            if hit is None:
                                hit = inflated[payload] = zlib.decompressobj(-15).decompress(payload + b"\x00\x00\xff\xff")
                            payload = hit
                    m = parsed.get(payload)
                    if m is None:
                        m = parsed[payload] = json.loads(payload)
                    if m.get("type") != "message":
                        continue
                    text = m["data"]
                    if "delta" in m:
                        c["deltas"] += 1
                        last = c["last"]
                        hit = applied.get((m["id"], m["delta"]))
                        if hit is None and last is not None and last[0] == m["delta"]:
                            try:
                                hit = apply_delta(last[1].encode(), text.encode()).decode()
                            except ValueError:
                                hit = None
                            applied[(m["id"], m["delta"])] = hit
                        if hit is None or last is None or last[0] != m["delta"]:
                            bad += 1
                            c["got"] += 1
                            continue
                        text = hit
                    c["last"] = (m["id"], text)
                    if c["got"] >= n or text != expected[c["got"]]:
                        bad += 1
                    c["got"] += 1
        sel.close()
        got = sum(min(c["got"], n) for c in conns)
        deltas = sum(c["deltas"] for c in conns)
        if closes:
            print(f"closes: {closes}", file=sys.stderr, flush=True)
        print(f"got {got} {sum(c['bytes'] for c in conns)} {bad} {deltas}", flush=True)


# ---------------------------------------------------------------- driver


def run_once(mode, n, m, procs, interval):
    binary = os.environ.get("CLARION_BIN", str(ROOT / "target" / "release" / "clarion"))
    compression = "dedicated" if mode.endswith("-takeover") else "shared"
    server = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
         "--max-connections-per-address", "0", "--delta-topics", TOPIC, "--compression", compression,
         "--compression-dedicated-limit", str(n + 10), "--max-connections", str(n + 100)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        fields = dict(p.split("=", 1) for p in server.stdout.readline().split()[2:])
        time.sleep(0.5)
        pids = [server.pid]
        per = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        clients = [
            subprocess.Popen([sys.executable, __file__, "--client", fields["clients"], f"127.0.0.{2 + i}",
                              str(c), "1" if mode.startswith("delta") else "0"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for i, c in enumerate(per)
        ]
        opened = 0
        for c in clients:
            _, k, _ = c.stdout.readline().split()
            opened += int(k)
        time.sleep(1)
        for c in clients:
            c.stdin.write(f"expect {m} {60 + m * interval * 2}\n")
            c.stdin.flush()
        cpu0 = cpu_seconds(pids)
        api = fields["api"]
        for body in books(m):
            req = urllib.request.Request(f"http://{api}/publish/{TOPIC}", data=body.encode(), method="POST")
            urllib.request.urlopen(req, timeout=30).read()
            time.sleep(interval)
        results = [c.stdout.readline().split() for c in clients]
        cpu = cpu_seconds(pids) - cpu0
        got = sum(int(r[1]) for r in results)
        wire = sum(int(r[2]) for r in results)
        bad = sum(int(r[3]) for r in results)
        deltas = sum(int(r[4]) for r in results)
        for c in clients:
            c.stdin.write("quit\n")
            c.stdin.flush()
            c.wait(timeout=60)
        return {
            "mode": mode, "connections": opened, "messages": m, "delivered": got,
            "expected": opened * m, "corrupt": bad, "deltas": deltas,
            "cpu_s_per_million": cpu / got * 1e6 if got else float("nan"),
            "wire_bytes_per_delivery": wire / got if got else float("nan"),
            "payload_bytes": statistics.mean(len(b) for b in books(m)),
        }
    finally:
        server.terminate()
        server.wait(timeout=30)


def capture_cases(path, m):
    """Writes the text frames a `clarion.v1` subscriber gets for the M order books, without
    and with `delta=1` (no permessage-deflate: what a client's JSON.parse sees), for
    `bench/delta_apply.mjs`."""
    binary = os.environ.get("CLARION_BIN", str(ROOT / "target" / "release" / "clarion"))
    server = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
                               "--delta-topics", TOPIC], stdout=subprocess.PIPE, text=True)
    try:
        fields = dict(p.split("=", 1) for p in server.stdout.readline().split()[2:])
        host, port = fields["clients"].rsplit(":", 1)
        socks = {}
        for mode in ("full", "delta"):
            s = socket.create_connection((host, int(port)))
            key = base64.b64encode(os.urandom(16)).decode()
            s.sendall((f"GET /ws?topic={TOPIC}{'&delta=1' if mode == 'delta' else ''} HTTP/1.1\r\n"
                       f"Host: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                       f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Protocol: clarion.v1\r\n\r\n").encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(4096)
            socks[mode] = [s, head.split(b"\r\n\r\n", 1)[1], []]
        time.sleep(0.3)
        for body in books(m):
            req = urllib.request.Request(f"http://{fields['api']}/publish/{TOPIC}", data=body.encode(), method="POST")
            urllib.request.urlopen(req, timeout=30).read()
        deadline = time.monotonic() + 30
        for s, buf, frames in socks.values():
            s.settimeout(1)
            while len(frames) < m and time.monotonic() < deadline:
                while len(buf) >= 4:
                    ln, at = buf[1] & 0x7F, 2
                    if ln == 126:
                        ln, at = struct.unpack("!H", buf[2:4])[0], 4
                    if len(buf) < at + ln:
                        break
                    if buf[0] & 0x0F == 0x1:
                        frames.append(buf[at:at + ln].decode())
                    buf = buf[at + ln:]
                if len(frames) < m:
                    buf += s.recv(1 << 16)
        out = {mode: v[2] for mode, v in socks.items()}
        pathlib.Path(path).write_text(json.dumps(out))
        print(f"{path}: {len(out['full'])} full and {len(out['delta'])} delta-subscription frames, "
              f"{sum('delta' in json.loads(f) for f in out['delta'])} deltas")
    finally:
        server.terminate()
        server.wait(timeout=30)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--cases":
        capture_cases(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 200)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1")
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--connections", type=int, default=2000)
    ap.add_argument("-m", "--messages", type=int, default=40)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between publications")
    ap.add_argument("--client-procs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="full,delta", help="full, delta, full-takeover, delta-takeover (comma-separated)")
    ap.add_argument("--json", help="also write all results to this file")
    args = ap.parse_args()
    modes = args.modes.split(",")
    results = {mode: [] for mode in modes}
    for r in range(args.repeats):
        for mode in modes:
            res = run_once(mode, args.connections, args.messages, args.client_procs, args.interval)
            results[mode].append(res)
            print(f"[{r + 1}/{args.repeats}] {mode}: {res['cpu_s_per_million']:.2f} CPU-s/M, "
                  f"{res['wire_bytes_per_delivery']:.0f} B/delivery, deltas {res['deltas']}, "
                  f"delivered {res['delivered']}/{res['expected']}, corrupt {res['corrupt']}", flush=True)
    med = lambda mode, k: statistics.median(x[k] for x in results[mode])  # noqa: E731
    payload = results[modes[0]][0]["payload_bytes"]
    print(f"\nmedians over {args.repeats} runs; {args.connections} subscribers x {args.messages} "
          f"order books of {payload:.0f} B JSON, permessage-deflate:")
    print(f"{'mode':<14} {'CPU-s/M deliveries':>19} {'wire B/delivery':>16} {'delivered':>10} {'corrupt':>8}")
    for mode in modes:
        print(f"{mode:<14} {med(mode, 'cpu_s_per_million'):>19.2f} {med(mode, 'wire_bytes_per_delivery'):>16.0f} "
              f"{min(x['delivered'] / x['expected'] for x in results[mode]):>10.2%} "
              f"{max(x['corrupt'] for x in results[mode]):>8}")
    if "full" in results:
        for mode in (x for x in modes if x != "full"):
            print(f"{mode} / full: wire {med(mode, 'wire_bytes_per_delivery') / med('full', 'wire_bytes_per_delivery'):.3f}, "
                  f"CPU {med(mode, 'cpu_s_per_million') / med('full', 'cpu_s_per_million'):.2f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
