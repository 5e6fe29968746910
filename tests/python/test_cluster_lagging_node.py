"""A client that resumes on a node whose link to Redis lags behind the node it came from
(found by the chaos soak, bench/soak.sh: a client that read message N on a fast node and
reconnected at once to a node that had not yet delivered N got an `epoch` gap notice and then
messages it already had). The lagging node is made by putting a relay that holds Redis's
answers back for a while between that node and Redis."""

import heapq
import socket
import threading
import time

import pytest

from cluster_util import cluster  # noqa: F401  (the fixture)
from test_cluster import recv_json, ws_sub

pytestmark = pytest.mark.timeout(120)

# How long the relay holds back what Redis sends to the lagging node.
LAG = 1.0


class LaggingRelay:
    """A TCP relay to Redis that delivers Redis's bytes `lag` seconds late (commands go
    through at once): a node behind it sees every published message `lag` late."""

    def __init__(self, port, lag):
        self.target = ("127.0.0.1", port)
        self.lag = lag
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = False
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, 0), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.lag), daemon=True).start()

    def _pump(self, src, dst, lag):
        queue, cond = [], threading.Condition()
        n = [0]

        def sender():
            while True:
                with cond:
                    while not queue:
                        cond.wait()
                    due, _, data = queue[0]
                    left = due - time.monotonic()
                    if left > 0:
                        cond.wait(left)
                        continue
                    heapq.heappop(queue)
                if data is None:
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=sender, daemon=True).start()
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            with cond:
                n[0] += 1
                heapq.heappush(queue, (time.monotonic() + lag, n[0], data or None))
                cond.notify()
            if not data:
                return

    def close(self):
        self.closed = True
        for s in [self.listener] + self.socks:
            try:
                s.close()
            except OSError:
                pass


def test_a_resume_on_a_node_that_has_not_yet_delivered_the_id_is_exact(cluster):
    redis = cluster.redis()
    relay = LaggingRelay(redis.port, LAG)
    try:
        fast = cluster.node("--broker", redis.url, "--node-name", "fast", "--workers", "1")
        slow = cluster.node(
            "--broker", relay.url, "--node-name", "slow", "--workers", "1",
            "--broker-timeout-ms", "5000",
        )
        # Both nodes follow the topic (a subscriber each), so the slow one's position is its
        # own view, LAG behind.
        keep = ws_sub(slow, "feed")
        ws = ws_sub(fast, "feed")
        ids = [fast.publish("feed", f"m{i}")["id"] for i in range(5)]
        got = [recv_json(ws) for _ in range(5)]
        assert [m["id"] for m in got] == ids
        ws.close()
        # At once, well within LAG: the slow node has not delivered these yet.
        again = ws_sub(slow, "feed", since=ids[-1])
        fast.publish("feed", "after")
        first = recv_json(again, timeout=10)
        # Exact: no gap notice, nothing the client already had, then the next message.
        assert first.get("type") == "message" and first["data"] == "after", first
        with pytest.raises(TimeoutError):
            extra = recv_json(again, timeout=LAG + 0.5)
            raise AssertionError(f"more than expected: {extra}")
        again.close()
        keep.close()
    finally:
        relay.close()
