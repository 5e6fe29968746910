"""Helpers for the GRIP proxy tests (test_grip.py).

- `Backend`: a GRIP origin server written with the PyPI `gripcontrol` library, run in a thread
  on an ephemeral loopback port. It records every request it gets.
- `Pushpin`: the real Pushpin (Debian package) in a private run directory on free ports, with
  its own routes file; always killed as a process group by `stop()`.
- `Clarion`: `clarion serve --grip-routes ...` through conftest's `Server`.
- `RawHttp`: a raw-socket HTTP/1.1 client that keeps the exact bytes (head, de-chunked body,
  chunk framing), so the same scenario can be compared byte for byte across proxies.

Both proxies expose the same interface: `.clients` (client listener "host:port"),
`.publish_url` (the GRIP publish base URL, `http://host:port`), `.name`, `.stop()`.
"""

import http.server as httpserver
import json
import os
import pathlib
import random
import select
import shutil
import signal
import socket
import socketserver
import struct
import subprocess
import threading
import time
import urllib.parse

import jwt
from gripcontrol import (
    Channel,
    GripPubControl,
    HttpResponseFormat,
    HttpStreamFormat,
    WebSocketContext,
    WebSocketEvent,
    WebSocketMessageFormat,
    create_grip_channel_header,
    create_hold_response,
    decode_websocket_events,
    encode_websocket_events,
    validate_sig,
    websocket_control_message,
)
from pubcontrol import Item

from conftest import Server

SIG_KEY = "grip-test-key"
SIG_ISS = "grip-test-iss"
PUSHPIN = shutil.which("pushpin")


def wait_until(predicate, timeout=5.0, what="condition"):
    """Polls `predicate` (bounded by `timeout`) and returns its first truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.02)


_handed_out = set()


def free_port():
    """A port below the kernel's ephemeral range (32768-60999 by default), free on every
    address (Pushpin's condure binds 0.0.0.0), never handed out twice: no client connection can
    take it between this probe and the bind."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port in 20000-32000")


def port_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------------------------
# The GRIP backend


