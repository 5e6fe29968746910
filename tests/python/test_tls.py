"""TLS on the client listener (and the API): real clients over wss:// and https:// with the
certificate `clarion cert --dev` makes, failed handshakes ending cleanly with a counted reason,
SNI, and certificates reloaded while connections stay up."""

import asyncio
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time

import httpx
import pytest
import websockets

from conftest import _binary


def make_dev_cert(directory, *names):
    args = [_binary(), "cert", "--dev", "--dir", str(directory)]
    for n in names:
        args += ["--name", n]
    subprocess.run(args, check=True, capture_output=True)
    return {k: str(directory / f"{k}.pem") for k in ("ca", "cert", "key")}


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    return make_dev_cert(tmp_path_factory.mktemp("tls"))


def tls_args(dev, *extra):
    return ["--tls-listen", "127.0.0.1:0", "--tls-cert", dev["cert"], "--tls-key", dev["key"], *extra]


def client_context(ca):
    return ssl.create_default_context(cafile=ca)


def peer_cert(addr, ca, server_name="localhost"):
    """The DER certificate the server presents to a new connection for `server_name`."""
    host, port = addr.rsplit(":", 1)
    ctx = client_context(ca)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_name) as s:
            return s.getpeercert(binary_form=True)


def wait_closed(sock, within):
    """True if the server closes `sock` within `within` seconds."""
    sock.settimeout(within)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def openssl(addr, *args, stdin=b""):
    return subprocess.run(
        ["openssl", "s_client", "-connect", addr, *args],
        input=stdin,
        capture_output=True,
        timeout=20,
    )


