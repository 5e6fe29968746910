"""Conflation ("latest wins", docs/conflation.md): a real slow reader (a small receive buffer,
read slowly) of a fast ticker over a few hundred keys is never closed on a conflating topic,
and gets the latest value of every key with `conflated` notices whose counts add up; the same
reader of a topic that does not conflate is closed as a slow consumer, as before."""

import asyncio
import base64
import json
import os
import pathlib
import socket
import struct
import sys
import threading
import time

import pytest

KEYS = 300
PAD = "x" * 2000
DONE = b'{"k":"done"}'  # the last event's whole payload


def start(start_server, tmp_path, conflate):
    config = tmp_path / "clarion.toml"
    config.write_text(
        'max_backlog = 65536\n'
        + (
            '[[conflate_topics]]\npattern = "px"\nkey = "/k"\nthreshold = 16384\nmax_keys = 1000\n'
            if conflate
            else ""
        )
    )
    return start_server("--config", config)


def slow_reader(server, transport, topic):
    """A subscriber whose receive buffer is 4 KB (set before connecting, so the window stays
    small), over SSE or a plain WebSocket."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", server.port))
    if transport == "sse":
        s.sendall(f"GET /sse?topic={topic} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    else:
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(
            f"GET /ws?topic={topic} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
    return s


def ws_messages(data):
    """The text payloads of the unmasked server frames in `data`."""
    out, at = [], 0
    while at + 2 <= len(data):
        op, n, at = data[at] & 0x0F, data[at + 1] & 0x7F, at + 2
        if n == 126:
            n, at = struct.unpack("!H", data[at : at + 2])[0], at + 2
        elif n == 127:
            n, at = struct.unpack("!Q", data[at : at + 8])[0], at + 8
        if op == 1:
            out.append(data[at : at + n])
        at += n
    return out


class Reader(threading.Thread):
    """Reads a raw SSE stream 1 KB every 20 ms (50 KB/s) until `fast` is set; stops once the whole
    event whose data is `{"k":"done"}` has arrived (its closing brace too: a chunk can end inside
    it), or at the end of the stream."""

    def __init__(self, sock, transport):
        super().__init__(daemon=True)
        self.sock, self.data, self.fast, self.done = sock, b"", threading.Event(), False
        self.transport = transport
        self.closed = False

    def run(self):
        self.sock.settimeout(30)
        while not self.done:
            try:
                chunk = self.sock.recv(1024 if not self.fast.is_set() else 65536)
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return
            self.data += chunk
            self.done = DONE in self.data
            if not self.fast.is_set():
                time.sleep(0.02)

    def events(self):
        """(kind, JSON) of each message and notice."""
        body = self.data.split(b"\r\n\r\n", 1)[1]
        if self.transport == "ws":
            out = []
            for p in ws_messages(body):
                d = json.loads(p)
                out.append(("conflated" if d.get("type") == "conflated" else "message", d))
            return out
        out = []
        for block in body.split(b"\n\n"):
            fields = dict(
                line.split(b": ", 1) for line in block.split(b"\n") if b": " in line
            )
            if b"data" in fields:
                d = json.loads(fields[b"data"])
                if b"id" in fields:
                    d["sse_id"] = fields[b"id"].decode()
                out.append((fields.get(b"event", b"message").decode(), d))
        return out


def tick(server, rounds, stop=lambda: False):
    """Publishes `rounds` updates of every key, 100 to a batch; returns the last value of each."""
    last, n = {}, 0
    for _ in range(rounds):
        for start in range(0, KEYS, 100):
            batch = []
            for k in range(start, start + 100):
                n += 1
                last[f"k{k}"] = n
                batch.append({"topic": "px", "data": json.dumps({"k": f"k{k}", "n": n, "pad": PAD}, separators=(",", ":"))})
            status, _, out = server.request(
                "POST", "/publish", json.dumps({"messages": batch}).encode(),
                {"Content-Type": "application/json"},
            )
            assert status == 200, out
            if stop():
                return last, n
    return last, n


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_a_slow_reader_of_a_conflating_topic_gets_the_latest_of_each_key_and_is_never_closed(
    start_server, tmp_path, transport
):
    server = start(start_server, tmp_path, conflate=True)
    sock = slow_reader(server, transport, "px")
    time.sleep(0.2)
    reader = Reader(sock, transport)
    reader.start()
    try:
        last, published = tick(server, rounds=10)
        reader.fast.set()
        server.publish("px", '{"k":"done"}')
        reader.join(30)
        assert reader.done and not reader.closed
        m = server.metrics()
        assert m['clarion_closes_total{reason="slow_consumer"}'] == 0
        events = reader.events()
        messages = [d for e, d in events if e == "message" and d.get("k") != "done"]
        notices = [d for e, d in events if e == "conflated"]
        skipped = sum(n["skipped"] for n in notices)
        assert notices and all(n["topic"] == "px" and n["skipped"] > 0 for n in notices)
        # Every publication was delivered or counted in a notice, and the server counted it.
        assert len(messages) + skipped == published
        assert m["clarion_conflated_skipped_total"] == skipped
        # The latest value of every key arrived, each key's values in publish order.
        seen = {}
        for d in messages:
            assert d["n"] > seen.get(d["k"], 0)
            seen[d["k"]] = d["n"]
        assert seen == last
        if transport == "sse":
            # A message after a notice leaves EventSource's last id alone (no `id:` line), so
            # a resume from it loses nothing; every other message has its id.
            kinds = [e for e, _ in events]
            for i, (e, d) in enumerate(events):
                if e == "message" and d.get("k") != "done":
                    after_notice = i > 0 and kinds[i - 1] == "conflated"
                    assert ("sse_id" in d) != after_notice
    finally:
        sock.close()


def test_the_same_slow_reader_of_a_topic_that_does_not_conflate_is_closed(start_server, tmp_path):
    server = start(start_server, tmp_path, conflate=False)
    sock = slow_reader(server, "sse", "px")
    time.sleep(0.2)
    reader = Reader(sock, "sse")
    reader.start()
    try:
        closed = lambda: server.metrics()['clarion_closes_total{reason="slow_consumer"}'] >= 1
        tick(server, rounds=10, stop=closed)
        assert closed()
    finally:
        sock.close()


def test_the_python_subscriber_keeps_its_resume_id_across_a_conflated_message():
    """The rule of docs/conflation.md in the project's Python client: a message right after a
    `conflated` notice is delivered but does not move the resume id; the next one does."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python" / "client" / "src"))
    from clarion_client.subscriber import Subscriber, Subscription

    async def run():
        client = Subscriber("ws://127.0.0.1:9/ws")
        sub = client.subs["px"] = Subscription(client, "px", "e-10", False)
        frames = [
            {"type": "conflated", "topic": "px", "skipped": 3},
            {"type": "message", "topic": "px", "id": "e-40", "data": "a latest"},
            {"type": "message", "topic": "px", "id": "e-12", "data": "b"},
        ]
        ids = []
        for f in frames:
            await client._on_frame(json.dumps(f))
            ids.append(sub.last_id)
        got = [sub._queue.get_nowait().data for _ in range(2)]
        return ids, got

    ids, got = asyncio.run(run())
    assert got == ["a latest", "b"]
    assert ids == ["e-10", "e-10", "e-12"]


