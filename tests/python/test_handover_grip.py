"""Upgrades keep the connections a GRIP backend holds (issue 46): under a 20 msg/s publisher,
SIGUSR1 moves a held stream over HTTP/1.1 (with its backend keep-alive), a held stream as an
HTTP/2 stream (h2c, curl) and a held long-poll to the new process: no close, no reset, every
message once and in order, the keep-alive continues, the long-poll is answered by a publish to
the new process. The log names 3 moved connections and none that stays."""

import http.server
import json
import os
import signal
import socket
import subprocess
import threading
import time

from conftest import Server

N = 60


class Backend(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path.startswith("/held-stream"):
            headers = {
                "Grip-Hold": "stream",
                "Grip-Channel": "hg",
                "Grip-Keep-Alive": "ka\\n; format=cstring; timeout=1",
            }
            self._answer(b"start\n", headers)
        elif self.path.startswith("/held-response"):
            headers = {"Grip-Hold": "response", "Grip-Channel": "hg", "Grip-Timeout": "60"}
            self._answer(b"timeout\n", headers)
        else:
            self._answer(b"plain\n", {})

    def _answer(self, body, headers):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def publish(server, i, response=False):
    formats = {"http-stream": {"content": f"m{i}\n"}}
    if response:
        formats = {"http-response": {"body": f"answered {i}\n"}}
    body = json.dumps({"items": [{"channel": "hg", "formats": formats}]}).encode()
    for _ in range(100):  # a 503 while the upgrade freezes publishing is retried, as clients do
        status, _, out = server.request(
            "POST", "/publish/", body, {"Content-Type": "application/json"}
        )
        if status != 503:
            break
        time.sleep(0.05)
    assert status == 200, out


class ChunkedStream(threading.Thread):
    """A raw HTTP/1.1 client of a held stream: de-chunks the body, keeps every line and when it
    came; `ended` says why the connection ended, if it did."""

    def __init__(self, addr, path):
        super().__init__(daemon=True)
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=20)
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        self.lines, self.times, self.ended, self.head = [], [], None, b""
        self.stop = False

    def run(self):
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += self.sock.recv(65536)
        self.head, buf = buf.split(b"\r\n\r\n", 1)
        body = b""
        while not self.stop:
            while True:
                if b"\r\n" not in buf:
                    break
                size_line, rest = buf.split(b"\r\n", 1)
                size = int(size_line, 16)
                if len(rest) < size + 2:
                    break
                if size == 0:
                    self.ended = "last chunk"
                    return
                body += rest[:size]
                buf = rest[size + 2:]
                while b"\n" in body:
                    line, body = body.split(b"\n", 1)
                    self.lines.append(line.decode())
                    self.times.append(time.monotonic())
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as e:
                self.ended = repr(e)
                return
            if not data:
                self.ended = "closed"
                return
            buf += data

    def messages(self):
        return [int(x[1:]) for x in self.lines if x.startswith("m")]


def test_sigusr1_moves_grip_held_streams_and_long_polls_with_their_keep_alive(
    start_server, tmp_path
):
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    new_pid = None
    try:
        routes = tmp_path / "routes"
        routes.write_text(f"* 127.0.0.1:{backend.server_address[1]}\n")
        pid_file = tmp_path / "clarion.pid"
        old = start_server("--grip-routes", routes, "--pid-file", pid_file)
        h1 = ChunkedStream(old.clients, "/held-stream")
        h1.start()
        h2 = subprocess.Popen(
            ["curl", "-sS", "-N", "--http2-prior-knowledge", "--max-time", "30",
             f"http://{old.clients}/held-stream/h2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        poll = subprocess.Popen(
            ["curl", "-sS", "-i", "--max-time", "30", f"http://{old.clients}/held-response"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.time() + 10
        while old.metrics().get("clarion_grip_held", 0) < 3:
            assert time.time() < deadline, "three holds"
            time.sleep(0.05)
        # The keep-alive runs in the old process before the move.
        while "ka" not in h1.lines:
            assert time.time() < deadline, "a keep-alive before the upgrade"
            time.sleep(0.05)
        for i in range(1, N + 1):
            publish(old, i)
            time.sleep(0.05)  # 20 messages a second
            if i == N // 3:
                old.proc.send_signal(signal.SIGUSR1)
        line = old.proc.stdout.readline()
        assert line.startswith("clarion ready"), line
        assert old.proc.wait(timeout=30) == 0
        new_pid = int(pid_file.read_text())
        log = ""
        while "connections moved" not in log:
            line = old.proc.stderr.readline()
            assert line, log
            log += line
        assert "3 connections moved" in log and "0 stay" in log, log
        # The keep-alive continues from the new process, with nothing published.
        kas = h1.lines.count("ka")
        deadline = time.time() + 5
        while h1.lines.count("ka") == kas:
            assert time.time() < deadline and h1.ended is None, (h1.ended, h1.lines[-5:])
            time.sleep(0.05)
        # The long-poll is answered by a publish to the new process.
        publish(old, 0, response=True)
        out, err = poll.communicate(timeout=20)
        assert "answered 0" in out, (out, err)
        # The HTTP/1.1 stream saw every message once, in order, and is still open.
        assert h1.ended is None, h1.ended
        assert h1.messages() == list(range(1, N + 1)), h1.lines
        h1.sock.sendall(b"")  # still writable
        # The HTTP/2 stream ends with a published close: everything came once, in order, on
        # the stream the old process opened.
        close = {"items": [{"channel": "hg", "formats": {"http-stream": {"action": "close"}}}]}
        status, _, body = old.request(
            "POST", "/publish/", json.dumps(close).encode(), {"Content-Type": "application/json"}
        )
        assert status == 200, body
        out, err = h2.communicate(timeout=20)
        assert h2.returncode == 0, err
        got = [int(x[1:]) for x in out.split("\n") if x.startswith("m")]
        assert got == list(range(1, N + 1)), out
        assert out.startswith("start\n"), out
        h1.join(timeout=5)
        assert h1.ended == "last chunk"
        metrics = old.metrics()  # the API listener moved: the new process answers
        assert metrics['clarion_handover_connections{outcome="taken"}'] == 3
    finally:
        backend.shutdown()
        if new_pid:
            os.kill(new_pid, signal.SIGTERM)


def test_a_request_waiting_for_the_grip_backend_stays_with_its_reason(start_server, tmp_path):
    """A request forwarded to the backend and not answered yet is not replayed elsewhere: its
    connection stays, counted as grip_backend."""
    gate = threading.Event()

    class Slow(Backend):
        def do_GET(self):
            gate.wait(20)
            self._answer(b"late\n", {})

    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    new_pid = None
    try:
        routes = tmp_path / "routes"
        routes.write_text(f"* 127.0.0.1:{backend.server_address[1]}\n")
        pid_file = tmp_path / "clarion.pid"
        old = start_server("--grip-routes", routes, "--pid-file", pid_file)
        host, port = old.clients.rsplit(":", 1)
        waiting = socket.create_connection((host, int(port)), timeout=20)
        waiting.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.5)
        old.proc.send_signal(signal.SIGUSR1)
        line = old.proc.stdout.readline()
        assert line.startswith("clarion ready"), line
        log = ""
        while "connections moved" not in log:
            line = old.proc.stderr.readline()
            assert line, log
            log += line
        assert "1 grip_backend" in log, log
        gate.set()
        assert old.proc.wait(timeout=30) == 0
        new_pid = int(pid_file.read_text())
    finally:
        gate.set()
        backend.shutdown()
        if new_pid:
            os.kill(new_pid, signal.SIGTERM)
