#!/usr/bin/env python3
"""Batch publishing against one request per message: messages/s and the server's CPU per
message, for small messages published over one kept-alive API connection, interleaved in rounds
so drift on a shared machine hits both alike.

    cargo build --release -p clarion
    CLARION_BIN=target/release/clarion python3 bench/batch_publish.py --messages 20000 --batch 100 --rounds 3

Starts one `clarion serve` (no broker, one worker, no subscriber), publishes `--messages`
64-byte messages to 10 topics one request each, then the same number in `POST /publish`
batches of `--batch`, and prints for each: messages/s (publisher's wall clock) and the server
process's CPU (user + system, from /proc) per message, and the ratios (issue 52's goal: at least
10x the messages/s, at most 0.2x the CPU per message).
"""

import argparse
import http.client
import json
import os
import subprocess
import time

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def singles(conn, count):
    for i in range(count):
        conn.request("POST", f"/publish/bench.{i % 10}", body=b"x" * 64, headers={"Content-Type": "text/plain"})
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise SystemExit(f"publish answered {r.status}")


def batches(conn, count, size):
    data = "x" * 64
    for start in range(0, count, size):
        n = min(size, count - start)
        body = json.dumps({"messages": [{"topic": f"bench.{(start + j) % 10}", "data": data} for j in range(n)]})
        conn.request("POST", "/publish", body=body.encode(), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        out = r.read()
        if r.status != 200 or b'"error"' in out:
            raise SystemExit(f"batch answered {r.status}: {out[:200]!r}")


def measure(pid, work, count):
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    work()
    wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    return count / wall, cpu / count * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    binary = os.environ.get("CLARION_BIN", "target/release/clarion")
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        fields = dict(part.split("=", 1) for part in line.split()[2:])
        host, port = fields["api"].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port))
        singles(conn, 500)  # warm-up
        for r in range(args.rounds):
            one = measure(proc.pid, lambda: singles(conn, args.messages), args.messages)
            many = measure(proc.pid, lambda: batches(conn, args.messages, args.batch), args.messages)
            print(
                f"round {r}: one per request {one[0]:.0f} msg/s, {one[1]:.1f} us CPU/msg; "
                f"batches of {args.batch} {many[0]:.0f} msg/s, {many[1]:.2f} us CPU/msg; "
                f"throughput {many[0] / one[0]:.1f}x, CPU per message {many[1] / one[1]:.3f}x"
            )
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
