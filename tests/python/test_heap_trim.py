"""The heap goes back to the kernel once a storm of new connections is over (worker/trim.rs).

A storm is at least 1,024 connections admitted since the last trim; it is over at the second
second in a row with fewer than 64 new ones. The trim is logged at debug level.
"""

import re
import socket
import threading
import time

import rawws
from cluster_util import wait_until
from conftest import Server

TRIMMED = re.compile(r"heap trimmed after (\d+) connections")


def collect(stream, lines):
    for line in stream:
        lines.append(line)


def trims(lines):
    return [int(m.group(1)) for line in list(lines) for m in [TRIMMED.search(line)] if m]


def connect(port, n):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        socks.append(s)
    return socks


def test_a_storm_of_connections_is_followed_by_one_trim_and_a_trickle_by_none(start_server):
    server = start_server(
        "--max-connections-per-address", "0", "--handshake-timeout", "60",
        env={"CLARION_LOG": "debug"},
    )
    lines = []
    threading.Thread(target=collect, args=(server.proc.stderr, lines), daemon=True).start()
    held = []
    try:
        held += connect(server.port, 1_100)
        wait_until(lambda: trims(lines), 10, "a trim after 1,100 connections")
        assert trims(lines)[0] >= 1_024, trims(lines)
        # A trickle afterwards (fewer than a storm's worth) is not trimmed for.
        for _ in range(5):
            held += connect(server.port, 40)
            time.sleep(1)
        time.sleep(3)
        assert len(trims(lines)) == 1, trims(lines)
    finally:
        for s in held:
            s.close()


def test_connections_taken_over_in_a_hand_over_count_toward_a_storm(start_server):
    # A process that takes 1,100 connections over from its predecessor grew its heap as much as
    # if it had accepted them: it trims once they are in.
    flags = ["--max-connections-per-address", "0", "--handshake-timeout", "60"]
    old = start_server(*flags, env={"CLARION_LOG": "debug"})
    threading.Thread(target=collect, args=(old.proc.stderr, []), daemon=True).start()
    held = []
    new = None
    try:
        for _ in range(1_100):
            sock, head, _ = rawws.connect(old.clients, "/ws?topic=t")
            assert head.startswith("HTTP/1.1 101"), head
            held.append(sock)
        time.sleep(3)  # the old process's own storm is over (and trimmed for) first
        new = Server(["--upgrade-from", str(old.proc.pid), *flags], env={"CLARION_LOG": "debug"})
        lines = []
        threading.Thread(target=collect, args=(new.proc.stderr, lines), daemon=True).start()
        assert old.proc.wait(timeout=30) == 0
        assert new.metrics()['clarion_handover_connections{outcome="taken"}'] == 1_100
        wait_until(lambda: trims(lines), 10, "a trim after 1,100 connections taken over")
        assert trims(lines)[0] >= 1_024, trims(lines)
    finally:
        for s in held:
            s.close()
        if new is not None and new.proc.poll() is None:
            new.proc.kill()
            new.proc.wait()
