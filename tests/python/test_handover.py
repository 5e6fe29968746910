"""Upgrades that keep connections (`clarion serve --upgrade-from PID`): a new process takes the
old one's listeners and established connections; clients see no close and no reconnect, and
every message arrives once, in order. An incompatible peer is refused and the old process
restarts with a drain (close 1012, exact resume from `history_dir`)."""

import json
import os
import signal
import socket
import ssl
import struct
import threading
import time
import urllib.error
import urllib.request

import httpx
import pytest
import websockets.sync.client

import rawws
from conftest import Server

PAD = "x" * 200  # over compression_threshold: deflate clients get compressed frames


def payload(i):
    return f"m{i}:{PAD}"


class Publisher(threading.Thread):
    """Publishes payload(1..n) to topic `t` at a steady pace, retrying a message the server
    refused (503 while a hand-over is frozen, or a connection the old process no longer
    serves); records every id it was given."""

    def __init__(self, api, n, pause=0.004, headers=None):
        super().__init__(daemon=True)
        self.api, self.n, self.pause = api, n, pause
        self.headers = {"Content-Type": "text/plain", **(headers or {})}
        self.ids = []
        self.refused = 0
        self.progress = threading.Event()

    def run(self):
        for i in range(1, self.n + 1):
            deadline = time.monotonic() + 60
            while True:
                req = urllib.request.Request(
                    f"http://{self.api}/publish/t",
                    data=payload(i).encode(),
                    method="POST",
                    headers=self.headers,
                )
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        self.ids.append(json.loads(r.read())["id"])
                        break
                except urllib.error.HTTPError as e:
                    assert e.code == 503, e.read()
                except (ConnectionError, urllib.error.URLError):
                    pass
                self.refused += 1
                assert time.monotonic() < deadline, f"message {i} never accepted"
                time.sleep(0.01)
            if i == self.n // 3:
                self.progress.set()
            time.sleep(self.pause)


class Client(threading.Thread):
    """Reads `n` messages from one connection, recording each payload's number and the time it
    arrived, and whether the connection ever ended."""

    def __init__(self, name, n):
        super().__init__(daemon=True)
        self.name, self.n = name, n
        self.got = []
        self.times = []
        self.ended = None
        self.ready = threading.Event()

    def note(self, text):
        self.got.append(int(text.split(":", 1)[0][1:]))
        self.times.append(time.monotonic())

    def run(self):
        try:
            self.read()
        except Exception as e:  # noqa: BLE001 - any end of the connection is the failure
            self.ended = repr(e)


class RawWs(Client):
    def __init__(self, addr, n):
        super().__init__("ws", n)
        self.sock, head, rest = rawws.connect(addr, "/ws?topic=t", timeout=60)
        assert " 101 " in head, head
        assert "permessage-deflate" not in head
        self.reader = rawws.Reader(self.sock, rest)

    def read(self):
        self.ready.set()
        while len(self.got) < self.n:
            _, op, data = self.reader.frame()
            if op == 8:
                raise EOFError(f"close frame {data!r}")
            if op == 1:
                self.note(data.decode())

    def still_open(self):
        # A ping over the same socket is answered by whoever holds it now.
        self.sock.sendall(rawws.frame(9, b"still"))
        while True:
            _, op, data = self.reader.frame()
            if op == 10:
                return data == b"still"


class LibWs(Client):
    """A WebSocket of the `websockets` library (`self.ws`, opened by the subclass)."""

    def read(self):
        self.ready.set()
        while len(self.got) < self.n:
            self.note(self.ws.recv(timeout=60))

    def still_open(self):
        self.ws.ping(b"still").wait(10)
        return True


class DeflateWs(LibWs):
    def __init__(self, addr, n):
        super().__init__("ws-deflate", n)
        self.ws = websockets.sync.client.connect(
            f"ws://{addr}/ws?topic=t", compression="deflate", open_timeout=10
        )
        ext = self.ws.response.headers.get("Sec-WebSocket-Extensions", "")
        assert "permessage-deflate" in ext, ext


