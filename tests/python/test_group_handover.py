"""Rolling upgrade of a `--processes` group with Redis (SIGUSR1 to the supervisor): one process
at a time, a successor takes the process's listeners and live connections and resumes each from
where the old process stopped delivering, reading what was published meanwhile (on the other
processes) from Redis. Clients see no close and no reconnect; every message arrives once, in
order. Connections whose state cannot move get 1012 and resume exactly elsewhere (issue 34)."""

import json
import re
import signal
import struct
import time

import httpx
import pytest

import rawws
from cluster_util import Redis
from test_group import group_healthy, node_values, roll, wait_for
from test_handover import (
    DeflateWs,
    LongPoll,
    Ndjson,
    Publisher,
    RawWs,
    Sse,
    check_every_message_once_in_order,
    longest_pause,
    payload,
)


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    r = Redis(tmp_path_factory.mktemp("redis"))
    yield r
    r.kill()


class SseTwoTopics(Sse):
    """An SSE client of `t` and of `quiet`, a topic nothing is published on: its resume ids
    name each topic, one of them from before any message."""

    path = "/sse?topic=t&topic=quiet"


def start_group(start_server, redis, *extra):
    group = start_server(
        "--processes", 3, "--broker", redis.url, "--node-name", "up", "--shutdown-timeout", 3, *extra
    )
    assert wait_for(lambda: group_healthy(group, 3)), group.request("GET", "/healthz")
    return group


def test_a_rolling_upgrade_hands_every_connection_over_under_a_publishing_loop(
    start_server, redis
):
    group = start_group(start_server, redis)
    n = 1500
    kinds = (RawWs, DeflateWs, Sse, SseTwoTopics, Ndjson, LongPoll)
    clients = [kind(group.clients, n) for kind in kinds for _ in range(3)]
    for c in clients:
        c.start()
        assert c.ready.wait(10)
    time.sleep(0.5)  # every subscription is in place before the first publish
    per_node = node_values(group.metrics(), "clarion_connections", transport="ws")
    # Publishes go through the group's API port, so through every process in turn.
    pub = Publisher(group.api, n, pause=0.008)
    pub.start()
    assert pub.progress.wait(60)
    serving = roll(group)
    # The whole roll happened under the publishing loop.
    assert pub.is_alive(), "the roll outlasted the publishing loop: make it longer"
    # Never fewer than 2 of 3 processes serving.
    assert min(serving) >= 2, serving
    pub.join(timeout=120)
    assert len(pub.ids) == n
    check_every_message_once_in_order(clients, n)
    # The same sockets still work, answered by the new processes.
    for c in clients:
        if isinstance(c, (RawWs, DeflateWs)):
            assert c.still_open(), c.name
    m = group.metrics()
    restarts = node_values(m, "clarion_group_restarts_total")
    assert sorted(restarts.values()) == [1, 1, 1], restarts
    taken = node_values(m, "clarion_handover_connections", outcome="taken")
    code, stderr = group.stop(signal.SIGTERM, timeout=30)
    assert code == 0, stderr
    done = re.search(r"rolling upgrade done: (\d+) processes handed over \((\d+) connections moved\), "
                     r"(\d+) restarted with a drain", stderr)
    assert done, stderr
    assert done.group(1) == "3" and done.group(3) == "0", done.group(0)
    # Every client connection moved (each lives on one process, replaced once).
    assert int(done.group(2)) >= len(clients), (done.group(0), taken)
    print(f"connections per process before: {per_node}; taken: {taken}; "
          f"longest delivery pause: {longest_pause(clients) * 1000:.0f} ms; "
          f"publishes refused while frozen: {pub.refused}")


def test_a_connection_that_cannot_move_gets_1012_and_resumes_exactly(start_server, redis):
    # A client in the middle of a fragmented compressed message cannot move: that WebSocket is
    # told to reconnect (1012) while the others beside it carry on, dedicated compression
    # included (each compressor's window moves with it, and the client sent a compressed
    # message of its own); resuming from its last id it misses nothing.
    group = start_group(start_server, redis, "--compression", "dedicated",
                        "--compression-threshold", "0")
    movers = [RawWs(group.clients, 4) for _ in range(3)]
    compressed = [DeflateWs(group.clients, 4) for _ in range(3)]
    for c in compressed:
        c.ws.send(json.dumps({"type": "subscribe", "topic": "u"}))
        assert json.loads(c.ws.recv(timeout=10))["type"] == "subscribed"
    stayers = []
    for _ in range(3):
        sock, head, rest = rawws.connect(
            group.clients, "/ws?topic=t", "Sec-WebSocket-Extensions: permessage-deflate\r\n"
        )
        assert "client_no_context_takeover" in head, head
        sock.sendall(rawws.frame(1, b"\xaa\x56\x2a", fin=False, rsv=4))
        stayers.append(rawws.Reader(sock, rest))
    time.sleep(0.3)
    ids = [group.publish("t", payload(1))["id"]]
    for r in stayers:
        assert r.frame()[1] == 1  # payload(1), compressed with its own context
    for c in movers + compressed:
        c.start()
    roll(group)
    for r in stayers:
        while True:
            _, op, data = r.frame()
            if op == 8:
                assert struct.unpack("!H", data[:2])[0] == 1012
                break
    for i in range(2, 5):
        ids.append(group.publish("t", payload(i))["id"])
    # The client that fell back resumes from its last id: exactly what it missed, no gap.
    answer = httpx.get(f"http://{group.clients}/poll?topic=t&since={ids[0]}&timeout=0").json()
    assert "gaps" not in answer, answer
    assert [m["data"] for m in answer["messages"]] == [payload(i) for i in range(2, 5)]
    assert [m["id"] for m in answer["messages"]] == ids[1:]
    for c in movers + compressed:
        c.join(timeout=30)
        assert c.ended is None and c.got == [1, 2, 3, 4], (c.name, c.ended, c.got)
        assert c.still_open()
    code, stderr = group.stop(signal.SIGTERM, timeout=30)
    assert code == 0, stderr
    assert "deflate_fragmented" in stderr, stderr
    assert "deflate_context" not in stderr, stderr


def test_a_nats_group_refuses_the_hand_over_and_each_process_restarts_with_a_drain(
    start_server, tmp_path
):
    # NATS subscriptions are not handed over: each old process refuses its successor and
    # restarts with a drain (1012); the roll goes on and every process is replaced.
    from cluster_util import Nats

    nats = Nats(tmp_path / "nats")
    try:
        group = start_server(
            "--processes", 3, "--broker", nats.url, "--node-name", "nt", "--shutdown-timeout", 3
        )
        assert wait_for(lambda: group_healthy(group, 3)), group.request("GET", "/healthz")
        clients = [RawWs(group.clients, 1) for _ in range(6)]
        for c in clients:
            c.start()
        roll(group)
        for c in clients:
            c.join(timeout=30)
            assert c.ended and "service restart" in c.ended, c.ended
        code, stderr = group.stop(signal.SIGTERM, timeout=30)
        assert code == 0, stderr
        assert "a NATS broker's subscriptions are not handed over" in stderr, stderr
        done = "rolling upgrade done: 0 processes handed over (0 connections moved), 3 restarted"
        assert done in stderr, stderr
    finally:
        nats.kill()
