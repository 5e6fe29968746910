"""HTTP/1.1 answers on the client listener, over raw sockets."""

import re
import socket
import time

import pytest

import rawws
from cluster_util import stop_all_threads

KEY = "dGhlIHNhbXBsZSBub25jZQ=="
UPGRADE = (
    "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: " + KEY + "\r\nSec-WebSocket-Version: {version}\r\n{extra}\r\n"
)


def upgrade(path="/ws", version="13", extra=""):
    return UPGRADE.format(path=path, version=version, extra=extra).encode()


def test_handshake_accept_key(server):
    status, head, _ = rawws.http(server.clients, upgrade())
    assert status == 101
    assert "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in head


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"POST /ws HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n", 426),
        (upgrade(version="8"), 426),
        (upgrade().replace(KEY.encode(), b"c2hvcnQ="), 400),
        (upgrade().replace(b"Connection: Upgrade", b"Connection: keep-alive"), 400),
        (upgrade(path="/ws?topic=bad%20topic"), 400),
        (upgrade(path="/ws?topic=%zz"), 400),
        (upgrade(path="/ws?topic=" + "x" * 129), 400),
        (b"GET /ws HTTP/2.0\r\n\r\n", 505),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(100)) + b"\r\n", 431),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"v" * 20000 + b"\r\n\r\n", 431),
        (b"POST /ws HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 413),
    ],
)
def test_error_statuses(server, raw, status):
    got, head, sock = rawws.http(server.clients, raw)
    sock.close()
    assert got == status, head


@pytest.mark.parametrize(
    "raw",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        # An HTTP/2 client's broken preface (h2spec 3.5/2) on the port shared with HTTP/1.1.
        b"INVALID CONNECTION PREFACE\r\n\r\n",
        # A TLS ClientHello on the clear port.
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(64)),
    ],
)
def test_bytes_that_are_not_http_close_without_an_answer(server, raw):
    # No answer could be read by what sent them: neither an HTTP/1.1 error nor HTTP/2 frames.
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(raw)
        assert s.recv(64) == b""


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /publish/news HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /publish/news HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
)
def test_api_requests_on_the_client_listener_say_which_listener_to_use(server, raw):
    host, port = server.clients.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        head, rest = rawws.read_head(sock)
        length = int(re.search(r"Content-Length: (\d+)", head).group(1))
        while len(rest) < length:
            chunk = sock.recv(4096)
            assert chunk, (head, rest)
            rest += chunk
    assert head.startswith("HTTP/1.1 404 "), head
    assert rest[:length].decode() == (
        "this is the client listener; publish to the API listener "
        "(api_listen, 127.0.0.1:8081 by default)\n"
    )


