"""Upgrades that keep connections, over HTTP/2: a connection moves with every stream it carries
(EventSources, long-polls, RFC 8441 WebSockets), over h2c and TLS, one at rest included; a
stream that cannot move is refused and its connection moves. The helpers shared with the
HTTP/1.1 cases are in test_handover.py."""

import json
import os
import signal
import threading
import time

import h2.events
import h2client
import pytest

from test_handover import (
    Publisher,
    check_every_message_once_in_order,
    longest_pause,
    payload,
    wait_exit,
)


class H2Stream:
    """One stream's view for `check_every_message_once_in_order`: its payload numbers, and
    whether its connection ended."""

    def __init__(self, conn, name):
        self.conn, self.name = conn, name
        self.got, self.times = [], []

    @property
    def ended(self):
        return self.conn.ended

    def join(self, timeout=None):
        self.conn.join(timeout)

    def note(self, text):
        self.got.append(int(text.split(":", 1)[0][1:]))
        self.times.append(time.monotonic())


class H2Subscriber(threading.Thread):
    """One HTTP/2 connection (h2c prior knowledge, or TLS with ALPN h2) carrying `sse` SSE
    streams, and with `extras` a long-poll stream (each poll a new stream from the last
    cursor: its requests go through the server's HPACK table) and an RFC 8441 WebSocket, all
    on topic `t`, read by hyper-h2 on one socket for the whole test. Any RST_STREAM, GOAWAY
    or end of the socket is the failure."""

    def __init__(self, addr, n, sse=1, extras=False, ca=None):
        super().__init__(daemon=True)
        self.n = n
        self.c = h2client.Client(addr, ca=ca, timeout=60)
        self.name = f"h2{'-tls' if ca else 'c'}"
        self.ended = None
        self.pong = threading.Event()
        self.sse = {}
        for i in range(sse):
            sid = self.c.request("/sse?topic=t")
            self.sse[sid] = H2Stream(self, f"{self.name} sse {i + 1}/{sse}")
        self.poll = self.ws = None
        self.polls = 0
        if extras:
            self.c.pump(
                lambda: h2client.SETTINGS_ENABLE_CONNECT_PROTOCOL in self.c.remote_settings,
                what="SETTINGS",
            )
            self.ws_sid = self.c.request(
                "/ws?topic=t", method="CONNECT",
                headers=[("sec-websocket-version", "13")], end_stream=False,
            )
            self.ws = H2Stream(self, f"{self.name} ws")
            self.poll = H2Stream(self, f"{self.name} poll")
            self.poll_sid = self.c.request("/poll?topic=t&timeout=20")
        waiting = list(self.sse) + ([self.ws_sid] if extras else [])
        self.c.pump(lambda: all(s in self.c.headers for s in waiting), what="the answers")
        assert all(self.c.status(s) == 200 for s in waiting)
        self.ws_seen = 0

    def streams(self):
        return [*self.sse.values(), *(x for x in (self.poll, self.ws) if x)]

    def complete(self):
        return all(len(s.got) >= self.n for s in self.streams())

    def feed(self, data):
        for ev in self.c.conn.receive_data(data):
            if isinstance(ev, h2.events.DataReceived):
                self.c.body.setdefault(ev.stream_id, bytearray()).extend(ev.data)
                if ev.flow_controlled_length:
                    self.c.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.ResponseReceived):
                self.c.headers[ev.stream_id] = dict(ev.headers)
            elif isinstance(ev, h2.events.StreamEnded):
                self.c.ended.add(ev.stream_id)
            elif isinstance(ev, h2.events.StreamReset):
                raise AssertionError(f"RST_STREAM {ev.error_code!r} on stream {ev.stream_id}")
            elif isinstance(ev, h2.events.ConnectionTerminated):
                raise AssertionError(f"GOAWAY {ev.error_code!r}")
            elif isinstance(ev, h2.events.PingAckReceived):
                self.pong.set()
        self.c.flush()

    def collect(self):
        for sid, view in self.sse.items():
            msgs = h2client.messages(self.c.body.get(sid, b""))
            for _, data in msgs[len(view.got):]:
                view.note(data)
        if self.ws:
            from test_http2 import ws_frames

            frames = ws_frames(self.c.body.get(self.ws_sid, b""))
            for _, op, payload in frames[self.ws_seen:]:
                assert op == 1, (op, payload)
                self.ws.note(payload.decode())
            self.ws_seen = len(frames)
        if self.poll and self.poll_sid in self.c.ended:
            body = json.loads(bytes(self.c.body[self.poll_sid]))
            assert self.c.status(self.poll_sid) == 200, body
            assert not body.get("gaps"), body
            for m in body["messages"]:
                self.poll.note(m["data"])
            self.polls += 1
            if len(self.poll.got) < self.n:
                self.poll_sid = self.c.request(f"/poll?topic=t&since={body['cursor']}&timeout=20")

    def run(self):
        try:
            while not self.complete():
                self.c.sock.settimeout(60)
                data = self.c.sock.recv(65536)
                if not data:
                    raise EOFError("the connection was closed")
                self.feed(data)
                self.collect()
        except Exception as e:  # noqa: BLE001 - any end of the connection is the failure
            self.ended = repr(e)

    def still_open(self):
        """A PING on the same socket is answered by whoever holds it now; nothing else comes
        (no reset, no GOAWAY)."""
        self.c.conn.ping(b"still!!!")
        self.c.flush()
        deadline = time.monotonic() + 10
        while not self.pong.is_set():
            assert time.monotonic() < deadline, "no PING answer"
            self.c.sock.settimeout(1)
            try:
                data = self.c.sock.recv(65536)
            except TimeoutError:
                continue
            assert data, "the connection was closed"
            self.feed(data)
        return True