def tls13_socket(tls_addr, ca):
    """A TLS 1.3 connection whose session ticket has been read. The server sends its ticket
    just after the handshake; `websockets`' sync client reads on a thread of its own while the
    caller writes the upgrade request, and Python's `ssl` object used from both threads at
    that moment sometimes loses the request or fails with "internal error" (about 1 connect in
    100 here, with any server): reading the ticket first keeps the two apart."""
    host, port = tls_addr.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca)
    sock = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10),
                           server_hostname="localhost")
    sock.settimeout(0.3)
    try:
        assert sock.recv(1) == b"", "no data before the request"
    except TimeoutError:
        pass  # the ticket was read; nothing else came
    sock.settimeout(None)
    return sock


class TlsWs(LibWs):
    """A WebSocket over TLS 1.3 (with or without permessage-deflate): after the hand-over its
    records come from the new process, under the same keys and sequence numbers."""

    def __init__(self, tls_addr, ca, n, deflate):
        super().__init__("wss-deflate" if deflate else "wss", n)
        port = tls_addr.rsplit(":", 1)[1]
        # `ws://` over a socket already secured (the client does not wrap it again).
        self.ws = websockets.sync.client.connect(
            f"ws://localhost:{port}/ws?topic=t",
            sock=tls13_socket(tls_addr, ca),
            compression="deflate" if deflate else None,
            open_timeout=10,
        )
        assert self.ws.socket.version() == "TLSv1.3"
        ext = self.ws.response.headers.get("Sec-WebSocket-Extensions", "")
        assert ("permessage-deflate" in ext) == deflate, ext


class Sse(Client):
    """An SSE stream (over TLS when given a context), on one connection for the whole test."""

    path = "/sse?topic=t"

    def __init__(self, addr, n, name="sse", ctx=None):
        super().__init__(name, n)
        self.url = f"{'https' if ctx else 'http'}://{addr}{self.path}"
        self.ctx = ctx
        self.version = None

    def read(self):
        with httpx.Client(verify=self.ctx or True, timeout=httpx.Timeout(10, read=60)) as c:
            with c.stream("GET", self.url) as r:
                assert r.status_code == 200
                tls = r.extensions["network_stream"].get_extra_info("ssl_object")
                self.version = tls.version() if tls else None
                self.ready.set()
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.note(line[len("data: "):])
                        if len(self.got) == self.n:
                            return
        raise EOFError("stream ended")


class TlsSse(Sse):
    """An SSE stream over TLS 1.3."""

    def __init__(self, tls_addr, ca, n):
        port = tls_addr.rsplit(":", 1)[1]
        super().__init__(f"localhost:{port}", n, "sse-tls", ssl.create_default_context(cafile=ca))


class Ndjson(Client):
    def __init__(self, addr, n):
        super().__init__("ndjson", n)
        self.addr = addr

    def read(self):
        with httpx.Client(timeout=httpx.Timeout(10, read=60)) as c:
            with c.stream("GET", f"http://{self.addr}/stream?topic=t") as r:
                assert r.status_code == 200
                self.ready.set()
                for line in r.iter_lines():
                    if line.strip():
                        self.note(json.loads(line)["data"])
                        if len(self.got) == self.n:
                            return
        raise EOFError("stream ended")


