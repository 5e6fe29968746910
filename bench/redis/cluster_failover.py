"""Time to recover after a Redis Cluster master is killed (docs/benchmarks.md, "Cluster"):
six redis-server nodes (three masters with a replica each, `cluster-node-timeout 1000`,
`cluster-require-full-coverage no`), two Clarion nodes, a loop publishing to two topics per
master on node 1. Each round kills one master (`kill -9`), and measures, from the kill:

- promoted: when the cluster itself has a new master for those slots (its replica answers
  `ROLE` master), polled every 20 ms: the cluster's own share;
- recovered: when a publish to each of the killed master's topics succeeds again on node 1.

The difference is what Clarion adds to the cluster's failover. The killed node is then
started again (it rejoins as a replica) before the next round. Medians over the rounds:

    CLARION_BIN=$PWD/target/release/clarion .ci/.venv/bin/python bench/redis/cluster_failover.py [ROUNDS]

(It borrows the test suite's cluster helpers from tests/python.)
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))

from cluster_util import Cluster, wait_until  # noqa: E402
from test_redis_cluster import Loop, RedisCluster  # noqa: E402


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    promoted, recovered = [], []
    with tempfile.TemporaryDirectory() as tmp:
        c = Cluster(tmp)
        try:
            rc = RedisCluster(c)
            a, _b = c.start_nodes(2, "--broker", rc.url(6), "--node-name", "n{i}")
            for r in range(rounds):
                by_master = rc.topics_per_master(2, prefix=f"r{r}-")
                topics = [t for ts in by_master.values() for t in ts]
                loop = Loop(a, topics)
                loop.start()
                wait_until(lambda: all(len(v) >= 3 for v in loop.ids.values()), 15, "publishing")
                victim = rc.masters()[r % 3]
                hit = by_master[victim.port]
                others = [n for n in rc.nodes if n.running and n is not victim]
                killed = time.monotonic()
                victim.kill()
                before = {n.port for n in others if n.role() == "master"}
                wait_until(
                    lambda: len({n.port for n in others if n.role() == "master"} - before) > 0,
                    30, "a replica promoted", 0.02,
                )  # fmt: skip
                promoted.append(time.monotonic() - killed)
                wait_until(
                    lambda: all(any(at > killed for at, _ in loop.ids[t]) for t in hit),
                    30, "the killed master's topics publishing again", 0.02,
                )  # fmt: skip
                recovered.append(
                    max(min(at for at, _ in loop.ids[t] if at > killed) for t in hit) - killed
                )
                loop.stop.set()
                loop.join(10)
                print(
                    f"round {r + 1}: promoted after {promoted[-1]:.2f} s, "
                    f"publishing again after {recovered[-1]:.2f} s"
                )
                victim.start()
                wait_until(rc.ok, 30, "cluster ok again", 0.1)
                wait_until(lambda: all(n.linked() for n in rc.nodes), 30, "replicas in sync", 0.1)
        finally:
            c.close()
    p, q = statistics.median(promoted), statistics.median(recovered)
    print(
        f"\nmedians over {rounds} kills: replica promoted {p:.2f} s, topics publishing again "
        f"{q:.2f} s ({q / p:.2f}x the cluster's own failover; Clarion adds {q - p:.2f} s)"
    )


if __name__ == "__main__":
    main()
