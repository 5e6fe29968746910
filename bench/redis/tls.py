"""Publish latency and CPU per message over rediss:// against redis:// (docs/cluster.md, "TLS to
Redis"), on one machine: one redis-server with a plain and a TLS port, two Clarion nodes per
mode, a WebSocket subscriber on node 2, messages published one at a time on node 1's API.
Per message: the publish's round trip (the API answers after Redis ran the publish script)
and the delivery (publish sent to the message read on node 2); CPU of both nodes and of Redis
per message. Three runs per mode, interleaved; the medians are printed.

    CLARION_BIN=$PWD/target/release/clarion .ci/.venv/bin/python bench/redis/tls.py [N]

(It borrows the test suite's Redis and cluster helpers from tests/python.)
"""

import http.client
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))

from cluster_util import Cluster  # noqa: E402
from test_cluster import ws_sub  # noqa: E402
from test_redis_tls import Ca, TlsRedis  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class BothPorts(TlsRedis):
    """One redis-server answering plain on `plain_port` and TLS on `port`."""

    def __init__(self, workdir, *args, plain_port):
        self.plain_port = plain_port
        super().__init__(workdir, *args)

    def command(self):
        cmd = super().command()
        at = cmd.index("--port", cmd.index("--port") + 1)  # the TLS class's "--port 0"
        cmd[at + 1] = str(self.plain_port)
        return cmd


def run(cluster, url, ca, n, redis_pid):
    a, b = cluster.start_nodes(2, "--broker", url, "--redis-tls-ca", ca, "--workers", "1") if (
        url.startswith("rediss")
    ) else cluster.start_nodes(2, "--broker", url, "--workers", "1")
    ws = ws_sub(b, "bench")
    host, port = a.api.rsplit(":", 1)
    api = http.client.HTTPConnection(host, int(port), timeout=10)
    pids = [a.proc.pid, b.proc.pid]
    for i in range(200):  # warm up: connections, script cache, TLS sessions
        api.request("POST", "/publish/bench", b"w", {"Content-Type": "text/plain"})
        api.getresponse().read()
        ws.recv(timeout=10)
    cpu0 = [cpu_seconds(p) for p in pids + [redis_pid]]
    pub, dlv = [], []
    for i in range(n):
        t0 = time.perf_counter()
        api.request("POST", "/publish/bench", b"x" * 64, {"Content-Type": "text/plain"})
        r = api.getresponse()
        r.read()
        t1 = time.perf_counter()
        assert r.status == 200
        ws.recv(timeout=10)
        t2 = time.perf_counter()
        pub.append(t1 - t0)
        dlv.append(t2 - t0)
    cpu1 = [cpu_seconds(p) for p in pids + [redis_pid]]
    ws.close()
    api.close()
    for node in (a, b):
        node.stop()
    cluster.nodes.clear()
    pub.sort()
    dlv.sort()
    return {
        "publish_p50_us": statistics.median(pub) * 1e6,
        "publish_p99_us": pub[int(n * 0.99)] * 1e6,
        "deliver_p50_us": statistics.median(dlv) * 1e6,
        "nodes_cpu_us_per_msg": (sum(cpu1[:2]) - sum(cpu0[:2])) / n * 1e6,
        "redis_cpu_us_per_msg": (cpu1[2] - cpu0[2]) / n * 1e6,
    }


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ca = Ca(d, "Bench CA")
        cert, key = ca.issue("redis", names=["localhost"], ips=["127.0.0.1"])
        from cluster_util import free_port

        cluster = Cluster(d)
        try:
            redis = BothPorts(d, ca.pem, cert, key, plain_port=free_port())
            cluster.brokers.append(redis)
            urls = {
                "redis://": f"redis://127.0.0.1:{redis.plain_port}",
                "rediss://": redis.url,
            }
            results = {k: [] for k in urls}
            for _ in range(3):
                for mode, url in urls.items():
                    results[mode].append(run(cluster, url, ca.pem, n, redis.proc.pid))
            print(f"{n} messages per run, median of 3 runs")
            keys = list(results["redis://"][0])
            print(f"{'':12}" + "".join(f"{k:>22}" for k in keys))
            for mode, runs in results.items():
                row = [statistics.median(r[k] for r in runs) for k in keys]
                print(f"{mode:12}" + "".join(f"{v:>22.1f}" for v in row))
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