def sse_events_of(body):
    """(kind, JSON) of each message and notice of an SSE body (`sse_id`: its `id:` line)."""
    out = []
    for block in bytes(body).split(b"\n\n"):
        fields = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
        if b"data" in fields:
            d = json.loads(fields[b"data"])
            if b"id" in fields:
                d["sse_id"] = fields[b"id"].decode()
            out.append((fields.get(b"event", b"message").decode(), d))
    return out


class H2Reader(threading.Thread):
    """An SSE stream over HTTP/2 (h2c) read slowly the HTTP/2 way: the stream's flow-control
    window is opened by 1 KB every 20 ms (50 KB/s) until `fast` is set, then fully."""

    def __init__(self, server, topic):
        super().__init__(daemon=True)
        from h2client import Client

        self.c = Client(server.clients, timeout=30)
        self.sid = self.c.request(f"/sse?topic={topic}")
        self.c.hold.add(self.sid)
        self.c.pump(lambda: self.sid in self.c.headers, what="the head")
        self.fast, self.done, self.reset = threading.Event(), False, False

    def run(self):
        c, sid, opened = self.c, self.sid, False
        try:
            while not self.done and sid not in c.resets and not c.closed:
                if self.fast.is_set() and not opened:
                    c.hold.discard(sid)
                    c.conn.increment_flow_control_window(1 << 24, stream_id=sid)
                    opened = True
                elif not opened:
                    c.conn.increment_flow_control_window(1024, stream_id=sid)
                c.flush()
                c.read_for(0.02)
                self.done = DONE in c.body[sid]
        finally:
            self.reset = sid in c.resets or c.closed