class Backend:
    """Endpoints (CHAN is a channel name):

    GET  /sse/CHAN[?prev=ID]   stream hold, SSE content type, body ":ok\\n\\n", optional prev-id
    GET  /stream/CHAN[?ka=S]   stream hold, text/plain, body "start\\n"; with ka=S a Grip-Keep-Alive
                               of ":ka\\n" every S seconds
    GET  /rel/CHAN             reliable stream: prev-id = last id of history[CHAN], Grip-Link
                               rel=next to /rel/CHAN?recover=1; with Grip-Last: what follows
    GET  /multi/A+B            stream hold on channels A and B ("A, B"), body "multi\\n"
    GET  /poll/CHAN[?t=S]      response hold with Grip-Timeout S (default 1); the held response
                               (sent on timeout) is 200 text/plain "timeout\\n" + X-Poll: held
    GET  /instruct/CHAN        response hold given as an application/grip-instruct JSON body
                               (create_hold_response), timeout 1
    *    /plain[...]           (HEAD too) non-GRIP: 200, X-Custom: yes, text/plain, body
                               "plain METHOD PATH\\n" + the request body
    GET  /missing              non-GRIP 404, X-Custom: nope, body "no such thing\\n"
    GET  /bad/forever          Grip-Hold: forever (invalid); /bad/nochannel: stream, no channel
    GET  /slow                 answers after `slow_seconds` (for the 504 test)
    POST /ws/CHAN              WebSocket-over-HTTP (route with over_http): accepts with the grip
                               extension, subscribes to CHAN, sets meta user=alice, echoes TEXT
                               as "echo:TEXT"; "meta" answers with the Meta-* it got; "bye"
                               makes the backend close with 4001; "unsub" moves it from
                               CHAN to CHAN-2; "detach" detaches; "keepalive" sends the
                               control message keep-alive (content "ka", timeout 1); CLOSE
                               is answered with CLOSE; a TEXT "fail" is answered 500; the
                               client's first subprotocol is chosen.
                               /ws/deny answers 403 text/plain "denied\\n".
                               With ?kai=S the OPEN answer sets Keep-Alive-Interval: S.
    """

    def __init__(self):
        self.requests = []  # dicts: method, path, headers (list of pairs), body, sig_ok, claims
        self.cond = threading.Condition()
        self.release = threading.Event()
        self.slow_seconds = 8.0
        self.history = {}  # channel -> [(id, bytes)] for /rel/
        backend = self

        class Handler(httpserver.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                backend._record(self, body)
                try:
                    backend._route(self, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _any

        class HTTPServer(socketserver.ThreadingMixIn, httpserver.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- recording

    def _record(self, handler, body):
        token = handler.headers.get("Grip-Sig")
        claims = None
        if token:
            try:
                claims = jwt.decode(token, options={"verify_signature": False})
            except jwt.PyJWTError:
                claims = "undecodable"
        entry = {
            "method": handler.command,
            "path": handler.path,
            "version": handler.request_version,
            "headers": list(handler.headers.items()),
            "body": body,
            "sig": token,
            "sig_ok": bool(token) and validate_sig(token, SIG_KEY, SIG_ISS),
            "claims": claims,
            "time": time.monotonic(),
        }
        with self.cond:
            self.requests.append(entry)
            self.cond.notify_all()

    def seen(self, path_prefix):
        with self.cond:
            return [r for r in self.requests if r["path"].startswith(path_prefix)]

    def wait_seen(self, path_prefix, count=1, timeout=5.0, pred=None):
        """The first `count` recorded requests under `path_prefix` (matching `pred`)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [
                    r
                    for r in self.requests
                    if r["path"].startswith(path_prefix) and (pred is None or pred(r))
                ]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"backend saw {len(found)} of {count} requests under {path_prefix}"
                    )
                self.cond.wait(left)

    # -- answers

    @staticmethod
    def _send(handler, status, headers, body):
        # Head and body in one write: Pushpin (through zurl) may act on a GRIP hold before the
        # body arrives when they come apart, then re-request the origin to get the body.
        reason = httpserver.BaseHTTPRequestHandler.responses.get(status, ("",))[0]
        head = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers]
        head.append(f"Content-Length: {len(body)}")
        if handler.command == "HEAD":
            body = b""
        handler.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        handler.wfile.flush()

    def _route(self, h, body):
        url = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        parts = url.path.strip("/").split("/")
        kind = parts[0]
        chan = parts[1] if len(parts) > 1 else ""
        if kind == "sse":
            channel = Channel(chan, query.get("prev"))
            self._send(
                h,
                200,
                [
                    ("Content-Type", "text/event-stream"),
                    ("Cache-Control", "no-cache"),
                    ("X-Backend", "sse"),
                    ("Grip-Hold", "stream"),
                    ("Grip-Channel", create_grip_channel_header(channel)),
                ],
                b":ok\n\n",
            )
        elif kind == "stream":
            headers = [
                ("Content-Type", "text/plain"),
                ("X-Backend", "stream"),
                ("Grip-Hold", "stream"),
                ("Grip-Channel", create_grip_channel_header(chan)),
            ]
            if "ka" in query:
                headers.append(("Grip-Keep-Alive", f":ka\\n; format=cstring; timeout={query['ka']}"))
            self._send(h, 200, headers, b"start\n")
        elif kind == "multi":  # stream hold on several channels: /multi/A+B
            self._send(
                h,
                200,
                [
                    ("Content-Type", "text/plain"),
                    ("Grip-Hold", "stream"),
                    ("Grip-Channel", create_grip_channel_header([Channel(c) for c in chan.split("+")])),
                ],
                b"multi\n",
            )
        elif kind == "poll":
            self._send(
                h,
                200,
                [
                    ("Content-Type", "text/plain"),
                    ("X-Poll", "held"),
                    ("Grip-Hold", "response"),
                    ("Grip-Channel", create_grip_channel_header(chan)),
                    ("Grip-Timeout", query.get("t", "1")),
                ],
                b"timeout\n",
            )
        elif kind == "instruct":
            instruct = create_hold_response(chan, "instruct-timeout\n", timeout=1)
            self._send(
                h, 200, [("Content-Type", "application/grip-instruct")], instruct.encode()
            )
        elif kind == "plain":
            out = f"plain {h.command} {h.path}\n".encode() + body
            self._send(h, 200, [("Content-Type", "text/plain"), ("X-Custom", "yes")], out)
        elif kind == "missing":
            self._send(
                h, 404, [("Content-Type", "text/plain"), ("X-Custom", "nope")], b"no such thing\n"
            )
        elif kind == "slow":
            self.release.wait(self.slow_seconds)
            self._send(h, 200, [("Content-Type", "text/plain")], b"slow\n")
        elif kind == "rel":
            # Reliable stream (Pushpin's recovery): the channel's history is `self.history[chan]`
            # [(id, bytes)]; the hold names the last id as prev-id and a Grip-Link rel=next
            # recovery URL. A request with Grip-Last gets what follows that id.
            log = self.history.get(chan, [])
            last = h.headers.get("Grip-Last")
            if last:
                last_id = last.split("last-id=", 1)[1].strip()
                ids = [i for i, _ in log]
                after = ids.index(last_id) + 1 if last_id in ids else 0
                out = b"".join(c for _, c in log[after:])
            else:
                out = b"start\n"
            prev = log[-1][0] if log else None
            self._send(
                h,
                200,
                [
                    ("Content-Type", "text/plain"),
                    ("Grip-Hold", "stream"),
                    ("Grip-Channel", create_grip_channel_header(Channel(chan, prev))),
                    ("Grip-Link", f"</rel/{chan}?recover=1>; rel=next"),
                ],
                out,
            )
        elif kind == "bad":  # invalid GRIP instructions
            headers = {
                "forever": [("Grip-Hold", "forever"), ("Grip-Channel", "c")],
                "nochannel": [("Grip-Hold", "stream")],
            }[chan]
            self._send(h, 200, [("Content-Type", "text/plain")] + headers, b"bad\n")
        elif kind == "ws":
            self._ws(h, chan, query, body)
        else:
            self._send(h, 404, [("Content-Type", "text/plain")], b"unknown\n")

    def _ws(self, h, chan, query, body):
        if chan == "deny":  # refuses the connection with a plain answer
            self._send(h, 403, [("Content-Type", "text/plain"), ("X-Custom", "deny")], b"denied\n")
            return
        events = decode_websocket_events(body)
        meta = {
            k[len("Meta-") :].lower(): v for k, v in h.headers.items() if k.lower().startswith("meta-")
        }
        ctx = WebSocketContext(h.headers.get("Connection-Id"), meta, events)
        if any(e.type == "TEXT" and e.content == b"fail" for e in events):
            self._send(h, 500, [("Content-Type", "text/plain")], b"origin failed\n")
            return
        headers = [("Content-Type", "application/websocket-events")]
        if ctx.is_opening():
            ctx.accept()
            ctx.subscribe(chan)
            ctx.meta["user"] = "alice"
            headers.append(("Sec-WebSocket-Extensions", "grip"))
            offered = h.headers.get("Sec-WebSocket-Protocol")
            if offered:  # pick the client's first subprotocol
                headers.append(("Sec-WebSocket-Protocol", offered.split(",")[0].strip()))
            if "kai" in query:
                headers.append(("Keep-Alive-Interval", query["kai"]))
        while ctx.can_recv():
            try:
                message = ctx.recv()
            except IOError:  # DISCONNECT
                break
            if message is None:  # CLOSE: answer it with the same code
                ctx.close(ctx.close_code)
                break
            if message == "meta":
                ctx.send("meta:" + json.dumps(ctx.orig_meta, sort_keys=True))
            elif message == "unsub":
                ctx.unsubscribe(chan)
                ctx.subscribe(chan + "-2")
                ctx.send("moved")
            elif message == "detach":
                ctx.detach()
                ctx.send("detached")
            elif message == "keepalive":
                ctx.send_control(
                    websocket_control_message("keep-alive", {"content": "ka", "timeout": 1})
                )
                ctx.send("keepalive on")
            elif message == "bye":
                ctx.send("bye!")
                ctx.close(4001)
                break
            elif isinstance(message, bytes):
                ctx.send_binary(b"echo:" + message)
            else:
                ctx.send("echo:" + message)
        out = []
        if ctx.accepted:
            out.append(WebSocketEvent("OPEN"))
        out.extend(ctx.out_events)
        if ctx.closed:
            code = ctx.out_close_code
            out.append(WebSocketEvent("CLOSE", struct.pack(">H", code) if code else None))
        for k, v in ctx.meta.items():
            if ctx.orig_meta.get(k) != v:
                headers.append(("Set-Meta-" + k.capitalize(), v))
        self._send(h, 200, headers, encode_websocket_events(out))


# --------------------------------------------------------------------------------------------
# The proxies


def routes_text(backend_port, dead_port, slow_port=None):
    """One routes file for every test: WebSocket-over-HTTP under /ws/, a dead backend under
    /dead/ (and /wsdead/ over HTTP), everything else to the backend."""
    return (
        f"*,path_beg=/ws/ 127.0.0.1:{backend_port},over_http\n"
        f"*,path_beg=/wsdead/ 127.0.0.1:{dead_port},over_http\n"
        f"*,path_beg=/dead/ 127.0.0.1:{dead_port}\n"
        f"* 127.0.0.1:{backend_port}\n"
    )


class Pushpin:
    """The real Pushpin with a private config, run dir and free ports."""

    name = "pushpin"

    def __init__(self, routes, workdir):
        self.dir = pathlib.Path(workdir) / "pushpin"
        run = self.dir / "run"
        run.mkdir(parents=True, exist_ok=True)
        (self.dir / "log").mkdir(exist_ok=True)
        (self.dir / "routes").write_text(routes)
        self.port = free_port()
        self.publish_port = free_port()
        ipc = "ipc://{rundir}/{ipc_prefix}"
        conf = pathlib.Path("/etc/pushpin/pushpin.conf").read_text()
        replacements = [
            ("rundir=/var/run/pushpin", f"rundir={run}"),
            ("logdir=/var/log/pushpin", f"logdir={self.dir / 'log'}"),
            ("http_port=7999", f"http_port=127.0.0.1:{self.port}"),
            ("client_maxconn=50000", "client_maxconn=1000"),
            (
                "services=condure,pushpin-proxy,pushpin-handler",
                "services=condure,zurl,pushpin-proxy,pushpin-handler",
            ),
            (
                "[proxy]\n",
                "[proxy]\n"
                f"zurl_out_specs={ipc}zurl-in\n"
                f"zurl_out_stream_specs={ipc}zurl-in-stream\n"
                f"zurl_in_specs={ipc}zurl-out\n",
            ),
            ("routesfile=routes", f"routesfile={self.dir / 'routes'}"),
            ("sig_iss=pushpin", f"sig_iss={SIG_ISS}"),
            ("sig_key=changeme", f"sig_key={SIG_KEY}"),
            ("push_in_spec=tcp://127.0.0.1:5560", f"push_in_spec={ipc}push-in"),
            ("push_in_sub_specs=tcp://127.0.0.1:5562", f"push_in_sub_specs={ipc}push-in-sub"),
            ("push_in_http_port=5561", f"push_in_http_port={self.publish_port}"),
            ("command_spec=tcp://127.0.0.1:5563", f"command_spec={ipc}command"),
        ]
        for old, new in replacements:
            assert old in conf, old
            conf = conf.replace(old, new)
        (self.dir / "pushpin.conf").write_text(conf)
        self.log = open(self.dir / "pushpin.log", "w")
        self.proc = subprocess.Popen(
            [PUSHPIN, "--config", str(self.dir / "pushpin.conf"), "--merge-output"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.dir,
        )
        self.clients = f"127.0.0.1:{self.port}"
        self.publish_url = f"http://127.0.0.1:{self.publish_port}"
        try:
            wait_until(
                lambda: self._check() and port_open(self.port) and port_open(self.publish_port),
                timeout=20,
                what="pushpin ports",
            )
            self._warm_up()
        except BaseException:
            self.stop()
            raise

    def _warm_up(self):
        """Pushpin's processes find each other over ZeroMQ after they listen: until then a
        request can get 502 or "500 Accept service unavailable", and a publish can miss a held
        stream. Wait (bounded) until a stream hold receives a publish."""
        deadline = time.monotonic() + 30
        for attempt in range(200):
            self._check()
            if time.monotonic() > deadline:
                raise RuntimeError("pushpin did not become ready")
            try:
                s = RawHttp(self.clients, "GET", f"/stream/warmup{attempt}", timeout=2)
                try:
                    s.read_head(2)
                    if s.status == 200 and s.read_body_until(b"start\n", 1) == b"start\n":
                        publish(self, f"warmup{attempt}", HttpStreamFormat("ready\n"))
                        s.read_body_until(b"ready\n", 1)
                        return
                finally:
                    s.close()
            except (OSError, AssertionError, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError("pushpin did not become ready")

    def _check(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"pushpin exited: {(self.dir / 'pushpin.log').read_text()[-3000:]}")
        return True

    def _session_pids(self):
        """Processes in Pushpin's session: the runner starts condure, zurl, pushpin-proxy and
        pushpin-handler each in its own process group, but in the runner's session."""
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[3]) == self.proc.pid:  # state, ..., session
                pids.append(int(entry))
        return pids

    def stop(self):
        """SIGTERM to the runner (it stops its services), then SIGKILL to whatever is left of
        the session; bounded."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for _ in range(50):
            left = self._session_pids()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.log.close()


class Clarion:
    """`clarion serve --grip-routes FILE --grip-sig-key KEY --grip-sig-iss ISS`."""

    name = "clarion"

    def __init__(self, routes, workdir):
        path = pathlib.Path(workdir) / "clarion-routes"
        path.write_text(routes)
        self.server = Server(
            ["--grip-routes", str(path), "--grip-sig-key", SIG_KEY, "--grip-sig-iss", SIG_ISS]
        )
        self.clients = self.server.clients
        self.publish_url = f"http://{self.server.api}"

    def stop(self):
        if self.server.proc.poll() is None:
            self.server.proc.kill()
        self.server.proc.wait(timeout=10)


def start_proxy(name, routes, workdir):
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    return {"pushpin": Pushpin, "clarion": Clarion}[name](routes, workdir)


def pubcontrol(proxy):
    """A GripPubControl aimed at the proxy's publish API, as an app would configure it."""
    return GripPubControl({"control_uri": proxy.publish_url})


def publish(proxy, channel, formats, id=None, prev_id=None):
    """Publishes one item (a format or a list of formats) with pubcontrol, blocking."""
    pc = pubcontrol(proxy)
    try:
        pc.publish(channel, Item(formats, id, prev_id), blocking=True)
    finally:
        pc.close()


# --------------------------------------------------------------------------------------------
# Raw HTTP client


class RawHttp:
    """One HTTP/1.1 request over a raw socket; keeps the head bytes, the de-chunked body and
    the chunk sizes. `read_head()`, then `read_body_until(...)` / `read_to_end()`."""

    def __init__(self, addr, method, path, headers=(), body=None, timeout=5.0, http10=False):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        lines = [f"{method} {path} HTTP/1.{0 if http10 else 1}", f"Host: {addr}"]
        lines += [f"{k}: {v}" for k, v in headers]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
        self.buf = b""
        self.head = None
        self.status = None
        self.headers = []
        self.body = b""
        self.chunks = []  # sizes of the chunks seen, when chunked
        self.chunked = False
        self.length = None
        self.done = False
        self.eof = False
        self.arrivals = []  # (monotonic time, body length after this read)

    def close(self):
        self.sock.close()

    def next_response(self, send=None):
        """Starts reading the next response on this connection (after the current one is
        complete), optionally sending another request first."""
        assert self.done, "the current response is not complete"
        if send is not None:
            self.sock.sendall(send)
        self.head = self.status = None
        self.headers, self.body, self.chunks, self.arrivals = [], b"", [], []
        self.chunked, self.length, self.done = False, None, False
        return self

    def header(self, name):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def _recv(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([self.sock], [], [], left)
        if not ready:
            return False
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def read_head(self, timeout=5.0):
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self.buf:
            if not self._recv(deadline):
                raise AssertionError(f"no response head (eof={self.eof}): {self.buf!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        self.head = head + b"\r\n\r\n"
        lines = head.decode("latin-1").split("\r\n")
        self.status_line = lines[0]
        self.status = int(lines[0].split(" ")[1])
        self.headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:]]
        te = (self.header("Transfer-Encoding") or "").lower()
        self.chunked = "chunked" in te
        if self.header("Content-Length") is not None:
            self.length = int(self.header("Content-Length"))
        self._parse()
        return self

    def _parse(self):
        while not self.done:
            if self.chunked:
                if b"\r\n" not in self.buf:
                    return
                line, rest = self.buf.split(b"\r\n", 1)
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    if b"\r\n" in rest:  # no trailers expected
                        self.done = True
                        self.chunks.append(0)
                        self.buf = rest.split(b"\r\n", 1)[1]
                    return
                if len(rest) < size + 2:
                    return
                self.body += rest[:size]
                self.chunks.append(size)
                self.buf = rest[size + 2 :]
            elif self.length is not None:
                take = self.buf[: self.length - len(self.body)]
                self.body += take
                self.buf = self.buf[len(take) :]
                if len(self.body) >= self.length:
                    self.done = True
                return
            else:
                self.body += self.buf
                self.buf = b""
                if self.eof:
                    self.done = True
                return

    def read_body_until(self, pred, timeout=5.0):
        """Reads until pred(body) holds; returns the body so far."""
        if isinstance(pred, bytes):
            needle = pred
            pred = lambda b: needle in b  # noqa: E731
        deadline = time.monotonic() + timeout
        while not pred(self.body):
            if self.done:
                raise AssertionError(f"body ended without the expected bytes: {self.body!r}")
            if not self._recv(deadline):
                if self.eof:
                    self._parse()
                    if self.done or pred(self.body):
                        continue
                    raise AssertionError(f"connection closed; body so far {self.body!r}")
                raise AssertionError(f"timed out; body so far {self.body!r}")
            before = len(self.body)
            self._parse()
            if len(self.body) != before:
                self.arrivals.append((time.monotonic(), len(self.body)))
        return self.body

    def read_to_end(self, timeout=5.0):
        """Reads until the body is complete (terminal chunk, length, or close)."""
        deadline = time.monotonic() + timeout
        while not self.done:
            if not self._recv(deadline):
                if self.eof:
                    self._parse()
                    if not self.done:
                        self.done = True
                        self.truncated = True
                    break
                raise AssertionError(f"body not complete in time; so far {self.body!r}")
            self._parse()
        return self.body

    def closed_after(self, timeout=3.0):
        """True when the server closes the connection within `timeout` (after the body)."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            if not self._recv(deadline):
                break
        return self.eof


def http(addr, method, path, headers=(), body=None, timeout=5.0):
    """A complete request: the RawHttp with head and body read."""
    r = RawHttp(addr, method, path, headers, body, timeout)
    try:
        r.read_head(timeout)
        r.read_to_end(timeout)
    finally:
        r.close()
    return r
