"""A TLS client whose handshake meets an upgrade's freeze (issue 46).

The client has read the server's flight, so from its side the handshake is done; its Finished
and its WebSocket request reach the old process only after the freeze began. The old process
used to let go at once: the connection stayed behind (its rustls handshake state cannot move),
was answered `101` there, then closed with 1012 when the old process restarted. Now a worker
asked to let go waits a bounded moment for handshakes in flight, and the connection moves.
"""

import socket
import ssl
import struct
import threading
import time

from conftest import Server
from test_handover import wait_exit


class HeldTls:
    """A TLS 1.3 client over a memory BIO, so the test decides when its bytes leave."""

    def __init__(self, addr, ca):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        ctx = ssl.create_default_context(cafile=ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.inc, self.out, server_hostname="localhost")
        self.plain = b""

    def handshake_but_hold_finished(self):
        """Sends the ClientHello and reads the server's flight; returns the client's Finished,
        not sent."""
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.sock.sendall(self.out.read())
                data = self.sock.recv(65536)
                assert data, "closed during the handshake"
                self.inc.write(data)
        assert self.tls.version() == "TLSv1.3"
        return self.out.read()

    def sealed(self, data):
        self.tls.write(data)
        return self.out.read()

    def read_until(self, pred):
        """Plaintext received until `pred(plaintext)` holds; b'' ends it (closed)."""
        while not pred(self.plain):
            try:
                chunk = self.tls.read(65536)
                self.plain += chunk
                if not chunk:
                    return False
                continue
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:
                return False
            data = self.sock.recv(65536)
            if not data:
                return False
            self.inc.write(data)
        return True

    def frame(self):
        """One server WebSocket frame (opcode, payload)."""
        assert self.read_until(lambda b: len(b) >= 2), "closed before a frame"
        n = self.plain[1] & 0x7F
        head = 2 + (2 if n == 126 else 8 if n == 127 else 0)
        assert self.read_until(lambda b: len(b) >= head)
        if n == 126:
            n = struct.unpack("!H", self.plain[2:4])[0]
        elif n == 127:
            n = struct.unpack("!Q", self.plain[2:10])[0]
        assert self.read_until(lambda b: len(b) >= head + n)
        op, payload = self.plain[0] & 0x0F, self.plain[head:head + n]
        self.plain = self.plain[head + n:]
        return op, payload


def frozen(server):
    """Whether the server refuses publishes because an upgrade is in progress."""
    status, _, body = server.request("POST", "/publish/probe", b"x", {"Content-Type": "text/plain"})
    return status == 503 and b"upgrade" in body


def test_a_tls_client_that_finishes_its_handshake_during_the_freeze_moves(
    start_server, tmp_path
):
    from test_tls import make_dev_cert

    dev = make_dev_cert(tmp_path / "tls")
    # One worker: the connection poked below wakes the same loop that holds the handshake.
    flags = ["--workers", "1", "--tls-listen", "127.0.0.1:0",
             "--tls-cert", dev["cert"], "--tls-key", dev["key"]]
    old = start_server(*flags)
    host, port = old.clients.rsplit(":", 1)
    poke = socket.create_connection((host, int(port)), timeout=10)
    client = HeldTls(old.tls, dev["ca"])
    finished = client.handshake_but_hold_finished()
    request = client.sealed(
        b"GET /ws?topic=t HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n"
    )
    # The new process, started in the background: the freeze begins while it starts.
    started = {}
    upgrading = threading.Thread(
        target=lambda: started.update(new=Server(["--upgrade-from", str(old.proc.pid), *flags]))
    )
    upgrading.start()
    try:
        deadline = time.monotonic() + 20
        while not frozen(old):
            assert time.monotonic() < deadline, "the upgrade did not freeze the old process"
            time.sleep(0.002)
        # Frozen. A worker lets go at its next iteration: another connection's bytes make
        # one at once, with the handshake still in flight. The client's Finished and its
        # request arrive a moment later.
        poke.sendall(b"G")
        time.sleep(0.05)
        client.sock.sendall(finished + request)
        assert client.read_until(lambda b: b"\r\n\r\n" in b), "closed before an answer"
        assert client.plain.startswith(b"HTTP/1.1 101"), client.plain[:200]
        client.plain = client.plain.split(b"\r\n\r\n", 1)[1]
    finally:
        upgrading.join(timeout=30)
    new = started["new"]
    try:
        assert wait_exit(old.proc) == 0
        log = old.proc.stderr.read()
        assert "2 connections moved" in log, log
        assert "tls_handshake" not in log, log
        # The connection is the new process's: a message published there arrives, no close.
        new.publish("t", "after")
        assert client.frame() == (1, b"after")
    finally:
        new.proc.kill()
        new.proc.wait()
