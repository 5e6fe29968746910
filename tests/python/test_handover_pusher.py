"""Upgrades keep Pusher connections (`/app/{key}`, docs/pusher.md "Upgrades"): SIGUSR1 moves a
pusher-js-like connection with its socket id, its public and presence channels, its presence
membership and its permessage-deflate context to the new process. The client sees nothing: no
Close 4200, no reconnect, the same socket; the other members see no `member_removed` /
`member_added`; the application's webhook gets no `member_removed`, `channel_vacated` or second
`channel_occupied` from the move, and the counts behind those webhooks move too (a member who
leaves afterwards is announced once)."""

import json
import os
import select
import signal

import pytest
import websockets.sync.client

from test_handover import wait_exit
from test_pusher_webhooks import Receiver, app_args
from test_pusher_ws import APP, established, join, lib, recv, send


def connect(server):
    # websockets offers permessage-deflate and keeps its inflater's context across messages,
    # so a compressor that lost its window in the move would break the next message.
    return websockets.sync.client.connect(
        f"ws://{server.clients}/app/{APP['key']}?protocol=7&client=js&version=8.4.0",
        open_timeout=5, close_timeout=2)


def event(msg):
    return msg["event"], msg.get("channel"), msg.get("data")


def test_a_pusher_connection_keeps_its_socket_id_channels_and_presence_across_an_upgrade(
        start_server, tmp_path):
    receiver = Receiver()
    pid_file = tmp_path / "clarion.pid"
    old = start_server(*app_args(receiver.url, "--compression", "dedicated",
                                 "--compression-threshold", "0", "--pid-file", pid_file))
    new_pid = None
    try:
        with connect(old) as a, connect(old) as b:
            assert "permessage-deflate" in a.response.headers["Sec-WebSocket-Extensions"]
            sid_a, sid_b = established(a), established(b)
            send(a, "pusher:subscribe", {"channel": "ticker"})
            assert recv(a)["event"] == "pusher_internal:subscription_succeeded"
            joined = join(a, sid_a, old, "presence-room", {"user_id": "1", "user_info": {"n": "a"}})
            assert joined["event"] == "pusher_internal:subscription_succeeded", joined
            watched = join(b, sid_b, old, "presence-room", {"user_id": "2"})
            assert sorted(watched["data"]["presence"]["ids"]) == ["1", "2"], watched
            assert recv(a)["event"] == "pusher_internal:member_added"
            # A compressed delivery before the move, so the deflater's window holds something.
            lib(old).trigger("ticker", "quote", {"n": 0})
            assert recv(a)["data"] == {"n": 0}
            receiver.wait(lambda: receiver.count("member_added") == 2
                          and receiver.count("channel_occupied") == 2, "webhooks before")
            local = a.socket.getsockname()

            old.proc.send_signal(signal.SIGUSR1)
            ready, _, _ = select.select([old.proc.stdout], [], [], 30)
            if not ready:
                pytest.fail(f"no successor took over: {old.proc.stderr.read()}")
            assert old.proc.stdout.readline().startswith("clarion ready")
            assert wait_exit(old.proc) == 0
            new_pid = int(pid_file.read_text())

            # The same socket, served by the new process: events on both channels, compressed
            # with the context the client's inflater kept.
            pusher = lib(old)
            pusher.trigger("ticker", "quote", {"n": 1})
            pusher.trigger("presence-room", "said", {"n": 2})
            assert event(recv(a)) == ("quote", "ticker", {"n": 1})
            assert event(recv(a)) == ("said", "presence-room", {"n": 2})
            assert a.socket.getsockname() == local
            # The watcher's next message is the event: no member_removed / member_added.
            assert event(recv(b)) == ("said", "presence-room", {"n": 2})
            # The same socket id: a trigger excluding it skips it, and reaches the others.
            pusher.trigger("presence-room", "not-for-a", {"n": 3}, socket_id=sid_a)
            pusher.trigger("presence-room", "for-all", {"n": 4})
            assert recv(b)["event"] == "not-for-a"
            assert recv(b)["event"] == "for-all"
            assert recv(a)["event"] == "for-all"
            # Its ping state and the members as the API lists them.
            send(a, "pusher:ping")
            assert recv(a)["event"] == "pusher:pong"
            users = pusher.users_info("presence-room")
            assert sorted(u["id"] for u in users["users"]) == ["1", "2"]
            assert receiver.count("member_removed") == 0, receiver.events
            assert receiver.count("channel_vacated") == 0, receiver.events
            # Both moved (the successor shares the old process's output: its log cannot be
            # read to the end here, its metrics can).
            _, _, metrics = old.request("GET", "/metrics")
            assert b'clarion_handover_connections{outcome="taken"} 2' in metrics, metrics
        # Both leave now: each member is removed once and each channel vacated once, so the
        # new process counted what moved.
        receiver.wait(lambda: receiver.count("member_removed") == 2
                      and receiver.count("channel_vacated") == 2, "webhooks after")
        assert receiver.count("member_added") == 2, receiver.events
        assert receiver.count("channel_occupied") == 2, receiver.events
        assert receiver.invalid == []
    finally:
        receiver.close()
        if new_pid is not None:
            os.kill(new_pid, signal.SIGTERM)