@pytest.mark.parametrize("version", ["1.3", "1.2"])
def test_websockets_over_wss_get_every_message_in_order(start_server, dev, version):
    # TLS 1.3 connections run on Clarion's own record layer after the handshake; TLS 1.2 ones
    # stay with rustls: both must carry the same traffic.
    s = start_server(*tls_args(dev))
    big = "x" * 100_000
    ctx = client_context(dev["ca"])
    if version == "1.2":
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2

    async def run():
        url = f"wss://localhost:{s.tls.rsplit(':', 1)[1]}/ws?topic=t"
        async with websockets.connect(url, ssl=ctx, max_size=None) as ws:
            assert ws.transport.get_extra_info("ssl_object").version() == f"TLSv{version}"
            s.publish("t", big)
            for i in range(200):
                s.publish("t", f"m{i}")
            assert await ws.recv() == big
            got = [await asyncio.wait_for(ws.recv(), 5) for _ in range(200)]
            assert got == [f"m{i}" for i in range(200)]
            # In-band control messages work over TLS too.
            await ws.send(json.dumps({"type": "subscribe", "topic": "u"}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert reply == {"type": "subscribed", "topic": "u"}

    asyncio.run(run())
    m = s.metrics()
    assert m["clarion_tls_handshakes_total"] >= 1


def test_a_burst_larger_than_socket_buffers_arrives_intact(start_server, dev):
    # The backlog path: frames queue as shared plaintext and are encrypted as the socket drains.
    s = start_server(*tls_args(dev, "--max-backlog", str(32 << 20)))
    n, size = 400, 20_000

    async def run():
        url = f"wss://localhost:{s.tls.rsplit(':', 1)[1]}/ws?topic=b"
        async with websockets.connect(url, ssl=client_context(dev["ca"]), max_size=None) as ws:
            for first in range(0, n, 40):  # batches under max_publish_size
                batch = {
                    "messages": [
                        {"topic": "b", "data": f"{i:05d}" + "y" * size} for i in range(first, first + 40)
                    ]
                }
                status, _, body = s.request(
                    "POST", "/publish", json.dumps(batch).encode(), {"Content-Type": "application/json"}
                )
                assert status == 200, body
            await asyncio.sleep(0.5)  # let the server's socket buffers fill before reading
            for i in range(n):
                m = await asyncio.wait_for(ws.recv(), 10)
                assert m[:5] == f"{i:05d}" and len(m) == size + 5

    asyncio.run(run())


def test_a_fan_out_to_secure_subscribers_written_together_arrives_intact(start_server, dev):
    # A message to several TLS subscribers is sealed for each and written in one submission
    # (io_uring, the default); a socket that takes part of its records keeps the rest for its
    # writable event. Nobody reads while the messages are published (the client's event loop
    # waits on each publish, and the receive buffers are small), so each socket takes part of
    # one of the first messages and the rest of the run waits; then each subscriber, TLS 1.3
    # and 1.2, must get every message whole and in order.
    s = start_server(*tls_args(dev, "--max-backlog", str(32 << 20)))
    n, size = 100, 100_000

    host, port = s.tls.rsplit(":", 1)

    def small_window():
        # A small receive buffer (set before connecting), so that the server's socket fills.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.connect((host, int(port)))
        return sock

    async def run():
        url = f"wss://localhost:{port}/ws?topic=f"
        contexts = [client_context(dev["ca"]) for _ in range(4)]
        contexts[3].maximum_version = ssl.TLSVersion.TLSv1_2
        subs = [
            await websockets.connect(
                url, ssl=c, sock=small_window(), server_hostname="localhost", max_size=None,
                compression=None,  # the frames as large as the messages
            )
            for c in contexts
        ]
        try:
            for i in range(n):
                s.publish("f", f"{i:05d}" + "z" * size)
                time.sleep(0.01)  # one message per fan-out
            for ws in subs:
                for i in range(n):
                    m = await asyncio.wait_for(ws.recv(), 10)
                    assert m[:5] == f"{i:05d}" and len(m) == size + 5
        finally:
            for ws in subs:
                await ws.close()

    asyncio.run(run())
    assert s.metrics()['clarion_closes_total{reason="slow_consumer"}'] == 0


def test_sse_long_poll_and_stream_over_https(start_server, dev):
    s = start_server(*tls_args(dev))
    port = s.tls.rsplit(":", 1)[1]
    # curl --cacert, as a user would try it.
    curl = subprocess.Popen(
        ["curl", "-sS", "-N", "--cacert", dev["ca"], "--max-time", "4", f"https://localhost:{port}/sse?topic=e"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.7)
    epoch = s.publish("e", "over https")["id"].split("-")[0]
    out, _ = curl.communicate(timeout=10)
    assert b"data: over https\n" in out
    assert b"id: " in out

    ctx = client_context(dev["ca"])
    with httpx.Client(verify=ctx, timeout=10) as c:
        r = c.get(f"https://localhost:{port}/poll?topic=e&since={epoch}-0&timeout=0")
        assert r.status_code == 200
        assert [m["data"] for m in r.json()["messages"]] == ["over https"]
        with c.stream("GET", f"https://localhost:{port}/stream?topic=e&since={epoch}-0") as r:
            line = next(r.iter_lines())
            assert json.loads(line)["data"] == "over https"


def test_openssl_negotiates_tls13_with_aes128_gcm_and_tls12(start_server, dev):
    s = start_server(*tls_args(dev))
    r = openssl(s.tls, "-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256", "-CAfile", dev["ca"],
                "-servername", "localhost", "-alpn", "http/1.1")
    text = r.stdout.decode()
    assert "TLSv1.3" in text and "TLS_AES_128_GCM_SHA256" in text, text
    assert "Verify return code: 0 (ok)" in text
    assert "ALPN protocol: http/1.1" in text
    r = openssl(s.tls, "-tls1_2", "-CAfile", dev["ca"], "-servername", "localhost")
    text = r.stdout.decode()
    assert "TLSv1.2" in text and "ECDHE-ECDSA" in text, text
    # No shared cipher suite: a TLS 1.2 client offering only RSA key exchange with CBC.
    r = openssl(s.tls, "-tls1_2", "-cipher", "AES128-SHA", "-CAfile", dev["ca"])
    assert r.returncode != 0
    assert b"handshake failure" in r.stderr or b"alert" in r.stderr, r.stderr
    time.sleep(0.2)
    assert s.metrics()['clarion_tls_handshake_failures_total{reason="incompatible"}'] == 1


def test_failed_handshakes_end_cleanly_with_a_counted_reason(start_server, dev):
    s = start_server(*tls_args(dev, "--tls-min-version", "1.3", "--handshake-timeout", "1"))
    # No shared version.
    r = openssl(s.tls, "-tls1_2", "-CAfile", dev["ca"])
    assert "TLSv1.2" not in r.stdout.decode().split("---")[-1] or r.returncode != 0
    # A client that rejects the certificate (no CA given) aborts with an alert.
    r = openssl(s.tls, "-tls1_3", "-verify_return_error")
    assert r.returncode != 0
    # Plain HTTP on the TLS port gets a readable 400.
    with socket.create_connection(("127.0.0.1", int(s.tls.rsplit(":", 1)[1])), timeout=5) as c:
        c.sendall(b"GET /sse?topic=x HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := c.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert b"https://" in answer
    # A client that stalls mid-handshake (half a ClientHello), and one that sends nothing.
    stalled = socket.create_connection(("127.0.0.1", int(s.tls.rsplit(":", 1)[1])))
    stalled.sendall(bytes([22, 3, 1, 0x02, 0x00, 1, 0, 1, 0xFC, 3, 3]))
    silent = socket.create_connection(("127.0.0.1", int(s.tls.rsplit(":", 1)[1])))
    assert wait_closed(stalled, 5), "a stalled handshake must be closed"
    assert wait_closed(silent, 5), "a silent connection must be closed"
    # Garbage that is not TLS at all.
    with socket.create_connection(("127.0.0.1", int(s.tls.rsplit(":", 1)[1])), timeout=5) as g:
        g.sendall(bytes(range(256)) * 4)
        assert wait_closed(g, 5)
    time.sleep(0.3)
    m = s.metrics()
    fails = lambda r: m[f'clarion_tls_handshake_failures_total{{reason="{r}"}}']
    assert fails("incompatible") >= 1
    assert fails("alert") >= 1
    assert fails("plaintext") == 1
    assert fails("timeout") >= 2
    assert fails("protocol") >= 1
    assert m["clarion_tls_connections"] == 0
    # The server is fine: a proper client still connects.
    assert peer_cert(s.tls, dev["ca"])


def test_sni_chooses_the_certificate_and_strict_mode_refuses_unknown_names(start_server, dev, tmp_path):
    other = make_dev_cert(tmp_path / "other", "other.test")
    config = tmp_path / "clarion.toml"
    config.write_text(
        f'tls_certificates = [{{ cert = "{other["cert"]}", key = "{other["key"]}" }}]\n'
        "tls_strict_sni = true\n"
    )
    s = start_server("--config", config, *tls_args(dev))
    default_cert = peer_cert(s.tls, dev["ca"], "localhost")
    other_cert = peer_cert(s.tls, other["ca"], "other.test")
    assert default_cert != other_cert
    with pytest.raises(ssl.SSLError):
        peer_cert(s.tls, dev["ca"], "unknown.test")
    time.sleep(0.2)
    assert s.metrics()['clarion_tls_handshake_failures_total{reason="sni"}'] == 1


def test_certificates_reload_on_sighup_and_on_change_without_dropping_connections(start_server, dev, tmp_path):
    live = {k: str(tmp_path / f"live-{k}.pem") for k in ("cert", "key")}
    shutil.copy(dev["cert"], live["cert"])
    shutil.copy(dev["key"], live["key"])
    s = start_server("--tls-listen", "127.0.0.1:0", "--tls-cert", live["cert"], "--tls-key", live["key"],
                     "--tls-reload-interval", "1")
    url = f"wss://localhost:{s.tls.rsplit(':', 1)[1]}/ws?topic=r"

    def swap(to):
        shutil.copy(to["cert"], live["cert"])
        shutil.copy(to["key"], live["key"])

    async def served_within(seconds, ca):
        """Whether new handshakes present the certificate `ca` signed, within `seconds`."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                return bool(peer_cert(s.tls, ca))
            except ssl.SSLError:
                await asyncio.sleep(0.2)
        return False

    async def run():
        async with websockets.connect(url, ssl=client_context(dev["ca"])) as ws:
            # SIGHUP: new handshakes get the new certificate.
            second = make_dev_cert(tmp_path / "second")
            swap(second)
            s.proc.send_signal(signal.SIGHUP)
            assert await served_within(5, second["ca"]), "SIGHUP did not load the new certificate"
            # A changed file alone (no signal) is noticed too.
            third = make_dev_cert(tmp_path / "third")
            time.sleep(1.1)  # a distinct modification time
            swap(third)
            assert await served_within(8, third["ca"]), "a changed certificate file was not reloaded"
            # A broken file keeps the current certificate.
            (tmp_path / "live-cert.pem").write_text("garbage")
            s.proc.send_signal(signal.SIGHUP)
            await asyncio.sleep(1.5)
            assert peer_cert(s.tls, third["ca"])
            # The first connection, made with the first certificate, never noticed.
            s.publish("r", "still here")
            assert await asyncio.wait_for(ws.recv(), 5) == "still here"

    asyncio.run(run())
    code, err = s.stop()
    assert "reload" in err and "keeping the previous certificates" in err


def test_the_api_can_be_served_over_tls(start_server, dev):
    s = start_server(*tls_args(dev, "--tls-api"))
    s.api_scheme = "https"
    s.api_context = client_context(dev["ca"])
    host, port = s.api.rsplit(":", 1)
    s.api = f"localhost:{port}"
    assert s.publish("a", "secure publish")["subscribers"] == 0
    status, _, _ = s.request("GET", "/healthz")
    assert status == 200


def run_publish(*args, env=None, timeout=60):
    """`clarion publish ARGS` with only the given CLARION_* variables: (exit code, stdout and
    stderr, seconds)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    full_env.update(env or {})
    started = time.monotonic()
    p = subprocess.run(
        [_binary(), "publish", *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )
    return p.returncode, p.stdout + p.stderr, time.monotonic() - started


def test_clarion_publish_reaches_a_tls_api_with_the_dev_ca(start_server, dev):
    s = start_server(*tls_args(dev, "--tls-api"))
    port = s.api.rsplit(":", 1)[1]
    # --cacert, CLARION_CACERT, and the system bundle (SSL_CERT_FILE standing in for it).
    for i, (args, env) in enumerate(
        [
            (["--cacert", dev["ca"]], {}),
            ([], {"CLARION_CACERT": dev["ca"]}),
            ([], {"SSL_CERT_FILE": dev["ca"]}),
        ]
    ):
        code, out, _ = run_publish(
            "--api", f"https://localhost:{port}", *args, "news", f"over tls {i}", env=env
        )
        assert code == 0, out
        assert json.loads(out.splitlines()[0])["id"], out
    # An https:// API whose CA is not trusted: the certificate is refused, and the hint names --cacert.
    code, out, took = run_publish("--api", f"https://localhost:{port}", "news", "x")
    assert code != 0 and "--cacert" in out, out
    # A plain request to the TLS API fails fast and says to use https://.
    for api in (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}"):
        code, out, took = run_publish("--api", api, "news", "plain")
        assert code != 0 and took < 10, (took, out)
        assert "speaks TLS" in out and "https://" in out and "--cacert" in out, out


def test_every_tls_listener_answers_plain_http_with_400_in_plain_text(start_server, dev):
    s = start_server(*tls_args(dev, "--tls-api"))
    answers = []
    for addr in (s.tls, s.api):
        host, port = addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            got = b""
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                got += chunk
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), got
        answers.append(body)
    assert answers[0] == answers[1] == b"this port speaks TLS: use https:// or wss://\n"
    # curl sees an HTTP answer, not "Received HTTP/0.9".
    if shutil.which("curl"):
        p = subprocess.run(
            ["curl", "-sS", "-o", "-", "-w", "%{http_code}", f"http://{s.api}/healthz"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert p.stdout.endswith("400") and "speaks TLS" in p.stdout, (p.stdout, p.stderr)


def test_a_bad_record_sent_with_the_client_finished_counts_as_a_tls_error(start_server, dev):
    """A TLS 1.3 client whose Finished arrives in one write with a record that does not decrypt:
    the handshake completed, so the failure is the record layer's (`clarion_tls_errors_total`),
    not a handshake failure."""
    s = start_server(*tls_args(dev))
    ctx = client_context(dev["ca"])
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with socket.create_connection(("127.0.0.1", int(s.tls.rsplit(":", 1)[1])), timeout=5) as c:
        for _ in range(20):
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                c.sendall(outgoing.read())
                incoming.write(c.recv(65536))
        # The client's Finished is still in `outgoing`: a bad application-data record joins it.
        c.sendall(outgoing.read() + bytes([23, 3, 3, 0, 32]) + bytes(32))
        assert wait_closed(c, 5)
    time.sleep(0.3)
    m = s.metrics()
    failures = {k: v for k, v in m.items() if k.startswith("clarion_tls_handshake_failures_total")}
    assert m["clarion_tls_errors_total"] == 1, m["clarion_tls_errors_total"]
    assert sum(failures.values()) == 0, failures
    assert m["clarion_tls_handshakes_total"] == 1
