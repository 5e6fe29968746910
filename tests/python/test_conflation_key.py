"""Conflation by the publisher's key (`key = "field"`, docs/conflation.md): a publish carries
`conflation_key` (a query parameter of `POST /publish/{topic}`, a field of a batch message),
which conflation and `max_rate` debouncing use instead of a JSON pointer; it is bounded (400,
counted), and travels through Redis and NATS to a slow reader on another node. The payloads here carry
their key under `sym`, where no pointer rule looks: only the publish field can key them."""

import json
import time
from urllib.parse import quote

import pytest

from cluster_util import cluster  # noqa: F401  (the fixture)
from test_cluster import nodes
from test_conflation import PAD, Reader, slow_reader
from test_debounce import Sse

KEYS = 300
FIELD = '[[conflate_topics]]\npattern = "px"\nkey = "field"\nthreshold = 16384\nmax_keys = 1000\n'


def config(tmp_path, table=FIELD):
    path = tmp_path / "clarion.toml"
    path.write_text("max_backlog = 65536\n" + table)
    return str(path)


def tick(server, rounds):
    """`rounds` updates of every key, 100 to a batch, keyed by `conflation_key` only."""
    last, n = {}, 0
    for _ in range(rounds):
        for start in range(0, KEYS, 100):
            batch = []
            for k in range(start, start + 100):
                n += 1
                last[f"k{k}"] = n
                data = json.dumps({"sym": f"k{k}", "n": n, "pad": PAD}, separators=(",", ":"))
                batch.append({"topic": "px", "data": data, "conflation_key": f"k{k}"})
            status, _, out = server.request(
                "POST", "/publish", json.dumps({"messages": batch}).encode(),
                {"Content-Type": "application/json"},
            )
            assert status == 200 and b"error" not in out, out
    return last, n


def check_latest_per_key(reader, server, last, published):
    """Never closed; the latest of each key; delivered + skipped = published, as counted."""
    assert reader.done and not reader.closed
    m = server.metrics()
    assert m['clarion_closes_total{reason="slow_consumer"}'] == 0
    events = reader.events()
    messages = [d for e, d in events if e == "message" and d.get("k") != "done"]
    skipped = sum(d["skipped"] for e, d in events if e == "conflated")
    assert skipped > 0 and len(messages) + skipped == published
    assert m["clarion_conflated_skipped_total"] == skipped
    seen = {}
    for d in messages:
        assert d["n"] > seen.get(d["sym"], 0)
        seen[d["sym"]] = d["n"]
    assert seen == last


def read_slowly(subscribe_on, publish_on):
    sock = slow_reader(subscribe_on, "ws", "px")
    time.sleep(0.3)
    reader = Reader(sock, "ws")
    reader.start()
    try:
        last, published = tick(publish_on, rounds=10)
        reader.fast.set()
        publish_on.publish("px", '{"k":"done"}')
        reader.join(30)
        return reader, last, published
    finally:
        sock.close()


def test_a_slow_reader_is_conflated_by_the_publishers_key(start_server, tmp_path):
    server = start_server("--config", config(tmp_path))
    reader, last, published = read_slowly(server, server)
    check_latest_per_key(reader, server, last, published)


@pytest.mark.parametrize("broker", ["redis", "nats"])
def test_a_slow_reader_on_node_b_keeps_the_latest_per_key_published_on_node_a(cluster, tmp_path, broker):
    if broker == "redis":
        _, (a, b) = nodes(cluster, 2, "--config", config(tmp_path))
    else:
        a, b = cluster.start_nodes(
            2, "--broker", cluster.nats().url, "--node-name", "n{i}", "--workers", "2",
            "--config", config(tmp_path),
        )
        time.sleep(0.3)  # node b's interest reaches the NATS server before the first publish
    reader, last, published = read_slowly(b, a)
    check_latest_per_key(reader, b, last, published)


def test_max_rate_debounces_by_the_publishers_key(start_server, tmp_path):
    table = '[[conflate_topics]]\npattern = "rt"\nkey = "field"\nmax_rate = 5\n'
    server = start_server("--config", config(tmp_path, table))
    sub = Sse(server, "/sse?topic=rt&format=json")
    sub.start()
    time.sleep(0.2)
    last = {}
    for i in range(40):
        k = f"k{i % 2}"
        status, _, out = server.request("POST", f"/publish/rt?conflation_key={k}", f"{k}={i}".encode())
        assert status == 200, out
        last[k] = f"{k}={i}"
        time.sleep(0.01)
    deadline = time.monotonic() + 3
    got = lambda: {m["data"].split("=")[0]: m["data"] for _, kind, m in sub.events if kind != "conflated"}
    while time.monotonic() < deadline and got() != last:
        time.sleep(0.02)
    # Plain-text payloads: only the publish field keys them, and each key ends on its latest.
    assert got() == last
    delivered = [m for _, kind, m in sub.events if kind != "conflated"]
    skipped = sum(m["skipped"] for _, kind, m in sub.events if kind == "conflated")
    assert skipped > 0 and len(delivered) + skipped == 40
    assert server.metrics()["clarion_debounced_total"] == skipped
    sub.sock.close()


@pytest.mark.parametrize(
    "key, says",
    [("k" * 257, "257 bytes, more than the 256"), ("", "empty"), ("a\tb", "control character")],
)
def test_a_bad_conflation_key_is_refused_with_400_and_counted(start_server, tmp_path, key, says):
    server = start_server("--config", config(tmp_path))
    status, _, out = server.request("POST", f"/publish/px?conflation_key={quote(key)}", b"x")
    assert status == 400 and says.encode() in out, out
    batch = {"messages": [{"topic": "px", "data": "x", "conflation_key": key}]}
    status, _, out = server.request(
        "POST", "/publish", json.dumps(batch).encode(), {"Content-Type": "application/json"}
    )
    item = json.loads(out)["results"][0]
    assert status == 200 and item["status"] == 400, out
    assert "invalid conflation_key" in item["error"] and says in item["error"], out
    assert server.metrics()["clarion_conflation_key_errors_total"] == 2