def upgrade_in_place(old, pid_file):
    """SIGUSR1: the old process starts its successor, hands it every connection and exits.
    The successor's pid, and its log up to the summary of what moved (it writes to the same
    stderr and keeps it open); the successor is stopped if that summary never comes."""
    old.proc.send_signal(signal.SIGUSR1)
    line = old.proc.stdout.readline()
    assert line.startswith("clarion ready"), line
    assert wait_exit(old.proc) == 0
    new_pid = int(pid_file.read_text())
    log = ""
    try:
        while "connections moved" not in log:
            line = old.proc.stderr.readline()
            assert line, log
            log += line
    except BaseException:
        os.kill(new_pid, signal.SIGTERM)
        raise
    return new_pid, log


@pytest.mark.parametrize("mode", ["h2c", "tls"])
def test_sigusr1_moves_http2_connections_with_every_stream_and_no_reset(
    start_server, tmp_path, mode
):
    """Every browser reaching the server over TLS speaks HTTP/2: its EventSource streams, long
    polls and RFC 8441 WebSockets share a connection, which moves with all of them."""
    from test_tls import make_dev_cert

    dev = make_dev_cert(tmp_path / "tls")
    pid_file = tmp_path / "clarion.pid"
    old = start_server(
        "--history-dir", str(tmp_path / "hist"), "--pid-file", pid_file,
        "--tls-listen", "127.0.0.1:0", "--tls-cert", dev["cert"], "--tls-key", dev["key"],
    )
    addr, ca = (old.tls.replace("127.0.0.1", "localhost"), dev["ca"]) if mode == "tls" else (old.clients, None)
    n = 200
    one = H2Subscriber(addr, n, sse=1, ca=ca)
    six = H2Subscriber(addr, n, sse=6, extras=True, ca=ca)
    conns = [one, six]
    for c in conns:
        c.start()
    time.sleep(0.3)  # every subscription is in place before the first publish
    pub = Publisher(old.api, n, pause=0.05)  # 20 messages a second
    pub.start()
    assert pub.progress.wait(30)
    new_pid, log = upgrade_in_place(old, pid_file)
    try:
        assert "2 connections moved" in log and "0 stay" in log, log
        pub.join(timeout=90)
        assert len(pub.ids) == n
        streams = [s for c in conns for s in c.streams()]
        assert len(streams) == 9
        check_every_message_once_in_order(streams, n)
        # The same connections, served by the new process: a PING is answered, nothing
        # was reset, no GOAWAY came.
        for c in conns:
            assert c.still_open()
        assert six.polls >= 2
        metrics = old.metrics()  # the API listener moved: the new process answers
        assert metrics['clarion_handover_connections{outcome="taken"}'] == 2
        print(f"longest delivery pause: {longest_pause(streams) * 1000:.0f} ms")
    finally:
        os.kill(new_pid, signal.SIGTERM)


