"""Hostile clients against the real binary. Each scenario runs while a well-behaved subscriber
(the canary) receives a steady feed; afterwards the server is alive, the canary got every
message in order, and the server's open files and memory are back near their baseline."""

import os
import socket
import struct
import threading
import time

import pytest

import rawws


def fds(server):
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def rss(server):
    with open(f"/proc/{server.proc.pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset(sock):
    """Closes with a TCP RST (SO_LINGER 0), as a crashed client or a middlebox would."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class Canary:
    """A subscriber fed one message every few milliseconds for the duration of an attack."""

    def __init__(self, server):
        self.server = server
        self.sock, head, rest = rawws.connect(server.clients, "/ws?topic=canary")
        assert head.startswith("HTTP/1.1 101")
        self.reader = rawws.Reader(self.sock, rest)
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._publish)
        self.thread.start()

    def _publish(self):
        while not self.stop.is_set():
            self.server.publish("canary", str(self.sent))
            self.sent += 1
            time.sleep(0.005)

    def check(self):
        self.stop.set()
        self.thread.join()
        for i in range(self.sent):
            fin, op, payload = self.reader.frame()
            assert (op, payload) == (1, str(i).encode()), f"canary message {i}: {op} {payload[:40]!r}"
        return self.sent


@pytest.fixture
def hostile(start_server):
    """(server, run): run(attack) runs `attack(server)` next to a canary and checks the
    aftermath."""
    server = start_server("--handshake-timeout", 2, "--max-message-size", 65536)
    # Warm up allocator arenas and thread stacks so the baseline is honest.
    warm = [rawws.connect(server.clients, "/ws?topic=w")[0] for _ in range(50)]
    for s in warm:
        s.close()
    time.sleep(0.3)
    base_fds, base_rss = fds(server), rss(server)

    def run(attack):
        canary = Canary(server)
        attack(server)
        assert canary.check() > 0
        canary.sock.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and fds(server) > base_fds:
            time.sleep(0.05)
        assert fds(server) <= base_fds, "descriptors leaked"
        grown = rss(server) - base_rss
        assert grown < 8 * 2**20, f"RSS grew by {grown} bytes"
        assert server.proc.poll() is None, "server died"
        assert server.metrics()["clarion_subscriptions"] == 0

    return server, run


def test_slowloris_flood_is_timed_out(hostile):
    server, run = hostile

    def attack(server):
        socks = []
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(b"GET /ws?topic=x HTTP/1.1\r\nHost: ")
            socks.append(s)
        for _ in range(3):  # a byte now and then, never finishing the head
            time.sleep(0.5)
            for s in socks:
                try:
                    s.sendall(b"a")
                except OSError:
                    pass
        time.sleep(2.5)  # past handshake_timeout
        closed = 0
        for s in socks:
            s.settimeout(2)
            try:
                got = s.recv(4096)
                closed += got == b"" or got.startswith(b"HTTP/1.1 408")
            except (socket.timeout, ConnectionResetError):
                closed += 1
            s.close()
        assert closed == len(socks)
        assert server.metrics()['clarion_closes_total{reason="handshake_timeout"}'] >= 300

    run(attack)


def test_header_floods_and_giant_lines_are_refused(hostile):
    server, run = hostile

    def attack(server):
        cases = [
            (b"GET /ws HTTP/1.1\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", b"431"),
            (b"GET /ws HTTP/1.1\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n", b"431"),
            (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n", b"414"),
            # A TLS hello on the clear port is not HTTP: closed without an answer.
            (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(200), None),
        ]
        for _ in range(20):
            for raw, status in cases:
                s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                try:
                    s.sendall(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                try:
                    got = s.recv(64)
                except ConnectionResetError:
                    got = b""
                if status is None:
                    assert got == b"", (raw[:30], got)
                else:
                    assert got.startswith(b"HTTP/1.1 " + status), (raw[:30], got)
                s.close()

    run(attack)


def test_bad_frames_truncations_and_resets(hostile):
    server, run = hostile
    bad = [
        rawws.frame(1, b"{}", mask=False),
        rawws.frame(1, b"x", rsv=2),
        rawws.frame(11, b""),
        rawws.frame(9, b"x" * 200),
        rawws.frame(10, b"", fin=False),
        rawws.frame(8, struct.pack("!H", 999)),
        rawws.frame(8, b"\x03\xe8\xc3\x28"),
        # a header announcing 2^63 - 1 bytes
        b"\x82\xff\x7f\xff\xff\xff\xff\xff\xff\xff" + b"\x00" * 4,
    ]

    def attack(server):
        for _ in range(10):
            for f in bad:
                sock, head, rest = rawws.connect(server.clients, "/ws?topic=x")
                sock.sendall(f)
                code = rawws.Reader(sock, rest).close_code()[0]
                assert code in (1002, 1007, 1009)
                sock.close()
            # Half a frame, then silence and EOF; half a frame, then a reset.
            for end in (socket.socket.close, reset):
                sock, _, _ = rawws.connect(server.clients, "/ws?topic=x")
                sock.sendall(rawws.frame(1, b"y" * 1000)[:500])
                end(sock)
            # Garbage pipelined right behind the upgrade request, in the same packet. It starts
            # with a reserved opcode so it is invalid from its first byte (purely random bytes
            # may form a valid header announcing a payload that never comes, which is not an
            # error: the server rightly waits for it).
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(
                b"GET /ws?topic=x HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n" + b"\x8b\x85" + os.urandom(62)
            )
            head, rest = rawws.read_head(s)
            assert head.startswith("HTTP/1.1 101")
            assert rawws.Reader(s, rest).close_code()[0] in (1002, 1007, 1009)
            s.close()

    run(attack)


def test_churn_of_thousands_of_connections(hostile):
    server, run = hostile

    def worker(n, source):
        for i in range(n):
            kind = i % 4
            s = socket.create_connection(("127.0.0.1", server.port), source_address=(source, 0))
            if kind == 0:
                s.sendall(
                    b"GET /ws?topic=churn HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    b"Sec-WebSocket-Version: 13\r\n\r\n"
                )
                rawws.read_head(s)
                s.close()
            elif kind == 1:
                s.sendall(b"GET /sse?topic=churn HTTP/1.1\r\nHost: x\r\n\r\n")
                s.recv(100)
                reset(s)
            elif kind == 2:
                s.sendall(b"GET /poll?topic=churn&timeout=30 HTTP/1.1\r\nHost: x\r\n\r\n")
                s.close()
            else:
                reset(s)

    def attack(server):
        threads = [
            threading.Thread(target=worker, args=(1500, f"127.0.0.{2 + t}")) for t in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    run(attack)


def test_clients_that_never_read_do_not_delay_others(hostile):
    server, run = hostile

    def attack(server):
        slow = []
        for _ in range(50):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", server.port))
            s.sendall(
                b"GET /ws?topic=flood HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n"
            )
            rawws.read_head(s)
            slow.append(s)
        fast, head, rest = rawws.connect(server.clients, "/ws?topic=flood")
        reader = rawws.Reader(fast, rest)
        worst = 0.0
        cut = lambda: server.metrics()['clarion_closes_total{reason="slow_consumer"}']  # noqa: E731
        # Publish until the kernel buffers of every slow reader are full and the server has cut
        # them all (bounded: 1,000 messages of 16 KiB).
        for i in range(1000):
            t0 = time.monotonic()
            server.publish("flood", f"{i:04d}" + "x" * 16380)
            fin, op, payload = reader.frame()
            worst = max(worst, time.monotonic() - t0)
            assert payload[:4] == f"{i:04d}".encode()
            if i % 20 == 19 and cut() >= 50:
                break
        assert cut() == 50, "every slow consumer is cut"
        assert worst < 1.0, f"a fast reader waited {worst:.3f} s behind slow ones"
        fast.close()
        for s in slow:
            s.close()

    run(attack)
