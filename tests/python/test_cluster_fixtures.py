"""Self-test of the cluster fixtures (cluster_util.py): private Redis and NATS servers start,
answer, lose their data on restart (same port), stall when paused and answer again when
resumed; Clarion nodes start on their own ports, pass extra arguments through, die with
kill -9, come back on the same ports and report healthy; everything is gone after close()."""

import socket

import pytest

from cluster_util import Cluster, RedisError, cluster, wait_until  # noqa: F401 (fixture)


def test_redis_restart_loses_data_and_pause_stalls_it(cluster):
    redis = cluster.redis()
    assert redis.ping()
    assert redis.url == f"redis://127.0.0.1:{redis.port}"
    assert redis.command_reply("SET", "k", "v") == "OK"
    assert redis.command_reply("GET", "k") == b"v"
    assert redis.command_reply("PUBSUB", "NUMSUB", "chan") == [b"chan", 0]
    with pytest.raises(RedisError):
        redis.command_reply("NO-SUCH-COMMAND")
    assert redis.command_reply("CONFIG", "GET", "save") == [b"save", b""]

    port = redis.port
    redis.restart()
    assert redis.port == port and redis.ping()
    assert redis.command_reply("GET", "k") is None, "no persistence: the data is gone"

    redis.pause()
    with pytest.raises(OSError):  # the kernel accepts, the process never answers
        redis.command_reply("PING", timeout=0.5)
    redis.resume()
    assert redis.ping()


def test_nats_restart_and_pause(cluster):
    nats = cluster.nats()
    assert nats.ping()
    assert nats.url == f"nats://127.0.0.1:{nats.port}"
    assert nats.monitor("varz")["port"] == nats.port
    assert nats.subscriptions() == 0

    # A subscriber shows up in the monitoring counts.
    with socket.create_connection(("127.0.0.1", nats.port), timeout=5) as s:
        s.recv(65536)
        s.sendall(b'CONNECT {"verbose":false,"name":"n1"}\r\nSUB clarion.t.x 1\r\nPING\r\n')
        wait_until(lambda: b"PONG" in s.recv(65536), 5, "PONG")
        assert nats.subjects() == {"n1": ["clarion.t.x"]}
        assert nats.subscriptions() == 1

    port = nats.port
    nats.restart()
    assert nats.port == port and nats.ping()
    nats.pause()
    with pytest.raises(OSError):
        nats.ping(timeout=0.5)
    nats.resume()
    assert nats.ping()


def test_nodes_start_die_and_come_back(cluster):
    a, b = cluster.start_nodes(2, "--workers", "{i}", "--max-connections", "10{i}")
    assert a.port != b.port and a.api != b.api
    assert a.wait_healthy() == "ok\n"
    b.wait_healthy()
    assert a.publish("t", "hello")["id"]
    # The arguments reached each node, with its number in place of {i}.
    assert "(1 worker, up to 101 connections)" in a.log_text()
    assert "(2 workers, up to 102 connections)" in b.log_text()

    port, api = a.port, a.api
    a.kill9()
    assert not a.running
    assert a.healthz()[0] is None
    b.wait_healthy()  # the other node is untouched
    a.restart()
    assert (a.port, a.api) == (port, api)
    a.wait_healthy()
    assert a.log_text().count("up to 101 connections") == 2, "same arguments, one log"
    code, log = a.stop()
    assert code == 0 and "signal 15" in log

    with pytest.raises(RuntimeError, match="did not start"):
        cluster.node("--workers", "not-a-number")


def test_close_ends_every_process(tmp_path):
    c = Cluster(tmp_path)
    try:
        procs = [c.redis().proc, c.nats().proc, c.node().proc]
        nats = c.brokers[1]
        nats.pause()  # a paused broker is killed too
    finally:
        c.close()
    assert all(p.poll() is not None for p in procs)