def test_an_http2_stream_that_cannot_move_is_refused_and_its_connection_moves(
    start_server, tmp_path
):
    """A long-poll whose answer is written but held by the client's window (its record is
    finishing, not carried) is refused with REFUSED_STREAM, which a client retries; the SSE
    stream beside it and the connection move."""
    pid_file = tmp_path / "clarion.pid"
    old = start_server("--history-dir", str(tmp_path / "hist"), "--pid-file", pid_file)
    c = h2client.Client(old.clients, initial_window=16384, timeout=30)
    sse = c.request("/sse?topic=t")
    poll = c.request("/poll?topic=big&timeout=20")
    c.hold.add(poll)
    c.pump(lambda: sse in c.headers, what="the SSE answer")
    time.sleep(0.3)
    old.publish("big", "x" * 50_000)
    c.pump(lambda: len(c.body[poll]) >= 16_000, what="the poll's first window")
    old.publish("t", payload(1))
    c.pump(lambda: len(h2client.messages(c.body[sse])) == 1, what="message 1")
    new_pid, log = upgrade_in_place(old, pid_file)
    try:
        assert "1 connections moved" in log, log
        assert "0 stay and are told to reconnect; 1 HTTP/2 requests in flight refused" in log, log
        c.pump(lambda: poll in c.resets, what="the refusal")
        assert c.resets == {poll: h2client.REFUSED_STREAM}
        old.publish("t", payload(2))
        c.pump(lambda: len(h2client.messages(c.body[sse])) == 2, what="message 2")
        assert [d for _, d in h2client.messages(c.body[sse])] == [payload(1), payload(2)]
        # The client retries on the same connection, which the new process serves.
        status, _, body = c.get("/poll?topic=big&since=0-0&timeout=1", timeout=10)
        assert status == 200 and json.loads(body)["messages"], body[:200]
        assert c.goaway is None and not c.closed
        assert c.resets == {poll: h2client.REFUSED_STREAM}
    finally:
        os.kill(new_pid, signal.SIGTERM)


def test_an_http2_connection_at_rest_moves_and_wakes_in_the_new_process(start_server, tmp_path):
    """An idle HTTP/2 connection of one stream keeps its protocol state in a resting form
    (clarion_h2_resting); a hand-over wakes it, carries it whole, and the stream goes on."""
    pid_file = tmp_path / "clarion.pid"
    old = start_server("--history-dir", str(tmp_path / "hist"), "--pid-file", pid_file)
    c = h2client.Client(old.clients, timeout=30)
    sse = c.request("/sse?topic=t")
    c.pump(lambda: sse in c.headers, what="the SSE answer")
    time.sleep(0.3)
    old.publish("t", payload(1))
    c.pump(lambda: len(h2client.messages(c.body[sse])) == 1, what="message 1")

    def resting(server):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if server.metrics().get("clarion_h2_resting") == 1:
                return True
            time.sleep(0.2)
        return False

    assert resting(old), "at rest after a quiet sweep"
    new_pid, log = upgrade_in_place(old, pid_file)
    try:
        assert "1 connections moved" in log and "0 stay" in log, log
        old.publish("t", payload(2))
        c.pump(lambda: len(h2client.messages(c.body[sse])) == 2, what="message 2")
        assert [d for _, d in h2client.messages(c.body[sse])] == [payload(1), payload(2)]
        assert c.goaway is None and not c.closed and not c.resets
        assert resting(old), "at rest again in the new process"
        old.publish("t", payload(3))
        c.pump(lambda: len(h2client.messages(c.body[sse])) == 3, what="message 3")
    finally:
        os.kill(new_pid, signal.SIGTERM)
