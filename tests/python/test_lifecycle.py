"""Startup configuration, the `clarion publish` command and graceful shutdown."""

import asyncio
import os
import signal
import subprocess

import pytest
from websockets.asyncio.client import connect

import rawws
from conftest import _binary


def test_sigterm_closes_clients_with_1001_and_exits_0(server):
    socks = [rawws.connect(server.clients, "/ws?topic=t") for _ in range(5)]
    code, stderr = server.stop(signal.SIGTERM)
    for sock, _, rest in socks:
        assert rawws.Reader(sock, rest).close_code() == (1001, "server shutting down")
    assert code == 0, stderr


def test_sigusr2_restarts_with_1012_spread_over_the_drain_period(start_server):
    # A restart tells clients to come back (1012 "service restart"; SSE streams a retry: of
    # 1 to 3 s), a slice at a time over drain_period, so their reconnections arrive as a
    # steady stream; then the process exits 0.
    import socket
    import threading
    import time

    server = start_server("--drain-period", 2, "--shutdown-timeout", 5)
    socks = [rawws.connect(server.clients, "/ws?topic=t") for _ in range(40)]
    host, port = server.clients.rsplit(":", 1)
    sse = socket.create_connection((host, int(port)), timeout=10)
    sse.sendall(b"GET /sse?topic=t HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sse.recv(4096).startswith(b"HTTP/1.1 200 ")
    closes = []

    def read(sock, rest):
        code = rawws.Reader(sock, rest).close_code()
        closes.append((time.monotonic(), code))

    readers = [threading.Thread(target=read, args=(s, r)) for s, _, r in socks]
    for t in readers:
        t.start()
    began = time.monotonic()
    server.proc.send_signal(signal.SIGUSR2)
    for t in readers:
        t.join(timeout=15)
    assert {code for _, code in closes} == {(1012, "service restart")}
    assert len(closes) == 40
    times = sorted(t - began for t, _ in closes)
    # Spread over the 2 s: the first slice at once, the last near the end, none all together.
    assert times[0] < 0.5 and times[-1] > 1.4, times
    assert sum(1 for t in times if t < 1.0) < 35, times
    tail = b""
    while chunk := sse.recv(4096):
        tail += chunk
    retry = int(tail.split(b"retry: ")[1].split(b"\n")[0])
    assert 1000 <= retry <= 3000, tail
    code, stderr = server.stop(signal.SIGTERM, timeout=15)
    assert code == 0, stderr
    assert "restart: closing connections with 1012 over 2 s" in stderr


def test_sigint_with_a_client_that_never_answers_respects_the_deadline(start_server):
    server = start_server("--shutdown-timeout", 1)
    sock, _, _ = rawws.connect(server.clients, "/ws?topic=t")
    code, _ = server.stop(signal.SIGINT, timeout=10)
    assert code == 0


def test_new_connections_are_refused_during_shutdown(start_server):
    server = start_server("--shutdown-timeout", 2)
    sock, _, rest = rawws.connect(server.clients, "/ws?topic=t")
    server.proc.send_signal(signal.SIGTERM)
    # This client never answers the close, so the server lingers until its deadline; during
    # that window the listener is already closed.
    assert rawws.Reader(sock, rest).close_code()[0] == 1001
    assert server.proc.poll() is None
    # Refused, or reset if the connection landed in the queue of another worker's listener in
    # the instant before that worker closed it: either way, never served.
    with pytest.raises((ConnectionRefusedError, ConnectionResetError)):
        rawws.connect(server.clients, "/ws", timeout=1)
    assert server.proc.wait(timeout=10) == 0


def test_cli_publish(server):
    async def main():
        async with connect(server.ws_url(topics=["cli"])) as ws:
            env = {**os.environ, "CLARION_API": f"http://{server.api}"}
            out = await asyncio.to_thread(
                subprocess.run,
                [_binary(), "publish", "cli", "from the command line"],
                capture_output=True, text=True, env=env, timeout=10,
            )
            assert out.returncode == 0, out.stderr
            assert '"subscribers":1' in out.stdout
            assert await ws.recv() == "from the command line"
            out = await asyncio.to_thread(
                subprocess.run,
                [_binary(), "publish", "--api", f"http://{server.api}", "--binary", "cli"],
                input=b"\x00\x01", capture_output=True, env=env, timeout=10,
            )
            assert out.returncode == 0, out.stderr
            assert await ws.recv() == b"\x00\x01"

    asyncio.run(main())


def test_cli_publish_fails_on_errors(server):
    out = subprocess.run(
        [_binary(), "publish", "--api", f"http://{server.api}", "bad topic", "x"],
        capture_output=True, text=True, timeout=10,
    )
    assert out.returncode != 0
    assert "400" in out.stderr or "topic" in out.stderr


def test_config_file_and_env_and_flags(start_server, tmp_path):
    cfg = tmp_path / "clarion.toml"
    cfg.write_text('ws_path = "/live"\nmax_subscriptions = 1\n')
    server = start_server("--config", cfg, env={"CLARION_MAX_SUBSCRIPTIONS": "3"})

    async def main():
        async with connect(f"ws://{server.clients}/live?topic=a&topic=b&topic=c"):
            pass
        with pytest.raises(Exception) as info:
            await connect(f"ws://{server.clients}/live?topic=a&topic=b&topic=c&topic=d")
        assert "400" in str(info.value)
        with pytest.raises(Exception):
            await connect(f"ws://{server.clients}/ws?topic=a")

    asyncio.run(main())


@pytest.mark.parametrize(
    "args, env, needle",
    [
        (["--max-backlog", "nope"], {}, "max-backlog"),
        (["--ping-interval", "30", "--idle-timeout", "10"], {}, "ping"),
        ([], {"CLARION_WORKERS": "many"}, "WORKERS"),
        (["--ws-path", "no-slash"], {}, "ws_path"),
    ],
)
def test_invalid_configuration_stops_startup_with_a_named_setting(args, env, needle):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    full_env.update(env)
    out = subprocess.run(
        [_binary(), "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", *args],
        capture_output=True, text=True, env=full_env, timeout=10,
    )
    assert out.returncode != 0
    assert needle.lower() in out.stderr.lower(), out.stderr


def test_unknown_config_key_is_an_error(tmp_path):
    cfg = tmp_path / "clarion.toml"
    cfg.write_text("max_bakclog = 5\n")
    out = subprocess.run(
        [_binary(), "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=10
    )
    assert out.returncode != 0
    assert "max_bakclog" in out.stderr
