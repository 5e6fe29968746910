"""Publish debouncing (`max_rate` on a `[[conflate_topics]]` table, docs/conflation.md
"Debouncing"): a topic's live deliveries are capped at `max_rate` rounds per second on the node,
the latest message per key wins in between and goes out at the interval's end (after a typed
`conflated` notice with the count it replaced), and history keeps every message."""

import json
import socket
import threading
import time


def start(start_server, tmp_path, rate=5):
    config = tmp_path / "clarion.toml"
    config.write_text(f'[[conflate_topics]]\npattern = "rt"\nkey = "/k"\nmax_rate = {rate}\n')
    return start_server("--config", config)


class Sse(threading.Thread):
    """An SSE `format=json` subscriber reading everything, with the time each event came."""

    def __init__(self, server, target):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        self.sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(4096)
        self.buf, self.events = head.partition(b"\r\n\r\n")[2], []

    def run(self):
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            self.buf += chunk
            *blocks, self.buf = self.buf.split(b"\n\n")
            for block in blocks:
                fields = dict(l.split(b": ", 1) for l in block.split(b"\n") if b": " in l)
                if b"data" in fields:
                    kind = fields.get(b"event", b"message").decode()
                    self.events.append((time.monotonic(), kind, json.loads(fields[b"data"])))

    def messages(self):
        return [json.loads(d["data"]) for _, kind, d in self.events if kind != "conflated"]

    def notices(self):
        return [d for _, kind, d in self.events if kind == "conflated"]


def test_max_rate_caps_a_topics_deliveries_and_the_last_value_of_each_key_arrives(start_server, tmp_path):
    server = start(start_server, tmp_path, rate=5)
    sub = Sse(server, "/sse?topic=rt&format=json")
    sub.start()
    time.sleep(0.2)
    published, last, began = 0, {}, time.monotonic()
    # 60 messages over two keys in about 0.6 s: at 5 rounds per second, 4 or 5 rounds.
    for i in range(60):
        k = f"k{i % 2}"
        server.publish("rt", json.dumps({"k": k, "n": i}))
        published, last[k] = published + 1, i
        time.sleep(0.01)
    took = time.monotonic() - began
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and {m["k"]: m["n"] for m in sub.messages()} != last:
        time.sleep(0.02)
    msgs, notices = sub.messages(), sub.notices()
    # The last value of each key arrived (the timer flushed it: nothing published after it).
    assert {m["k"]: m["n"] for m in msgs} == last
    # Each key at most once per round, rounds at most 5 per second (+1: the first goes at once).
    rounds = len({round(t, 2) for t, kind, _ in sub.events if kind != "conflated"})
    assert len(msgs) <= 2 * (int(took * 5) + 2), (len(msgs), took)
    assert rounds <= int(took * 5) + 3, (rounds, took)
    # Delivered + skipped = published, the notices say so, and so does the counter.
    skipped = sum(n["skipped"] for n in notices)
    assert all(n["topic"] == "rt" and n["skipped"] > 0 for n in notices)
    assert skipped > 0 and len(msgs) + skipped == published
    assert server.metrics()["clarion_debounced_total"] == skipped
    # Each key's values in publish order.
    for k in last:
        mine = [m["n"] for m in msgs if m["k"] == k]
        assert mine == sorted(mine)
    # History keeps every message: a subscriber resuming from the start replays all of them.
    first_id = sub.events[0][2]["id"]
    replay = Sse(server, f"/sse?topic=rt&format=json&since={first_id}")
    replay.start()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and len(replay.messages()) < published - 1:
        time.sleep(0.02)
    assert [m["n"] for m in replay.messages()] == list(range(1, published))
    sub.sock.close()
    replay.sock.close()
