"""Appendable messages across a hand-over upgrade (SIGUSR1, docs/upgrades.md): the open streams
move with the history, so a publisher appending to a stream opened before the upgrade carries
on with no error, a subscriber connected before and one resuming after get the whole text
exactly once, and `stream_timeout` still closes a stream left open. With `history_dir` too:
the streams stay open across the upgrade and the log still folds them exactly at a later
restart."""

import json
import os
import signal
import time

import pytest
from websockets.exceptions import ConnectionClosed

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


def gone(pid, timeout=10):
    """Waits until process `pid` (not a child of the test) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"process {pid} did not exit")


def nothing_more(ws):
    try:
        extra = ws.recv(timeout=0.3)
    except TimeoutError:
        return
    except ConnectionClosed:
        return
    pytest.fail(f"unexpected: {extra}")


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "kill9"])
def test_with_history_dir_a_stream_carries_on_across_an_upgrade_and_folds_exactly_after_a_restart(
    start_server, tmp_path, how
):
    pid_file, d = tmp_path / "clarion.pid", tmp_path / "hist"
    s = start_server("--pid-file", pid_file, "--history-dir", d)
    opened = fragment(s, "ai", "stream=open", "The answer")
    sid = opened["stream"]
    epoch = sid.split("-")[0]
    fragment(s, "ai", f"append_to={sid}", " is")
    plain = s.publish("ai", "plain")
    left_open = fragment(s, "ai", "stream=open", "Still")["stream"]
    new_pid = sigusr1(s, pid_file)
    try:
        # The publishers carry on: 200s, the same stream ids, the fragment numbers continue.
        more = fragment(s, "ai", f"append_to={sid}", " forty-two")
        assert (more["seq"], more["stream"]) == (3, sid), more
        last = fragment(s, "ai", f"append_to={sid}&done=1", ".")
        assert (last["seq"], last["done"]) == (4, True), last
        typing = fragment(s, "ai", f"append_to={left_open}", " typing")
        assert (typing["seq"], typing["stream"]) == (2, left_open), typing
        # A subscriber resuming from the start: the plain message, each stream once with its
        # whole text, neither closed by the upgrade.
        ws = ws_sub(s, "ai", since=f"{epoch}-0")
        got = [recv_json(ws) for _ in range(3)]
        nothing_more(ws)
        ws.close()
        assert got[0]["data"] == "plain" and got[0]["id"] == plain["id"], got
        assert got[1]["stream"] == sid, got
        assert (got[1]["data"], got[1]["seq"], got[1]["done"]) == ("The answer is forty-two.", 4, True)
        assert "reason" not in got[1]
        assert got[2]["stream"] == left_open and got[2]["id"] == typing["id"], got
        assert (got[2]["data"], got[2]["seq"]) == ("Still typing", 2)
        assert "done" not in got[2], got
    finally:
        os.kill(new_pid, how)
        gone(new_pid)
    # A later restart folds the log the successor wrote to the same texts.
    s = start_server("--history-dir", d)
    ws = ws_sub(s, "ai", since=f"{epoch}-0")
    got = [recv_json(ws) for _ in range(3)]
    ws.close()
    assert got[0]["id"] == plain["id"], got
    assert (got[1]["stream"], got[1]["data"], got[1]["seq"]) == (sid, "The answer is forty-two.", 4)
    assert got[1]["done"] is True and "reason" not in got[1], got
    # The stream still open at the stop: its text up to its last 200, closed by that restart.
    assert (got[2]["stream"], got[2]["data"], got[2]["seq"]) == (left_open, "Still typing", 2)
    assert (got[2]["done"], got[2]["reason"]) == (True, "restart"), got


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "history_dir"])
def test_stream_timeout_still_closes_a_stream_left_open_across_an_upgrade(
    start_server, tmp_path, durable
):
    pid_file = tmp_path / "clarion.pid"
    extra = ["--history-dir", tmp_path / "hist"] if durable else []
    s = start_server("--pid-file", pid_file, "--stream-timeout", "2", *extra)
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
