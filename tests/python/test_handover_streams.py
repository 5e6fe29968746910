"""Appendable messages across a hand-over upgrade (SIGUSR1, docs/upgrades.md): the open streams
move with the history, so a publisher appending to a stream opened before the upgrade carries
on with no error, a subscriber connected before and one resuming after get the whole text
exactly once, and `stream_timeout` still closes a stream left open."""

import json
import os
import signal
import time

import pytest

from test_cluster import recv_json, ws_sub
from test_handover import wait_exit
from test_streams import Reader, fragment, post

pytestmark = pytest.mark.timeout(60)


def sigusr1(server, pid_file):
    """Upgrades `server` in place; returns the successor's pid (the same addresses serve)."""
    old_pid = server.proc.pid
    server.proc.send_signal(signal.SIGUSR1)
    line = server.proc.stdout.readline()
    assert line.startswith("clarion ready"), line
    assert wait_exit(server.proc) == 0
    for _ in range(100):
        new_pid = int(pid_file.read_text())
        if new_pid != old_pid:
            return new_pid
        time.sleep(0.05)
    pytest.fail("the successor did not write its pid")


def test_a_stream_opened_before_an_upgrade_carries_on_and_every_subscriber_gets_its_text_once(
    start_server, tmp_path
):
    pid_file = tmp_path / "clarion.pid"
    s = start_server("--pid-file", pid_file)
    before = ws_sub(s, "ai")
    opened = fragment(s, "ai", "stream=open", "The answer")
    sid = opened["stream"]
    fragment(s, "ai", f"append_to={sid}", " is")
    plain = s.publish("ai", "plain")
    new_pid = sigusr1(s, pid_file)
    try:
        # The publisher carries on: both answered 200, the fragment numbers continue.
        more = fragment(s, "ai", f"append_to={sid}", " forty-two")
        assert more["seq"] == 3 and more["stream"] == sid, more
        last = fragment(s, "ai", f"append_to={sid}&done=1", ".")
        assert (last["seq"], last["done"]) == (4, True), last
        # The subscriber from before the upgrade (its connection moved): every fragment once,
        # in order with the plain message.
        reader = Reader()
        got = [recv_json(before) for _ in range(5)]
        assert [m["type"] for m in got] == ["append", "append", "message", "append", "append"]
        assert got[2]["data"] == "plain" and got[2]["id"] == plain["id"]
        for m in got:
            reader.take(m)
        assert reader.streams[sid] == ("The answer is forty-two.", 4, True)
        before.close()
        # A subscriber resuming from the start after the upgrade: the plain message, then the
        # stream as ONE folded message with the whole text.
        after = ws_sub(s, "ai", since=sid.split("-")[0] + "-0")
        got = [recv_json(after) for _ in range(2)]
        assert got[0]["data"] == "plain" and "stream" not in got[0], got
        assert got[1]["type"] == "message" and got[1]["stream"] == sid, got
        assert (got[1]["data"], got[1]["seq"], got[1]["done"]) == (
            "The answer is forty-two.", 4, True,
        )
        after.close()
        # The stream stays closed: a late append is told so (409), as before the upgrade.
        status, answer = post(s, "ai", f"append_to={sid}", "x")
        assert status == 409, answer
    finally:
        os.kill(new_pid, signal.SIGTERM)


def test_stream_timeout_still_closes_a_stream_left_open_across_an_upgrade(start_server, tmp_path):
    pid_file = tmp_path / "clarion.pid"
    s = start_server("--pid-file", pid_file, "--stream-timeout", "2")
    opened = fragment(s, "ai", "stream=open", "partial")
    sid = opened["stream"]
    new_pid = sigusr1(s, pid_file)
    try:
        ws = ws_sub(s, "ai")
        closing = recv_json(ws, timeout=10)
        assert (closing["type"], closing["stream"], closing["seq"], closing["done"]) == (
            "append", sid, 2, True,
        ), closing
        assert closing["reason"] == "timeout"
        ws.close()
        status, answer = post(s, "ai", f"append_to={sid}", "late")
        assert status == 409, answer
    finally:
        os.kill(new_pid, signal.SIGTERM)
