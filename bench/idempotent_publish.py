#!/usr/bin/env python3
"""What an `Idempotency-Key` costs a publish on a Redis cluster node: publish latency (request
sent to answer read, one publish at a time over a kept-alive connection) with and without a
random key per publish, interleaved in rounds so drift on a shared machine hits both alike.

    cargo build --release -p clarion
    CLARION_BIN=target/release/clarion python3 bench/idempotent_publish.py --messages 3000 --rounds 3
    CLARION_BIN=target/release/clarion python3 bench/idempotent_publish.py --redis-cluster

Starts a private redis-server (with `--redis-cluster`, a Redis Cluster of three masters with a
replica each, as tests/python/test_redis_cluster.py makes it) and one node (the tests' fixtures,
tests/python/cluster_util.py), publishes 64-byte messages to one topic with no subscriber, and
prints p50 and p99 of each and the ratio of the p50s (issue 52's goal: at most 1.2x).
"""

import argparse
import http.client
import os
import pathlib
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from cluster_util import Node, Redis  # noqa: E402


def run(conn, keyed, count):
    lat = []
    for _ in range(count):
        headers = {"Content-Type": "text/plain"}
        if keyed:
            headers["Idempotency-Key"] = uuid.uuid4().hex
        t = time.perf_counter()
        conn.request("POST", "/publish/bench", body=b"x" * 64, headers=headers)
        resp = conn.getresponse()
        resp.read()
        lat.append(time.perf_counter() - t)
        if resp.status != 200:
            raise SystemExit(f"publish answered {resp.status}")
    lat.sort()
    return lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--redis-cluster", action="store_true", help="a Redis Cluster, not one redis-server")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="clarion-idem-")
    brokers = []
    if args.redis_cluster:
        from test_redis_cluster import RedisCluster

        holder = type("Brokers", (), {"dir": pathlib.Path(work), "brokers": brokers})()
        url = RedisCluster(holder).url(3)
    else:
        brokers.append(Redis(work))
        url = brokers[0].url
    node = Node(["--broker", url, "--node-name", "b1", "--workers", "1"], work, "b1")
    try:
        host, port = node.api.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port))
        run(conn, False, 500)  # warm-up: the topic's metadata, connections
        for r in range(args.rounds):
            plain, keyed = run(conn, False, args.messages), run(conn, True, args.messages)
            print(
                f"round {r}: plain p50 {plain[0]:.0f} us p99 {plain[1]:.0f} us; "
                f"keyed p50 {keyed[0]:.0f} us p99 {keyed[1]:.0f} us; p50 ratio {keyed[0] / plain[0]:.2f}"
            )
    finally:
        node.proc.kill()
        node.proc.wait()
        for b in brokers:
            b.kill()


if __name__ == "__main__":
    main()
