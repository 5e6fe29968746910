"""A deliberately small raw-socket WebSocket client, for tests that must send what a
well-behaved library never would (unmasked frames, bad UTF-8, oversized headers) or must stop
reading to play a slow consumer."""

import base64
import os
import socket
import struct


def connect(addr, path="/ws", extra_headers="", timeout=10.0):
    """Opens a connection and performs the handshake; returns (socket, response head, leftover)."""
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n{extra_headers}\r\n"
        ).encode()
    )
    head, rest = read_head(sock)
    return sock, head, rest


def read_head(sock):
    """Reads an HTTP response head; returns (head text, bytes after it)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head.decode("latin-1"), rest


def frame(opcode, payload=b"", fin=True, mask=True, rsv=0):
    """Encodes one client frame."""
    first = (0x80 if fin else 0) | (rsv << 4) | opcode
    n = len(payload)
    mbit = 0x80 if mask else 0
    if n < 126:
        head = struct.pack("!BB", first, mbit | n)
    elif n < 65536:
        head = struct.pack("!BBH", first, mbit | 126, n)
    else:
        head = struct.pack("!BBQ", first, mbit | 127, n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


class Reader:
    """Reads server frames (unmasked) from a socket."""

    def __init__(self, sock, leftover=b""):
        self.sock = sock
        self.buf = leftover

    def _need(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed")
            self.buf += chunk

    def frame(self):
        """(fin, opcode, payload) of the next frame."""
        self._need(2)
        b0, b1 = self.buf[0], self.buf[1]
        n = b1 & 0x7F
        at = 2
        if n == 126:
            self._need(4)
            n = struct.unpack("!H", self.buf[2:4])[0]
            at = 4
        elif n == 127:
            self._need(10)
            n = struct.unpack("!Q", self.buf[2:10])[0]
            at = 10
        assert not b1 & 0x80, "server frames must not be masked"
        self._need(at + n)
        payload = self.buf[at : at + n]
        self.buf = self.buf[at + n :]
        return bool(b0 & 0x80), b0 & 0x0F, payload

    def close_code(self):
        """Skips data frames until a Close; returns (code, reason)."""
        while True:
            _, op, payload = self.frame()
            if op == 8:
                if not payload:
                    return None, ""
                return struct.unpack("!H", payload[:2])[0], payload[2:].decode()

    def at_eof(self, timeout=5.0):
        """True once the server has closed the TCP connection."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False


def http(addr, raw, timeout=10.0):
    """Sends raw request bytes; returns (status, head text, socket)."""
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.sendall(raw)
    head, _ = read_head(sock)
    status = int(head.split(" ", 2)[1]) if head else 0
    return status, head, sock
