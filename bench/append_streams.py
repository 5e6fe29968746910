#!/usr/bin/env python3
"""Appendable messages (AI token streams, issue 52): a scaled-down run of "1,000 streams x 400
fragments x 5 subscribers", measuring what a subscriber that reconnects mid-stream receives
against the text so far, the server's CPU per fragment delivered against plain messages of the
same size, and history memory per finished stream against its text.

    cargo build --release -p clarion
    CLARION_BIN=target/release/clarion python3 bench/append_streams.py --streams 50 --fragments 400 --subscribers 5

Starts one `clarion serve` (no broker, one worker). `--subscribers` WebSockets (clarion.v1) follow
one topic per stream; the publisher sends `--fragments` fragments of 4 to 8 bytes to every
stream, interleaved, over one kept-alive API connection, then the same number of plain messages
of the same sizes, and prints the server's CPU (user + system from /proc) per delivery of each.
A subscriber then resumes each stream from a random fragment's id: the messages and bytes (the
`data` received) against the text so far. Last, history bytes (`clarion_history_bytes`) per
finished stream against the text.
"""

import argparse
import http.client
import json
import os
import random
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--fragments", type=int, default=400)
    ap.add_argument("--subscribers", type=int, default=5)
    a = ap.parse_args()
    rng = random.Random(52)
    proc = subprocess.Popen(
        [os.environ.get("CLARION_BIN", "target/release/clarion"), "serve", "--listen", "127.0.0.1:0",
         "--api-listen", "127.0.0.1:0", "--workers", "1", "--history-size", str(a.fragments + 10),
         "--history-memory", str(1 << 30)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        fields = dict(p.split("=", 1) for p in proc.stdout.readline().split()[2:])
        host, port = fields["api"].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        topics = [f"ai.{i}" for i in range(a.streams)]
        frags = [[("".join(rng.choice("abcdefgh ") for _ in range(rng.randint(4, 8)))) for _ in range(a.fragments)]
                 for _ in topics]
        per_sub = a.streams * a.fragments
        results = {}
        for kind in ("stream", "plain"):
            subs = [connect(f"ws://{fields['clients']}/ws?" + "&".join(f"topic={t}.{kind}" for t in topics),
                            subprotocols=["clarion.v1"], max_size=None, legacy=True) for _ in range(a.subscribers)]
            done = []
            threads = [threading.Thread(target=drain, args=(w, per_sub, done)) for w in subs]
            for t in threads:
                t.start()
            before = cpu_seconds(proc.pid)
            ids = {}
            for j in range(a.fragments):
                for i, t in enumerate(topics):
                    if kind == "plain":
                        post(conn, f"/publish/{t}.plain", frags[i][j])
                        continue
                    if j == 0:
                        r = post(conn, f"/publish/{t}.stream?stream=open", frags[i][j])
                        ids[i] = [r["stream"], [r["id"]]]
                    else:
                        last = "&done=1" if j == a.fragments - 1 else ""
                        r = post(conn, f"/publish/{t}.stream?append_to={ids[i][0]}{last}", frags[i][j])
                        ids[i][1].append(r["id"])
            for t in threads:
                t.join(120)
            results[kind] = (cpu_seconds(proc.pid) - before) / (per_sub * a.subscribers)
            for w in subs:
                w.close()
            if kind == "stream":
                stream_ids = ids
                held_streams = history_bytes(conn)
        print(f"CPU per delivery: stream fragment {results['stream'] * 1e6:.2f} us, "
              f"plain message {results['plain'] * 1e6:.2f} us, ratio {results['stream'] / results['plain']:.2f}x")
        msgs = size = text = frame = 0
        for i, t in enumerate(topics):
            k = rng.randrange(1, a.fragments)
            w = connect(f"ws://{fields['clients']}/ws?topic={t}.stream&since={stream_ids[i][1][k - 1]}",
                        subprotocols=["clarion.v1"], legacy=True)
            raw = w.recv(timeout=10)
            frame += len(raw.encode())
            m = json.loads(raw)
            w.close()
            msgs += 1
            size += len(m["data"].encode())
            text += len("".join(frags[i]).encode())
            assert m["data"] == "".join(frags[i]) and m["seq"] == a.fragments, m
        print(f"resume mid-stream ({a.streams} streams, finished): {msgs / a.streams:.0f} message per stream, "
              f"data bytes / text so far {size / text:.3f}x, whole JSON message / text {frame / text:.3f}x")
        text = sum(len("".join(f).encode()) for f in frags) / a.streams
        print(f"history per finished stream: {held_streams / a.streams:.0f} B as counted "
              f"(clarion_history_bytes), text {text:.0f} B: {held_streams / a.streams / text:.3f}x")
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