class LongPoll(Client):
    """Polls over one keep-alive socket, each poll from the last cursor."""

    def __init__(self, addr, n):
        super().__init__("poll", n)
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.polls = 0

    def read(self):
        buf, cursor = b"", None
        self.ready.set()
        while len(self.got) < self.n:
            since = f"&since={cursor}" if cursor else ""
            self.sock.sendall(
                f"GET /poll?topic=t{since}&timeout=20 HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            )
            while b"\r\n\r\n" not in buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise EOFError("poll connection closed")
                buf += chunk
            head, _, buf = buf.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            length = next(
                int(l.split(b":")[1])
                for l in head.split(b"\r\n")
                if l.lower().startswith(b"content-length")
            )
            while len(buf) < length:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise EOFError("poll connection closed")
                buf += chunk
            body, buf = json.loads(buf[:length]), buf[length:]
            assert not body.get("gaps"), body
            for m in body["messages"]:
                self.note(m["data"])
            cursor = body["cursor"]
            self.polls += 1


def wait_exit(proc, timeout=30):
    try:
        return proc.wait(timeout=timeout)
    except Exception:
        proc.kill()
        raise


def upgrade(old, *args):
    return Server(["--upgrade-from", str(old.proc.pid), *args])


def check_every_message_once_in_order(clients, n):
    for c in clients:
        c.join(timeout=90)
        assert c.ended is None, (c.name, c.ended, len(c.got))
        assert c.got == list(range(1, n + 1)), (c.name, len(c.got), c.got[:5], c.got[-5:])


def longest_pause(clients):
    return max(max(b - a for a, b in zip(c.times, c.times[1:])) for c in clients)


@pytest.mark.parametrize("history", ["memory", "history_dir"])
def test_an_upgrade_keeps_every_connection_and_delivers_every_message_once(
    start_server, tmp_path, history
):
    from test_tls import make_dev_cert

    extra = ["--history-dir", str(tmp_path / "hist")] if history == "history_dir" else []
    dev = make_dev_cert(tmp_path / "tls")
    extra += ["--tls-listen", "127.0.0.1:0", "--tls-cert", dev["cert"], "--tls-key", dev["key"]]
    old = start_server(*extra)
    n = 600
    clients = [
        RawWs(old.clients, n),
        DeflateWs(old.clients, n),
        Sse(old.clients, n),
        Ndjson(old.clients, n),
        LongPoll(old.clients, n),
        TlsWs(old.tls, dev["ca"], n, deflate=False),
        TlsWs(old.tls, dev["ca"], n, deflate=True),
        TlsSse(old.tls, dev["ca"], n),
    ]
    for c in clients:
        c.start()
        assert c.ready.wait(10)
    time.sleep(0.3)  # every subscription is in place before the first publish
    pub = Publisher(old.api, n)
    pub.start()
    assert pub.progress.wait(30)
    new = upgrade(old, *extra)
    code = wait_exit(old.proc)
    old_log = old.proc.stderr.read()
    assert code == 0, old_log
    assert "connections moved" in old_log and "0 stay" in old_log, old_log
    pub.join(timeout=90)
    assert len(pub.ids) == n
    check_every_message_once_in_order(clients, n)
    # The ids continue the same sequence across the upgrade: one epoch, no id skipped.
    epochs = {i.split("-")[0] for i in pub.ids}
    seqs = [int(i.split("-")[1]) for i in pub.ids]
    assert len(epochs) == 1 and seqs == list(range(seqs[0], seqs[0] + n)), pub.ids
    # The same sockets still work, answered by the new process.
    assert clients[0].still_open() and clients[1].still_open()
    assert clients[5].still_open() and clients[6].still_open()
    assert clients[7].version == "TLSv1.3"
    m = new.metrics()
    assert m['clarion_connections{transport="ws"}'] == 4
    assert m['clarion_handover_connections{outcome="taken"}'] == 8
    # Counted as TLS in the new process (the SSE reader may have left after its last message).
    assert m["clarion_tls_connections"] >= 2
    print(f"longest delivery pause: {longest_pause(clients) * 1000:.0f} ms")


def test_an_incompatible_peer_is_refused_and_the_old_process_restarts_with_1012(
    start_server, tmp_path
):
    hist = str(tmp_path / "hist")
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    old = start_server("--history-dir", hist, env={"XDG_RUNTIME_DIR": str(run)})
    sock, head, rest = rawws.connect(old.clients, "/ws?topic=t")
    reader = rawws.Reader(sock, rest)
    ids = [old.publish("t", f"m{i}")["id"] for i in range(1, 11)]
    for i in range(1, 11):
        assert reader.frame()[2] == f"m{i}".encode()
    # A peer speaking hand-over format 99.
    path = str(run / f"clarion-handover-{old.proc.pid}.sock")
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    peer = socket.socket(socket.AF_UNIX)
    peer.connect(path)
    body = struct.pack("<H", 99) + bytes([3]) + b"9.9" + struct.pack("<H", 1) + b"\0"
    peer.sendall(b"CLHO\x01" + struct.pack("<I", len(body)) + body)
    answer = peer.recv(4096)
    assert answer[:5] == b"CLHO\x02", answer
    assert b"format 99" in answer, answer
    # The fallback: a restart with a drain.
    assert reader.close_code()[0] == 1012
    assert wait_exit(old.proc) == 0
    log = old.proc.stderr.read()
    assert "hand-over refused" in log, log
    # The client resumes exactly on the next process (from history_dir).
    new = start_server("--history-dir", hist)
    answer = httpx.get(f"http://{new.clients}/poll?topic=t&since={ids[4]}&timeout=0").json()
    assert "gaps" not in answer, answer
    assert [m["data"] for m in answer["messages"]] == [f"m{i}" for i in range(6, 11)]
    assert [m["id"] for m in answer["messages"]] == ids[5:]


def test_a_dedicated_compressor_s_window_moves_with_its_connection(start_server):
    """`dedicated` compression keeps context across messages; after the upgrade the new
    process's compressor starts from the old one's window, so a message that repeats one sent
    before the move is still a short back-reference, and the client's inflater (which kept its
    context) reads it."""
    import zlib

    from test_compression import PRICE, open_raw, read_frame

    flags = ["--compression", "dedicated"]
    old = start_server(*flags)
    sock, _, rest = open_raw(old, "/ws?topic=d", "permessage-deflate; client_max_window_bits")
    inflate = zlib.decompressobj(-15)

    def receive(expected):
        nonlocal rest
        rsv, _, pay, rest = read_frame(sock, rest)
        assert rsv, "compressed"
        assert inflate.decompress(pay + b"\x00\x00\xff\xff").decode() == expected
        return len(pay)

    old.publish("d", PRICE)
    first = receive(PRICE)
    new = upgrade(old, *flags)
    assert wait_exit(old.proc) == 0
    log = old.proc.stderr.read()
    assert "1 connections moved" in log, log
    new.publish("d", PRICE)
    again = receive(PRICE)
    assert again < first / 3, f"the window did not move: {first} bytes before, {again} after"
    sock.close()


def test_connections_that_cannot_move_fall_back_and_are_counted(start_server, tmp_path):
    from test_tls import make_dev_cert

    dev = make_dev_cert(tmp_path / "tls")
    flags = ["--compression", "dedicated", "--compression-threshold", "0",
             "--tls-listen", "127.0.0.1:0", "--tls-cert", dev["cert"], "--tls-key", dev["key"]]
    old = start_server(*flags)
    mover = RawWs(old.clients, 2)
    # Dedicated compression with a context in both directions' sense: its compressor has
    # delivered, and it sent a compressed message. It moves (its window goes along).
    compressed = DeflateWs(old.clients, 2)
    compressed.ws.send(json.dumps({"type": "subscribe", "topic": "u"}))
    assert json.loads(compressed.ws.recv(timeout=10))["type"] == "subscribed"
    # In the middle of a compressed message sent in fragments: stays (deflate_fragmented).
    stayer, head, rest = rawws.connect(
        old.clients, "/ws?topic=t", "Sec-WebSocket-Extensions: permessage-deflate\r\n"
    )
    assert "client_no_context_takeover" in head, head
    stayer_reader = rawws.Reader(stayer, rest)
    stayer.sendall(rawws.frame(1, b"\xaa\x56\x2a", fin=False, rsv=4))
    port = old.tls.rsplit(":", 1)[1]
    # TLS 1.3 moves; TLS 1.2 (whose records stay with rustls) does not.
    secure = TlsWs(old.tls, dev["ca"], 2, deflate=False)
    tls12 = ssl.create_default_context(cafile=dev["ca"])
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    older = websockets.sync.client.connect(
        f"wss://localhost:{port}/ws?topic=t", ssl=tls12, open_timeout=10, compression=None
    )
    assert older.socket.version() == "TLSv1.2"
    # A handshake in flight: the first bytes of a ClientHello, and no more.
    host, _ = old.tls.rsplit(":", 1)
    shaking = socket.create_connection((host, int(port)), timeout=20)
    shaking.sendall(b"\x16\x03\x01\x00\xc8\x01\x00")
    # Accepted by the old process before the upgrade (not left in the listener's queue, which
    # moves): every TLS connection is counted once accepted.
    deadline = time.monotonic() + 10
    while old.metrics()["clarion_tls_connections"] < 3:
        assert time.monotonic() < deadline, "the TLS connections were not accepted"
        time.sleep(0.02)
    old.publish("t", payload(1))
    assert older.recv(timeout=10) == payload(1)
    assert stayer_reader.frame()[2]  # compressed (dedicated): not checked here
    mover.start()
    secure.start()
    compressed.start()
    new = upgrade(old, *flags)
    # The one in the middle of a fragmented compressed message, and TLS 1.2, are told to
    # reconnect; the others carry on.
    with pytest.raises(websockets.exceptions.ConnectionClosed) as e:
        older.recv(timeout=20)
    assert e.value.rcvd.code == 1012
    while True:
        _, op, data = stayer_reader.frame()
        if op == 8:
            assert struct.unpack("!H", data[:2])[0] == 1012
            break
    assert wait_exit(old.proc) == 0
    try:
        assert shaking.recv(100) == b"", "the half-done handshake is closed"
    except ConnectionResetError:
        pass
    log = old.proc.stderr.read()
    assert "3 connections moved" in log and "3 stay" in log, log
    assert "1 tls_handshake" in log and "1 tls12" in log and "1 deflate_fragmented" in log, log
    assert "other" not in log.split("stay and are told")[1].splitlines()[0], log
    m = new.metrics()
    assert m['clarion_handover_connections{outcome="taken"}'] == 3
    # The TLS listener moved too: the secure client reconnects to the same port.
    again = websockets.sync.client.connect(
        f"ws://localhost:{new.tls.rsplit(':', 1)[1]}/ws?topic=t",
        sock=tls13_socket(new.tls, dev["ca"]), open_timeout=10,
    )
    assert new.tls == old.tls
    new.publish("t", payload(2))
    assert again.recv(timeout=10) == payload(2)
    for c in (mover, secure, compressed):
        c.join(timeout=20)
        assert c.ended is None and c.got == [1, 2], (c.name, c.ended, c.got)
        assert c.still_open()


def test_sigusr1_upgrades_a_lone_process_in_place_and_the_pid_file_follows(
    start_server, tmp_path
):
    pid_file = tmp_path / "clarion.pid"
    old = start_server("--pid-file", pid_file)
    assert int(pid_file.read_text()) == old.proc.pid
    client = RawWs(old.clients, 3)
    client.start()
    old.publish("t", payload(1))
    old.proc.send_signal(signal.SIGUSR1)
    # The successor writes its ready line to the same output as the old process.
    line = old.proc.stdout.readline()
    assert line.startswith("clarion ready"), line
    assert wait_exit(old.proc) == 0
    new_pid = int(pid_file.read_text())
    assert new_pid != old.proc.pid
    try:
        status, _, _ = old.request("GET", "/healthz")
        assert status == 200
        old.publish("t", payload(2))
        old.publish("t", payload(3))
        client.join(timeout=20)
        assert client.ended is None and client.got == [1, 2, 3]
        assert client.still_open()
    finally:
        os.kill(new_pid, signal.SIGTERM)
    for _ in range(100):
        if not pid_file.exists():
            break
        time.sleep(0.1)
    assert not pid_file.exists(), "the last process removes the pid file it wrote"


def test_an_upgrade_works_under_a_temporary_directory_too_deep_for_a_socket_address(
    start_server, tmp_path
):
    """A unix socket address holds 107 bytes: under a deep `$TMPDIR` (a CI runner's, a test
    runner's per-worker directory) the hand-over socket is bound and reached through a
    descriptor of its directory, and the upgrade still keeps the connection."""
    import select

    tmp = tmp_path / ("t" * 100)
    tmp.mkdir()
    env = {"TMPDIR": str(tmp), "XDG_RUNTIME_DIR": "", "RUNTIME_DIRECTORY": ""}
    pid_file = tmp_path / "clarion.pid"
    old = start_server("--pid-file", pid_file, env=env)
    client = RawWs(old.clients, 2)
    client.start()
    old.publish("t", payload(1))
    old.proc.send_signal(signal.SIGUSR1)
    ready, _, _ = select.select([old.proc.stdout], [], [], 30)
    if not ready:
        old.proc.kill()
        pytest.fail(f"no successor took over (the upgrade failed): {old.proc.stderr.read()}")
    assert old.proc.stdout.readline().startswith("clarion ready")
    assert wait_exit(old.proc) == 0
    new_pid = int(pid_file.read_text())
    try:
        old.publish("t", payload(2))
        client.join(timeout=20)
        assert client.ended is None and client.got == [1, 2]
    finally:
        os.kill(new_pid, signal.SIGTERM)


@pytest.mark.parametrize("squat", ["directory", "symlink"])
def test_names_another_user_took_beforehand_do_not_stop_an_upgrade(start_server, tmp_path, squat):
    """Issue 55, item 8: another local user who creates the hand-over socket's old path
    (`$TMPDIR/clarion-handover-PID.sock`, a directory made it fail with "Address already in
    use") and the first name of the private directory (`$TMPDIR/clarion-UID`) cannot turn an
    upgrade into a restart. Needs root to make files of another user (CI runs as root)."""
    import select

    if os.geteuid() != 0:
        pytest.skip("needs root to make files owned by nobody")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)  # shared, like /tmp
    uid = os.geteuid()

    def take_names():
        # Runs in the child before exec: its pid is the server's.
        for p in (tmp / f"clarion-handover-{os.getpid()}.sock", tmp / f"clarion-{uid}"):
            if squat == "directory":
                p.mkdir(mode=0o777)
            else:
                p.symlink_to("/etc")
            os.lchown(p, 65534, 65534)

    env = {"TMPDIR": str(tmp), "XDG_RUNTIME_DIR": "", "RUNTIME_DIRECTORY": ""}
    pid_file = tmp_path / "clarion.pid"
    old = start_server("--pid-file", pid_file, env=env, preexec_fn=take_names)
    client = RawWs(old.clients, 2)
    client.start()
    old.publish("t", payload(1))
    old.proc.send_signal(signal.SIGUSR1)
    ready, _, _ = select.select([old.proc.stdout], [], [], 30)
    if not ready:
        old.proc.kill()
        pytest.fail(f"no successor took over (the upgrade failed): {old.proc.stderr.read()}")
    line = old.proc.stdout.readline()
    assert line.startswith("clarion ready"), line
    assert wait_exit(old.proc) == 0
    new_pid = int(pid_file.read_text())
    try:
        old.publish("t", payload(2))
        client.join(timeout=20)
        assert client.ended is None and client.got == [1, 2]
        assert client.still_open()
        # The names taken are left alone; the socket is in the next private directory.
        assert os.lstat(tmp / f"clarion-handover-{old.proc.pid}.sock").st_uid == 65534
        assert os.lstat(tmp / f"clarion-{uid}").st_uid == 65534
        private = tmp / f"clarion-{uid}-1"
        assert os.lstat(private).st_mode & 0o7777 == 0o700
        assert (private / f"clarion-handover-{new_pid}.sock").exists()
    finally:
        os.kill(new_pid, signal.SIGTERM)