def test_a_slow_http2_stream_of_a_conflating_topic_gets_the_latest_of_each_key_and_is_never_closed(
    start_server, tmp_path
):
    """HTTP/2: the stream's unsent bytes wait in its own backlog until its flow-control window
    opens, and conflation applies there as on a connection of its own."""
    server = start(start_server, tmp_path, conflate=True)
    reader = H2Reader(server, "px")
    reader.start()
    try:
        last, published = tick(server, rounds=10)
        reader.fast.set()
        server.publish("px", '{"k":"done"}')
        reader.join(30)
        assert reader.done and not reader.reset
        m = server.metrics()
        assert m['clarion_closes_total{reason="slow_consumer"}'] == 0
        events = sse_events_of(reader.c.body[reader.sid])
        messages = [d for e, d in events if e == "message" and d.get("k") != "done"]
        skipped = sum(d["skipped"] for e, d in events if e == "conflated")
        assert skipped > 0 and len(messages) + skipped == published
        assert m["clarion_conflated_skipped_total"] == skipped
        seen = {}
        for d in messages:
            assert d["n"] > seen.get(d["k"], 0)
            seen[d["k"]] = d["n"]
        assert seen == last
    finally:
        reader.c.close()


def test_a_slow_reader_of_a_conflating_topic_reads_fresh_values_not_stale_buffered_ones(
    start_server, tmp_path
):
    """Conflation only helps with what is still in the server's backlog: old messages already
    in the output buffer (up to `threshold` bytes) or unsent in the kernel's send buffer are
    read, stale, before anything conflated. A reader at 50 KB/s of a 20-key ticker updated
    every few ms must read values a few tenths of a second old (about 40 KB waited
    ahead of each fresh value before, 0.8 s at this rate)."""
    server = start(start_server, tmp_path, conflate=True)
    sock = slow_reader(server, "sse", "px")
    time.sleep(0.2)
    reader = Reader(sock, "sse")
    arrivals = []  # (bytes read so far, time)
    recv = sock.recv

    def timed_recv(n):
        chunk = recv(n)
        arrivals.append((len(reader.data) + len(chunk), time.time()))
        return chunk

    reader.sock = type("Timed", (), {"recv": staticmethod(timed_recv), "settimeout": sock.settimeout})()
    reader.start()
    try:
        t_end = time.time() + 3
        n = 0
        while time.time() < t_end:
            batch = []
            for k in range(20):
                n += 1
                data = {"k": f"k{k}", "n": n, "t": time.time(), "pad": PAD}
                batch.append({"topic": "px", "data": json.dumps(data, separators=(",", ":"))})
            status, _, out = server.request(
                "POST", "/publish", json.dumps({"messages": batch}).encode(),
                {"Content-Type": "application/json"},
            )
            assert status == 200, out
            time.sleep(0.01)
        stopped = time.time()
        reader.fast.set()
        server.publish("px", '{"k":"done"}')
        reader.join(30)
        assert reader.done and not reader.closed
        # The age of each message read during the ticker's last two seconds (the first
        # second fills the buffers): the time its last byte arrived minus its publish time.
        ages, at = [], 0
        for block in reader.data.split(b"\n\n"):
            at += len(block) + 2
            line = next((ln for ln in block.split(b"\n") if ln.startswith(b"data: {\"k\":\"k")), None)
            if line is None:
                continue
            d = json.loads(line[6:])
            got = next(t for end, t in arrivals if end >= at - 2)
            if stopped - 2 <= got <= stopped:
                ages.append(got - d["t"])
        ages.sort()
        assert len(ages) >= 10, ages
        median = ages[len(ages) // 2]
        print(f"median age {median:.3f} s over {len(ages)} messages")
        assert median < 0.5, f"median age {median:.2f} s of {len(ages)}: {ages[::max(1, len(ages) // 10)]}"
    finally:
        sock.close()
