"""RFC 6455 behaviour that a well-behaved client library never exercises, over raw sockets."""

import socket
import struct
import time

import pytest

import rawws


def open_ws(server, path="/ws?topic=t"):
    sock, head, rest = rawws.connect(server.clients, path)
    assert head.startswith("HTTP/1.1 101"), head
    return sock, rawws.Reader(sock, rest)


@pytest.mark.parametrize(
    "frames, code",
    [
        ([rawws.frame(1, b"{}", mask=False)], 1002),  # unmasked
        ([rawws.frame(1, b"x", rsv=4)], 1002),  # RSV1 without an extension
        ([rawws.frame(3, b"")], 1002),  # reserved opcode
        ([rawws.frame(0, b"x")], 1002),  # continuation without a message
        ([rawws.frame(9, b"x" * 126)], 1002),  # control frame too long
        ([rawws.frame(9, b"", fin=False)], 1002),  # fragmented control frame
        ([rawws.frame(1, b"a", fin=False), rawws.frame(1, b"b")], 1002),  # new message mid-way
        ([rawws.frame(1, b"\xff")], 1007),  # invalid UTF-8
        ([rawws.frame(1, b"\xce", fin=False), rawws.frame(0, b"\xff")], 1007),  # across fragments
        ([rawws.frame(8, b"\x03")], 1002),  # one-byte close payload
        ([rawws.frame(8, struct.pack("!H", 1005))], 1002),  # close code not for the wire
        ([rawws.frame(8, b"\x03\xe8\xff")], 1007),  # close reason not UTF-8
    ],
)
def test_protocol_violations_fail_the_connection_with_the_right_code(server, frames, code):
    sock, reader = open_ws(server)
    sock.sendall(b"".join(frames))
    assert reader.close_code()[0] == code
    assert reader.at_eof()


def test_message_too_big_is_refused_from_the_header(start_server):
    server = start_server("--max-message-size", 1024)
    sock, reader = open_ws(server)
    # Only the header of a 1 MiB frame: the server must not wait for the payload.
    sock.sendall(b"\x81\xff" + struct.pack("!Q", 1 << 20) + b"\x00\x00\x00\x00")
    assert reader.close_code()[0] == 1009
    assert server.metrics()['clarion_closes_total{reason="too_big"}'] == 1


def test_fragmented_control_message_with_interleaved_ping(start_server):
    server = start_server("--echo-path", "/echo")
    sock, reader = open_ws(server, "/echo")
    sock.sendall(
        rawws.frame(1, "héllo ".encode(), fin=False)
        + rawws.frame(9, b"are you there")
        + rawws.frame(0, "wörld".encode())
    )
    assert reader.frame() == (True, 10, b"are you there")
    assert reader.frame() == (True, 1, "héllo wörld".encode())


def test_ping_is_answered_with_the_same_payload(server):
    sock, reader = open_ws(server)
    sock.sendall(rawws.frame(9, b"\x00payload\xff"))
    assert reader.frame() == (True, 10, b"\x00payload\xff")


def test_close_handshake_echoes_the_code(server):
    sock, reader = open_ws(server)
    sock.sendall(rawws.frame(8, struct.pack("!H", 4000) + b"bye"))
    assert reader.close_code()[0] == 4000
    assert reader.at_eof()
    sock, reader = open_ws(server)
    sock.sendall(rawws.frame(8, b""))
    assert reader.close_code()[0] is None
    assert reader.at_eof()


def test_idle_connection_is_pinged_then_closed(start_server):
    server = start_server("--ping-interval", 1, "--idle-timeout", 3)
    sock, reader = open_ws(server)
    sock.settimeout(10)
    started = time.monotonic()
    assert reader.frame()[1] == 9  # a ping after about a second of silence
    assert reader.close_code() == (1001, "idle timeout")
    assert 2 <= time.monotonic() - started <= 8
    assert server.metrics()['clarion_closes_total{reason="idle_timeout"}'] == 1


def test_answered_pings_keep_a_connection_alive(start_server):
    server = start_server("--ping-interval", 1, "--idle-timeout", 2)
    sock, reader = open_ws(server)
    sock.settimeout(10)
    deadline = time.monotonic() + 5
    pings = 0
    while time.monotonic() < deadline:
        fin, op, payload = reader.frame()
        assert op == 9, f"unexpected opcode {op}"
        pings += 1
        sock.sendall(rawws.frame(10, payload))
    assert pings >= 2
    sock.sendall(rawws.frame(9, b"still here"))
    assert reader.frame()[1:] == (10, b"still here")


def test_slow_consumer_is_closed_with_1008_and_others_are_unaffected(start_server):
    server = start_server("--max-backlog", 65536)
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", server.port))
    slow.sendall(
        b"GET /ws?topic=flood HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n"
    )
    head, _ = rawws.read_head(slow)
    assert head.startswith("HTTP/1.1 101")
    fast, fast_reader = open_ws(server, "/ws?topic=flood")
    chunk = "x" * 16384
    sent = 0
    # The slow client never reads; the kernel buffers fill, then its backlog passes the cap.
    for i in range(200):
        server.publish("flood", chunk)
        sent += 1
        for _ in range(1):
            fin, op, payload = fast_reader.frame()
            assert op == 1 and len(payload) == len(chunk)
        if server.metrics()["clarion_slow_consumers_total"] >= 1:
            break
    assert server.metrics()["clarion_slow_consumers_total"] == 1
    # The slow client, once it reads, finds its messages then a 1008 close.
    slow_reader = rawws.Reader(slow)
    assert slow_reader.close_code()[0] == 1008
    # The fast client still works.
    server.publish("flood", "after")
    assert fast_reader.frame()[2] == b"after"
