"""Two small HTTP/2 clients for the tests, over a plain socket (h2c prior knowledge) or TLS
(ALPN h2): `Client` drives hyper-h2 the way a well-behaved client does, and keeps what each
stream received; `Raw` writes frames by hand and reads the server's, for what a well-behaved
library never sends (bad frames, floods, resets)."""

import json
import socket
import ssl
import struct
import subprocess
import threading
import time

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types, flags, settings and error codes (RFC 9113, RFC 8441).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_ENABLE_CONNECT_PROTOCOL = 0x4, 0x8
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED = 0x0, 0x1, 0x3, 0x5
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM = 0x6, 0x7, 0x8, 0xB
COMPRESSION_ERROR = 0x9


def open_socket(addr, ca=None, alpn=("h2",), timeout=10.0):
    """A connected socket; with `ca`, a TLS one offering `alpn`."""
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    if ca:
        ctx = ssl.create_default_context(cafile=ca)
        ctx.set_alpn_protocols(list(alpn))
        sock = ctx.wrap_socket(sock, server_hostname="localhost")
    return sock


def frame(ftype, flags=0, stream=0, payload=b""):
    """One frame's bytes."""
    return struct.pack("!I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack("!I", stream) + payload


def settings_frame(values=()):
    return frame(SETTINGS, 0, 0, b"".join(struct.pack("!HI", k, v) for k, v in values))


def sse_events(body):
    """The complete events of an SSE body: a list of {field: value} (comments as ":")."""
    events = []
    text = bytes(body).decode()
    for block in text.split("\n\n")[:-1]:
        ev = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                ev[":"] = line
            elif line:
                name, _, value = line.partition(":")
                ev[name] = value[1:] if value.startswith(" ") else value
        events.append(ev)
    return events


def messages(body):
    """The events of an SSE body that carry data: [(id, data)]."""
    return [(e.get("id"), e["data"]) for e in sse_events(body) if "data" in e]


class Client:
    """hyper-h2 over a socket. Every stream's headers, body, end and reset are kept; the
    client opens the windows of every stream it reads (all but those in `hold`)."""

    def __init__(self, addr, ca=None, initial_window=None, timeout=10.0):
        self.sock = open_socket(addr, ca, timeout=timeout)
        if ca:
            assert self.sock.selected_alpn_protocol() == "h2"
        cfg = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(cfg)
        if initial_window is not None:
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: initial_window}
            )
        self.conn.initiate_connection()
        self.headers, self.body, self.ended, self.resets = {}, {}, set(), {}
        self.hold = set()
        self.remote_settings = {}
        self.goaway = None
        self.closed = False
        self.flush()

    def flush(self):
        out = self.conn.data_to_send()
        if out:
            self.sock.sendall(out)

    def request(self, path, method="GET", headers=(), end_stream=True, authority="localhost"):
        """Opens a stream; returns its id."""
        sid = self.conn.get_next_available_stream_id()
        scheme = "https" if isinstance(self.sock, ssl.SSLSocket) else "http"
        fields = [(":method", method), (":scheme", scheme), (":authority", authority), (":path", path)]
        if method == "CONNECT":
            fields = [(":method", "CONNECT"), (":protocol", "websocket"), *fields[1:]]
        self.conn.send_headers(sid, fields + list(headers), end_stream=end_stream)
        self.body[sid] = bytearray()
        self.flush()
        return sid

    def send_data(self, sid, data, end_stream=False):
        self.conn.send_data(sid, data, end_stream=end_stream)
        self.flush()

    def reset(self, sid, code=CANCEL):
        self.conn.reset_stream(sid, code)
        self.flush()

    def status(self, sid):
        return int(self.headers[sid][":status"])

    def pump(self, until, timeout=5.0, what="condition"):
        """Reads until `until()` holds; fails the test after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                raise AssertionError(f"timed out waiting for {what} (closed={self.closed})")
            self.sock.settimeout(min(left, 0.5))
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except (ConnectionResetError, ssl.SSLError):
                data = b""
            if not data:
                self.closed = True
                continue
            self.feed(data)
        return True

    def read_for(self, seconds):
        """Reads whatever comes for `seconds`."""
        end = time.monotonic() + seconds
        try:
            self.pump(lambda: time.monotonic() >= end, timeout=seconds + 1)
        except AssertionError:
            if not self.closed:
                raise

    def feed(self, data):
        for ev in self.conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                self.headers[ev.stream_id] = dict(ev.headers)
            elif isinstance(ev, h2.events.DataReceived):
                self.body.setdefault(ev.stream_id, bytearray()).extend(ev.data)
                if ev.stream_id in self.hold:
                    # The connection's window stays open; the stream's does not.
                    if ev.flow_controlled_length:
                        self.conn.increment_flow_control_window(ev.flow_controlled_length)
                elif ev.flow_controlled_length:
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                self.ended.add(ev.stream_id)
            elif isinstance(ev, h2.events.StreamReset):
                self.resets[ev.stream_id] = ev.error_code
            elif isinstance(ev, h2.events.RemoteSettingsChanged):
                for code, change in ev.changed_settings.items():
                    self.remote_settings[int(code)] = change.new_value
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.goaway = (int(ev.error_code), ev.last_stream_id)
        self.flush()

    def get(self, path, timeout=5.0):
        """(status, headers, body) of a request that ends."""
        sid = self.request(path)
        self.pump(lambda: sid in self.ended or sid in self.resets, timeout, f"the end of {path}")
        return self.status(sid), self.headers[sid], bytes(self.body[sid])

    def lines(self, sid):
        return [json.loads(l) for l in bytes(self.body[sid]).decode().split("\n") if l]

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Raw:
    """Frames by hand. `read` parses the server's frames (acknowledging its SETTINGS)."""

    def __init__(self, addr, ca=None, settings=(), preface=PREFACE, timeout=10.0):
        self.sock = open_socket(addr, ca, timeout=timeout)
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.buf = b""
        self.closed = False
        # False plays a client that ignores the server's SETTINGS_HEADER_TABLE_SIZE.
        self.honour_table_size = True
        if preface is not None:
            self.sock.sendall(preface + settings_frame(settings))

    def send(self, *frames):
        self.sock.sendall(b"".join(frames))

    def block(self, path="/nope", method="GET", extra=()):
        """A header block for a request (encoded with the connection's HPACK state)."""
        fields = [(":method", method), (":scheme", "http"), (":authority", "localhost"), (":path", path)]
        return self.enc.encode(fields + list(extra))

    def headers(self, sid, path="/nope", end_stream=True, extra=()):
        flags = END_HEADERS | (END_STREAM if end_stream else 0)
        return frame(HEADERS, flags, sid, self.block(path, extra=extra))

    def read(self, timeout=5.0):
        """The next frame as (type, flags, stream, payload); None once the server closed."""
        self.sock.settimeout(timeout)
        while True:
            if len(self.buf) >= 9:
                n = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) >= 9 + n:
                    ftype, flags = self.buf[3], self.buf[4]
                    sid = struct.unpack("!I", self.buf[5:9])[0] & 0x7FFFFFFF
                    payload, self.buf = self.buf[9 : 9 + n], self.buf[9 + n :]
                    if ftype == SETTINGS and not flags & ACK:
                        # The server's table size applies to our encoder from our ACK on (its
                        # next block starts with the size update, RFC 7541 §4.2).
                        for i in range(0, len(payload) - 5, 6):
                            key, value = struct.unpack("!HI", payload[i : i + 6])
                            if key == SETTINGS_HEADER_TABLE_SIZE and self.honour_table_size:
                                self.enc.header_table_size = value
                        try:
                            self.send(frame(SETTINGS, ACK))
                        except OSError:
                            pass
                    return ftype, flags, sid, payload
            if self.closed:
                return None
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
                data = b""
            if not data:
                self.closed = True
            self.buf += data

    def until(self, pred, timeout=5.0):
        """Frames up to and including the first for which `pred` holds (None: it never came
        before the server closed)."""
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; frames seen: {[f[:3] for f in seen]}"
            f = self.read(left)
            if f is None:
                return None, seen
            seen.append(f)
            if pred(f):
                return f, seen

    def goaway(self, timeout=5.0):
        """(error code, last stream) of the server's GOAWAY; asserts the connection then ends."""
        f, seen = self.until(lambda f: f[0] == GOAWAY, timeout)
        assert f is not None, f"closed without GOAWAY; frames: {[x[:3] for x in seen]}"
        last, code = struct.unpack("!II", f[3][:8])
        assert self.read(timeout) is None or self.drain(timeout), "the connection stayed open"
        return code, last & 0x7FFFFFFF

    def drain(self, timeout):
        """True once the server closes (frames in between are ignored)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.read(deadline - time.monotonic()) is None:
                return True
        return False

    def rst(self, sid, timeout=5.0):
        """The error code of the server's RST_STREAM on `sid`."""
        f, seen = self.until(lambda f: f[0] == RST_STREAM and f[2] == sid, timeout)
        assert f is not None, f"closed without RST_STREAM; frames: {[x[:3] for x in seen]}"
        return struct.unpack("!I", f[3])[0]

    def response(self, sid, timeout=5.0):
        """(status, body) of the answer on `sid`, read to its END_STREAM."""
        status, body = None, b""
        while True:
            f, _ = self.until(lambda f: f[2] == sid and f[0] in (HEADERS, DATA, RST_STREAM), timeout)
            assert f is not None, "closed before the answer ended"
            ftype, flags, _, payload = f
            if ftype == RST_STREAM and status is not None:
                return status, body
            assert ftype != RST_STREAM, f"reset: {struct.unpack('!I', payload)[0]}"
            if ftype == HEADERS:
                status = int(dict(self.dec.decode(payload))[":status"])
            else:
                body += payload
            if flags & END_STREAM:
                return status, body

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def h1_sse(addr, topic):
    """An HTTP/1.1 event stream on `addr` (host:port), subscribed once this returns: the socket
    and what came after the head."""
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(f"GET /sse?topic={topic} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 200 "), head
    return sock, head.partition(b"\r\n\r\n")[2]


def in_background(argv, timeout=None):
    """Runs `argv` (text output captured) in a thread; returns a function that waits for it and
    gives its `CompletedProcess`, or None if it did not finish (its timeout)."""
    box = {}

    def run():
        box["p"] = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    t = threading.Thread(target=run)
    t.start()

    def result():
        t.join()
        return box.get("p")

    return result
