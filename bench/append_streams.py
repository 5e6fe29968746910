#!/usr/bin/env python3
"""Appendable messages (AI token streams, issue 52): a scaled-down run of "1,000 streams x 400
fragments x 5 subscribers", measuring what a subscriber that reconnects mid-stream receives
against the text so far, the server's CPU per fragment delivered against plain messages of the
same size, and history memory per finished stream against its text.

    cargo build --release -p clarion
    CLARION_BIN=target/release/clarion python3 bench/append_streams.py --streams 20 --fragments 400 --subscribers 5
    # two binaries in the same run (say, before and after a change), interleaved:
    python3 bench/append_streams.py --bin /path/to/old/clarion --bin target/release/clarion --pairs 3

Starts one `clarion serve` per binary (no broker, one worker). `--subscribers` WebSockets
(clarion.v1) follow one topic per stream; the publisher sends `--fragments` fragments of 4 to 8
bytes to every stream, interleaved, over one kept-alive API connection (a "stream phase"), and
the same number of plain messages of the same sizes to other topics (a "plain phase"); each
phase prints the server's CPU (user + system from /proc) per delivery. A pair is one phase of
each, on fresh topics, the order alternating from pair to pair (stream first, then plain first)
so that neither always runs on a warmer or quieter machine; with several binaries each pair runs
on every binary in turn. The figure is the median over the pairs of each pair's ratio. Then a
subscriber resumes each stream of the last pair from a random fragment's id: the messages and
bytes (the `data` received) against the text so far. Last, history bytes
(`clarion_history_bytes`, its growth over the first stream phase) per finished stream against
the text.
"""

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import threading

from websockets.sync.client import connect

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def post(conn, path, body):
    conn.request("POST", path, body=body.encode(), headers={"Content-Type": "text/plain"})
    r = conn.getresponse()
    out = r.read()
    if r.status != 200:
        raise SystemExit(f"{path} answered {r.status}: {out[:200]!r}")
    return json.loads(out)


def history_bytes(conn):
    conn.request("GET", "/metrics")
    metrics = conn.getresponse().read().decode()
    return next(float(x.split()[-1]) for x in metrics.splitlines() if x.startswith("clarion_history_bytes "))


def drain(ws, count, out):
    got = 0
    while got < count:
        ws.recv(timeout=60)
        got += 1
    out.append(got)


class Server:
    """One `clarion serve` and its API connection."""

    def __init__(self, binary, a):
        self.binary = binary
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", "--workers", "1",
             "--history-size", str(a.fragments + 10), "--history-memory", str(1 << 30)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        self.fields = dict(p.split("=", 1) for p in self.proc.stdout.readline().split()[2:])
        host, port = self.fields["api"].rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.ratios, self.cpu = [], {"stream": [], "plain": []}
        self.stream_ids = self.topics = None
        self.held = None

    def phase(self, kind, topics, frags, a):
        """One phase: CPU-seconds per delivery; for streams, the ids of every fragment."""
        per_sub = len(topics) * a.fragments
        subs = [connect(f"ws://{self.fields['clients']}/ws?" + "&".join(f"topic={t}" for t in topics),
                        subprotocols=["clarion.v1"], max_size=None, legacy=True) for _ in range(a.subscribers)]
        done = []
        threads = [threading.Thread(target=drain, args=(w, per_sub, done)) for w in subs]
        for t in threads:
            t.start()
        held_before = history_bytes(self.conn)
        before = cpu_seconds(self.proc.pid)
        ids = {}
        for j in range(a.fragments):
            for i, t in enumerate(topics):
                if kind == "plain":
                    post(self.conn, f"/publish/{t}", frags[i][j])
                elif j == 0:
                    r = post(self.conn, f"/publish/{t}?stream=open", frags[i][j])
                    ids[i] = [r["stream"], [r["id"]]]
                else:
                    last = "&done=1" if j == a.fragments - 1 else ""
                    r = post(self.conn, f"/publish/{t}?append_to={ids[i][0]}{last}", frags[i][j])
                    ids[i][1].append(r["id"])
        for t in threads:
            t.join(120)
        spent = (cpu_seconds(self.proc.pid) - before) / (per_sub * a.subscribers)
        for w in subs:
            w.close()
        self.cpu[kind].append(spent)
        if kind == "stream":
            self.stream_ids, self.topics = ids, topics
            if self.held is None:
                self.held = history_bytes(self.conn) - held_before
        return spent

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--fragments", type=int, default=400)
    ap.add_argument("--subscribers", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=3, help="interleaved stream/plain pairs (median reported)")
    ap.add_argument("--bin", action="append", help="a clarion binary (repeat to compare; default $CLARION_BIN)")
    a = ap.parse_args()
    binaries = a.bin or [os.environ.get("CLARION_BIN", "target/release/clarion")]
    rng = random.Random(52)
    frags = [[("".join(rng.choice("abcdefgh ") for _ in range(rng.randint(4, 8)))) for _ in range(a.fragments)]
             for _ in range(a.streams)]
    servers = []
    try:
        servers = [Server(b, a) for b in binaries]
        for p in range(a.pairs):
            order = ("stream", "plain") if p % 2 == 0 else ("plain", "stream")
            for s in servers:
                got = {}
                for kind in order:
                    got[kind] = s.phase(kind, [f"ai.{p}.{kind}.{i}" for i in range(a.streams)], frags, a)
                s.ratios.append(got["stream"] / got["plain"])
                print(f"pair {p + 1} ({order[0]} first) {s.binary}: stream {got['stream'] * 1e6:.2f} us, "
                      f"plain {got['plain'] * 1e6:.2f} us, ratio {s.ratios[-1]:.3f}x", flush=True)
        for s in servers:
            med = statistics.median
            print(f"{s.binary}: CPU per delivery (median of {a.pairs} pairs): stream fragment "
                  f"{med(s.cpu['stream']) * 1e6:.2f} us, plain message {med(s.cpu['plain']) * 1e6:.2f} us, "
                  f"ratio {med(s.ratios):.3f}x (pairs: {', '.join(f'{r:.3f}' for r in s.ratios)})")
            msgs = size = text = frame = 0
            for i, t in enumerate(s.topics):
                k = rng.randrange(1, a.fragments)
                w = connect(f"ws://{s.fields['clients']}/ws?topic={t}&since={s.stream_ids[i][1][k - 1]}",
                            subprotocols=["clarion.v1"], legacy=True)
                raw = w.recv(timeout=10)
                frame += len(raw.encode())
                m = json.loads(raw)
                w.close()
                msgs += 1
                size += len(m["data"].encode())
                text += len("".join(frags[i]).encode())
                assert m["data"] == "".join(frags[i]) and m["seq"] == a.fragments, m
            print(f"  resume mid-stream ({a.streams} streams, finished): {msgs / a.streams:.0f} message per stream, "
                  f"data bytes / text so far {size / text:.3f}x, whole JSON message / text {frame / text:.3f}x")
            text = sum(len("".join(f).encode()) for f in frags) / a.streams
            print(f"  history per finished stream: {s.held / a.streams:.0f} B as counted "
                  f"(clarion_history_bytes), text {text:.0f} B: {s.held / a.streams / text:.3f}x")
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
