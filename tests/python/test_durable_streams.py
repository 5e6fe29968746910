"""Appendable messages with `history_dir` (docs/history.md, "Appendable messages"): streams are
accepted; after a restart, graceful or `kill -9`, history holds each stream folded at its place
with the text up to the last fragment acknowledged (200), an open one closed by the restart
(`"reason":"restart"`), and an append to it is answered 404 (the new process has no open
stream of that id)."""

import signal

import pytest

from test_cluster import recv_json, ws_sub
from test_streams import fragment, post

pytestmark = pytest.mark.timeout(60)


def start_durable(start_server, d, *extra):
    return start_server("--history-dir", d, *extra)


def replay_from_start(server, topic, epoch, count):
    ws = ws_sub(server, topic, since=f"{epoch}-0")
    got = [recv_json(ws) for _ in range(count)]
    ws.close()
    return got


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "kill9"])
def test_a_restart_keeps_each_stream_folded_with_the_text_up_to_the_last_200(
    start_server, tmp_path, how
):
    d = tmp_path / "hist"
    s = start_durable(start_server, d)
    done = fragment(s, "ai", "stream=open", "Finished")
    fragment(s, "ai", f"append_to={done['stream']}&done=1", " answer.")
    opened = fragment(s, "ai", "stream=open", "The")
    sid = opened["stream"]
    epoch = sid.split("-")[0]
    fragment(s, "ai", f"append_to={sid}", " answer")
    plain = s.publish("ai", "plain")
    last = fragment(s, "ai", f"append_to={sid}", " is")
    s.stop(how)
    s = start_durable(start_server, d)
    got = replay_from_start(s, "ai", epoch, 3)
    assert got[0]["stream"] == done["stream"], got
    assert (got[0]["data"], got[0]["seq"], got[0]["done"]) == ("Finished answer.", 2, True)
    assert "reason" not in got[0]
    assert got[1]["data"] == "plain" and got[1]["id"] == plain["id"], got
    # The open stream: its text up to the last fragment answered 200, at that fragment's place,
    # closed by the restart.
    assert got[2]["type"] == "message" and got[2]["stream"] == sid, got
    assert (got[2]["id"], got[2]["data"], got[2]["seq"]) == (last["id"], "The answer is", 3)
    assert (got[2]["done"], got[2]["reason"]) == (True, "restart")
    status, answer = post(s, "ai", f"append_to={sid}", " late")
    assert status == 404, answer
    # New streams work in the new process.
    again = fragment(s, "ai", "stream=open", "next")
    assert again["seq"] == 1


def test_a_long_stream_across_many_segments_survives_kill_9_exactly(start_server, tmp_path):
    """Small segments: the stream's fragments span several files, and the log rotates and is
    rewritten while the stream is open; its text still folds exactly."""
    d = tmp_path / "hist"
    s = start_durable(start_server, d, "--history-segment-bytes", "4096")
    words = [f"w{i:03d} " + "x" * 40 for i in range(200)]
    opened = fragment(s, "ai", "stream=open", words[0])
    sid = opened["stream"]
    for i, w in enumerate(words[1:], start=1):
        fragment(s, "ai", f"append_to={sid}", w)
        if i % 20 == 0:
            s.publish("ai", f"plain{i}")
    s.stop(signal.SIGKILL)
    s = start_durable(start_server, d)
    got = replay_from_start(s, "ai", sid.split("-")[0], 10)
    folded = [m for m in got if m.get("stream") == sid]
    assert len(folded) == 1, got
    assert (folded[0]["data"], folded[0]["seq"]) == ("".join(words), len(words))
    assert [m["data"] for m in got if "stream" not in m] == [f"plain{i}" for i in range(20, 200, 20)]