def test_426_names_the_supported_version(server):
    _, head, _ = rawws.http(server.clients, upgrade(version="8"))
    assert "Sec-WebSocket-Version: 13" in head
    _, head, _ = rawws.http(server.clients, b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n")
    assert "Upgrade: websocket" in head


def test_405_lists_allowed_methods(server):
    _, head, _ = rawws.http(server.clients, b"DELETE /ws HTTP/1.1\r\nHost: x\r\n\r\n")
    assert "Allow: GET" in head


def read_response(sock, leftover=b""):
    head, rest = rawws.read_head(sock) if not leftover else leftover
    length = 0
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            length = int(value)
    while len(rest) < length:
        rest += sock.recv(4096)
    return head, rest[:length], rest[length:]


def test_keep_alive_serves_several_requests_on_one_connection(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    for _ in range(3):
        sock.sendall(b"GET /missing HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body, extra = read_response(sock)
        assert head.startswith("HTTP/1.1 404")
        assert extra == b""
    sock.sendall(b"GET /missing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, _ = read_response(sock)
    assert head.startswith("HTTP/1.1 404")
    assert rawws.Reader(sock).at_eof()


def test_pipelined_requests_are_answered_in_order(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPUT /ws HTTP/1.1\r\nHost: x\r\n\r\n")
    head1, _, rest = read_response(sock)
    assert head1.startswith("HTTP/1.1 404")
    data = rest
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    assert data.startswith(b"HTTP/1.1 405")


def test_malformed_head_closes_the_connection(server):
    _, _, sock = rawws.http(server.clients, b"GARBAGE\r\n\r\n")
    assert rawws.Reader(sock).at_eof()


def test_slowloris_head_times_out(start_server):
    server = start_server("--handshake-timeout", 1)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(b"GET /ws HTTP/1.1\r\n")
    got = b""
    while chunk := sock.recv(4096):
        got += chunk
    assert got.startswith(b"HTTP/1.1 408"), got
    # A connection that sent nothing is simply closed.
    quiet = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    assert quiet.recv(100) == b""


def test_connection_limit_answers_503(start_server):
    server = start_server("--max-connections", 2)
    held = [rawws.connect(server.clients, "/ws?topic=t")[0] for _ in range(2)]
    status, head, sock = rawws.http(server.clients, upgrade())
    assert status == 503
    assert "Retry-After" in head
    for s in held:
        s.close()
    # Capacity comes back once connections close.
    for _ in range(100):
        status, _, sock = rawws.http(server.clients, upgrade())
        sock.close()
        if status == 101:
            break
        time.sleep(0.05)
    assert status == 101
    assert server.metrics()['clarion_connections_refused_total{reason="capacity"}'] >= 1


def test_an_event_stream_refused_at_capacity_is_told_to_come_back(start_server):
    # A browser's EventSource gives up for good on a 503; refused at capacity, a request for an
    # event stream whose head has arrived gets the 200 stream that says when to come back.
    # The server is stopped while the requests are sent, so both heads have arrived when it
    # accepts (as under load, when connections wait in the accept queue).
    import signal

    server = start_server("--max-connections", 1)
    held = rawws.connect(server.clients, "/ws?topic=t")[0]
    host, port = server.clients.rsplit(":", 1)
    stop_all_threads(server.proc)
    try:
        sse = socket.create_connection((host, int(port)), timeout=10)
        sse.sendall(b"GET /sse?topic=t HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        ws = socket.create_connection((host, int(port)), timeout=10)
        ws.sendall(upgrade())
        time.sleep(0.2)
    finally:
        server.proc.send_signal(signal.SIGCONT)

    def whole(sock):
        got = b""
        while chunk := sock.recv(4096):
            got += chunk
        sock.close()
        return got

    answer = whole(sse)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert b"text/event-stream" in answer and b"event: unavailable" in answer, answer
    assert b"server at its connection limit" in answer
    assert 4000 <= int(answer.split(b"retry: ")[1].split(b"\n")[0]) <= 6000, answer
    assert whole(ws).startswith(b"HTTP/1.1 503 ")
    held.close()


def test_per_address_limit_answers_429_and_frees_on_close(start_server):
    server = start_server("--max-connections-per-address", 3)
    held = [rawws.connect(server.clients, "/ws?topic=t")[0] for _ in range(3)]
    status, head, sock = rawws.http(server.clients, upgrade())
    sock.close()
    assert status == 429 and "Retry-After" in head
    # Another address is not affected.
    other = socket.create_connection(("127.0.0.1", server.port), source_address=("127.0.0.2", 0))
    other.sendall(f"GET /sse?topic=t HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert other.recv(100).startswith(b"HTTP/1.1 200")
    other.close()
    held.pop().close()
    refused = 1
    for _ in range(100):
        status, _, sock = rawws.http(server.clients, upgrade())
        sock.close()
        if status == 101:
            break
        # The server may not have seen the close yet: this attempt was refused too.
        assert status == 429
        refused += 1
        time.sleep(0.05)
    assert status == 101, "a closed connection frees its slot"
    assert server.metrics()['clarion_connections_refused_total{reason="address"}'] == refused


def test_handshake_limit_refuses_idle_connects_at_once(start_server):
    server = start_server("--max-handshakes", 2)
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    for _ in range(50):
        if server.metrics()['clarion_connections{transport="http"}'] == 2:
            break
        time.sleep(0.02)
    third = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    # Answered without sending anything: the request is never read.
    assert third.recv(200).startswith(b"HTTP/1.1 503")
    assert server.metrics()['clarion_connections_refused_total{reason="handshakes"}'] == 1
    # A connection that upgrades stops counting as a handshake.
    for s in idle:
        s.close()
    for _ in range(50):
        if server.metrics()['clarion_connections{transport="http"}'] == 0:
            break
        time.sleep(0.02)
    ws, head, _ = rawws.connect(server.clients, "/ws?topic=t")
    assert head.startswith("HTTP/1.1 101")
    extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    extra.sendall(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
    assert extra.recv(200).startswith(b"HTTP/1.1 404"), "the upgraded one no longer counts"
    extra.close()
    ws.close()
