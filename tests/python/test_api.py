"""The publish API, health and metrics on the API listener."""

import base64
import json
import socket
import time

import pytest
import websockets.sync.client

import rawws
from conftest import dashboard_stats, seq


def test_healthz(server):
    status, _, body = server.request("GET", "/healthz")
    assert (status, body.strip()) == (200, b"ok")


def test_metrics_are_prometheus_text(server):
    status, headers, body = server.request("GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    text = body.decode()
    for name in [
        "clarion_connections",
        "clarion_subscriptions",
        "clarion_topics",
        "clarion_messages_published_total",
        "clarion_messages_delivered_total",
        "clarion_bytes_in_total",
        "clarion_bytes_out_total",
        "clarion_closes_total",
        "clarion_slow_consumers_total",
        "clarion_process_rss_bytes",
        "clarion_rss_bytes_per_connection",
    ]:
        assert f"# TYPE {name} " in text, name


def test_publish_single_and_batch_in_order(server):
    sock, head, rest = rawws.connect(server.clients, "/ws?topic=a&topic=b")
    reader = rawws.Reader(sock, rest)
    first = server.publish("a", "one")
    batch = {
        "messages": [
            {"topic": "b", "data": "two"},
            {"topic": "a", "data": base64.b64encode(b"\x03").decode(), "encoding": "base64"},
            {"topic": "nobody", "data": "lost"},
        ]
    }
    status, _, body = server.request(
        "POST", "/publish", json.dumps(batch).encode(), {"Content-Type": "application/json"}
    )
    assert status == 200, body
    results = json.loads(body)["results"]
    assert [r["subscribers"] for r in results] == [1, 1, 0]
    ids = [seq(first["id"])] + [seq(r["id"]) for r in results]
    assert len({i["id"].split("-")[0] for i in [first, *results]}) == 1, "one epoch"
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert reader.frame() == (True, 1, b"one")
    assert reader.frame() == (True, 1, b"two")
    assert reader.frame() == (True, 2, b"\x03")


@pytest.mark.parametrize("body", [b"not json", b'{"messages":{}}', b'{"items":[]}'])
def test_a_body_that_is_not_a_batch_is_refused_whole(server, body):
    status, _, out = server.request("POST", "/publish", body, {"Content-Type": "application/json"})
    assert status == 400 and json.loads(out)["error"].startswith("invalid batch"), out
    assert server.metrics()["clarion_messages_published_total"] == 0


@pytest.mark.parametrize(
    "body, published",
    [
        (b'{"messages":[{"topic":"ok","data":"x"},{"topic":"bad topic","data":"x"}]}', 1),
        (b'{"messages":[{"topic":"ok","data":"y"},{"topic":"ok","data":"%%%","encoding":"base64"}]}', 0),
        (b'{"messages":[{"topic":"ok","data":"x","encoding":"rot13"}]}', 0),
    ],
)
def test_bad_messages_of_a_batch_are_answered_in_place(server, body, published):
    status, _, out = server.request("POST", "/publish", body, {"Content-Type": "application/json"})
    assert status == 200, out
    results = json.loads(out)["results"]
    assert results[-1]["status"] == 400 and results[-1]["error"], results
    assert server.metrics()["clarion_messages_published_total"] == published


def test_publish_errors(start_server):
    server = start_server("--max-publish-size", 100)
    assert server.request("POST", "/publish/bad%20topic", b"x")[0] == 400
    assert server.request("POST", "/publish/t", b"\xff", {"Content-Type": "text/plain"})[0] == 400
    assert server.request("POST", "/publish/t", b"x" * 101)[0] == 413
    assert server.request("GET", "/publish/t")[0] == 405
    assert server.request("GET", "/nothing")[0] == 404


def test_topics_in_the_api_path_are_percent_decoded_as_on_the_client_listener(server):
    # One decoder for both listeners: the API quotes the topic as the client listener does.
    status, _, body = server.request("POST", "/publish/bad%20topic", b"x")
    api_error = json.loads(body)["error"]
    assert status == 400 and api_error.startswith('invalid topic "bad topic": '), api_error
    raw = b"GET /sse?topic=bad%20topic HTTP/1.1\r\nHost: x\r\n\r\n"
    host, port = server.clients.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        head, rest = rawws.read_head(sock)
    assert head.startswith("HTTP/1.1 400 ") and api_error.encode() in rest, (head, rest)
    # An escaped valid topic is the topic itself.
    with websockets.sync.client.connect(f"ws://{server.clients}/ws?topic=news/eu") as ws:
        assert server.publish("news%2Feu", "decoded")["topic"] == "news/eu"
        assert ws.recv(timeout=10) == "decoded"
    status, _, body = server.request("POST", "/publish/t%zz", b"x")
    assert status == 400 and b"invalid percent escape in the path" in body, body


def test_every_api_answer_ends_with_a_newline(server):
    # curl prints the body as is: without a final newline the shell prompt runs into it.
    batch = json.dumps({"messages": [{"topic": "a", "data": "x"}]}).encode()
    for method, path, body in [
        ("POST", "/publish/news", b"x"),
        ("POST", "/publish", batch),
        ("POST", "/publish/bad%20topic", b"x"),
        ("GET", "/publish/news", None),
        ("GET", "/healthz", None),
        ("GET", "/metrics", None),
        ("GET", "/nowhere", None),
    ]:
        _, _, out = server.request(method, path, body)
        assert out.endswith(b"\n"), (method, path, out)


def test_chunked_body_and_expect_continue(server):
    host, port = server.api.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(
        b"POST /publish/c HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        b"Expect: 100-continue\r\n\r\n"
    )
    head, _ = rawws.read_head(sock)
    assert head.startswith("HTTP/1.1 100")
    sock.sendall(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    head, body = rawws.read_head(sock)
    assert head.startswith("HTTP/1.1 200"), head
    assert server.metrics()["clarion_messages_published_total"] == 1


def test_api_key(start_server):
    server = start_server("--api-key", "s3cret")
    assert server.request("POST", "/publish/t", b"x")[0] == 401
    assert server.request("POST", "/publish/t", b"x", {"Authorization": "Bearer wrong"})[0] == 401
    assert server.request("POST", "/publish/t", b"x", {"Authorization": "Bearer s3cret"})[0] == 200
    # Health checks stay open to probes.
    assert server.request("GET", "/healthz")[0] == 200


def test_metrics_auth_puts_metrics_behind_the_key_or_an_admin_token(start_server):
    import jwt

    secret = "metrics-auth-secret-of-32-bytes!!"
    open_server = start_server("--api-key", "k")
    assert open_server.request("GET", "/metrics")[0] == 200
    s = start_server("--api-key", "k", "--metrics-auth", "--auth-secret", secret)
    status, _, body = s.request("GET", "/metrics")
    assert status == 401 and b"metrics_auth" in body, body
    assert s.request("GET", "/metrics", headers={"Authorization": "Bearer wrong"})[0] == 401
    assert s.request("GET", "/metrics", headers={"Authorization": "Bearer k"})[0] == 200
    exp = int(time.time()) + 60
    admin = jwt.encode({"exp": exp, "clarion": {"admin": True}}, secret)
    user = jwt.encode({"exp": exp, "clarion": {"subscribe": ["*"]}}, secret)
    assert s.request("GET", "/metrics", headers={"Authorization": f"Bearer {admin}"})[0] == 200
    assert s.request("GET", "/metrics", headers={"Authorization": f"Bearer {user}"})[0] == 401
    # /healthz stays open for load balancers.
    assert s.request("GET", "/healthz")[0] == 200


def _timed(server, method, path, body=None, headers=None):
    """(status, seconds) of one API request on a fresh connection from 127.0.0.1."""
    started = time.monotonic()
    status, _, _ = server.request(method, path, body, headers)
    return status, time.monotonic() - started


def test_a_slowloris_on_the_api_does_not_stop_publishing_or_health_checks(start_server):
    """300 connections from five addresses each send half a request head and then a byte every
    2 s, more than the pool holds: a publisher with the key and a health checker still get 200
    quickly (the per-address cap and the reserve), and the trickling connections are cut at
    the request deadline (10 s) with 408."""
    key = {"Authorization": "Bearer the-key"}
    s = start_server("--api-key", "the-key")
    host, port = s.api.rsplit(":", 1)
    slow = []
    for i in range(300):
        src = f"127.0.0.{2 + i % 5}"
        c = socket.socket()
        c.bind((src, 0))
        c.settimeout(15)
        try:
            c.connect((host, int(port)))
            c.sendall(b"POST /publish/x HTTP/1.1\r\nHost: a\r\n")
        except OSError:
            c.close()
            continue
        slow.append(c)
    assert len(slow) == 300
    started = time.monotonic()
    worst = 0.0
    try:
        while time.monotonic() - started < 12:
            for c in slow:
                try:
                    c.send(b"X")
                except OSError:
                    pass
            for _ in range(4):
                st, took = _timed(s, "POST", "/publish/news", b"hi", {"Content-Type": "text/plain", **key})
                assert st == 200, st
                worst = max(worst, took)
                st, took = _timed(s, "GET", "/healthz")
                assert st == 200, st
                worst = max(worst, took)
                time.sleep(0.5)
        assert worst < 0.5, worst
        # Without credentials, past the caps, the answer is 503 at once, not a hang.
        st, took = _timed(s, "POST", "/publish/news", b"hi", {"Content-Type": "text/plain"})
        assert st in (401, 503), st
        assert took < 2, took
        # The trickling heads were cut at the deadline with 408 (or their connection closed).
        answered = 0
        for c in slow:
            try:
                data = c.recv(200)
            except OSError:
                data = b""
            if data.startswith(b"HTTP/1.1 408"):
                answered += 1
        assert answered > 200, answered
    finally:
        for c in slow:
            c.close()


def _fill_the_pool(host, port, first_address=2):
    """256 connections (the pool) from four addresses (64 each), each with half a request head:
    every later connection waits in the triage."""
    slow = []
    for i in range(256):
        c = socket.socket()
        c.bind((f"127.0.0.{first_address + i % 4}", 0))
        c.settimeout(15)
        c.connect((host, int(port)))
        c.sendall(b"POST /publish/x HTTP/1.1\r\nHost: localhost\r\n")
        slow.append(c)
    return slow


def test_slow_health_checks_and_one_slow_keyed_address_do_not_starve_keyed_publishers(start_server):
    """With the pool taken, 24 `GET /healthz` that declare `Content-Length: 100` and never send
    it, and 12 keyed publishes from one address that never send their bodies, each reopened as
    soon as it is answered: the health checks are answered from their heads (no thread waits
    for their body), that one address gets at most its share of the reserve, and a keyed
    publisher on another address publishes 75 times, every one 200 within 0.5 s."""
    import select
    import threading

    key = {"Authorization": "Bearer the-key"}
    s = start_server("--api-key", "the-key")
    host, port = s.api.rsplit(":", 1)
    pool = _fill_the_pool(host, port)
    health = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n"
    keyed = (
        b"POST /publish/x HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer the-key\r\n"
        b"Content-Type: text/plain\r\nContent-Length: 100\r\n\r\n"
    )
    stop = threading.Event()
    answers = {"health": [], "keyed": []}

    def attack():
        def opened(src, request):
            c = socket.socket()
            c.bind((src, 0))
            c.setblocking(True)
            c.settimeout(2)
            try:
                c.connect((host, int(port)))
                c.sendall(request)
            except OSError:
                c.close()
                return None
            return c

        kinds = {}
        while not stop.is_set():
            while sum(1 for k in kinds.values() if k == "health") < 24 and not stop.is_set():
                c = opened("127.0.0.6", health)
                if c is not None:
                    kinds[c] = "health"
            while sum(1 for k in kinds.values() if k == "keyed") < 12 and not stop.is_set():
                c = opened("127.0.0.7", keyed)
                if c is not None:
                    kinds[c] = "keyed"
            ready, _, _ = select.select(list(kinds), [], [], 0.05)
            for c in ready:
                try:
                    data = c.recv(4096)
                except OSError:
                    data = b""
                answers[kinds.pop(c)].append(data)
                c.close()
            time.sleep(0.02)
        for c in kinds:
            c.close()

    attacker = threading.Thread(target=attack)
    attacker.start()
    statuses, worst = [], 0.0
    try:
        time.sleep(1.5)
        for _ in range(75):
            st, took = _timed(s, "POST", "/publish/news", b"hi", {"Content-Type": "text/plain", **key})
            statuses.append(st)
            worst = max(worst, took)
            time.sleep(0.02)
        health_now = _timed(s, "GET", "/healthz")
    finally:
        stop.set()
        attacker.join()
        for c in pool:
            c.close()
    failed = [st for st in statuses if st != 200]
    assert not failed, f"{len(failed)} of 75 keyed publishes failed: {failed[:5]}"
    assert worst < 0.5, worst
    assert health_now[0] == 200 and health_now[1] < 0.5, health_now
    # The slow health checks were answered 200 from their heads, with `Connection: close`.
    assert answers["health"], "no slow health check was answered"
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers["health"]), answers["health"][:3]
    assert all(b"connection: close" in a.lower() for a in answers["health"]), answers["health"][:1]


def test_a_health_check_past_the_caps_is_answered_from_its_head_and_closed(start_server):
    """With the pool taken, `GET /healthz` is answered at once and the connection closed, also
    when it declares a body it never sends, or sends one (read and dropped, no reset); a `POST
    /healthz` gets `405`; a publish without credentials `503`."""
    s = start_server("--api-key", "the-key")
    host, port = s.api.rsplit(":", 1)
    pool = _fill_the_pool(host, port)
    try:
        for request, status in [
            (b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n", b"200"),
            (b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n\r\nabc", b"200"),
            (b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n", b"200"),
            (b"POST /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n", b"405"),
            (b"POST /publish/x HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\nhi", b"503"),
        ]:
            c = socket.create_connection((host, int(port)), timeout=5)
            started = time.monotonic()
            c.sendall(request)
            got = b""
            while True:
                data = c.recv(4096)
                if not data:
                    break
                got += data
            took = time.monotonic() - started
            c.close()
            assert got.startswith(b"HTTP/1.1 " + status), (request, got)
            assert took < 0.5, (request, took)
    finally:
        for c in pool:
            c.close()


def test_a_browser_on_another_site_cannot_publish_or_read_through_a_rebound_name(start_server):
    """CSRF: a page of another origin (its browser sends Origin, Sec-Fetch-Site) may not publish,
    with or without credentials the browser would attach; DNS rebinding: a name that is not the
    API's gets 421 before anything is read or published."""
    key = {"Authorization": "Bearer the-key"}
    text = {"Content-Type": "text/plain"}
    s = start_server("--api-key", "the-key", "--allowed-origins", "https://app.example")
    own = f"http://{s.api}"
    cases = [
        ({"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, 403),
        ({"Origin": "http://localhost:1", "Sec-Fetch-Site": "same-site"}, 403),
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"Origin": "null"}, 403),
        ({"Origin": own, "Sec-Fetch-Site": "same-origin"}, 200),  # the dashboard's own page
        ({"Origin": "https://app.example", "Sec-Fetch-Site": "cross-site"}, 200),  # allowed
        ({}, 200),  # not a browser: a backend, curl
    ]
    for headers, want in cases:
        status, _, body = s.request("POST", "/publish/news", b"x", {**text, **key, **headers})
        assert status == want, (headers, status, body)
        if want == 403:
            assert b"allowed_origins" in body
    # A rebound name: refused whatever the method, with or without the key.
    for method, path in [("GET", "/topics/news"), ("POST", "/publish/news"), ("GET", "/healthz")]:
        status, _, body = s.request(method, path, b"x" if method == "POST" else None,
                                    {**text, **key, "Host": "rebound.evil.example"})
        assert status == 421, (path, status, body)
    for name in ["localhost", "127.0.0.1", "[::1]"]:
        port = s.api.rsplit(":", 1)[1]
        status, _, _ = s.request("GET", "/healthz", None, {"Host": f"{name}:{port}"})
        assert status == 200, name
    # api_hosts adds names.
    t = start_server("--api-hosts", "clarion.internal")
    assert t.request("GET", "/healthz", None, {"Host": "clarion.internal:8081"})[0] == 200
    assert t.request("GET", "/healthz", None, {"Host": "other.internal"})[0] == 421
    assert s.metrics()['clarion_auth_failures_total{reason="origin"}'] >= 4


def test_a_fresh_dashboard_feed_lists_the_busiest_topics_in_its_first_sample(server):
    with websockets.sync.client.connect(f"ws://{server.clients}/ws?topic=lively") as ws:
        server.publish("lively", "x")
        ws.recv(timeout=10)
        # The sampler has been running without a feed open: its latest sample has no topics.
        time.sleep(1.5)
        started = time.monotonic()
        [first] = dashboard_stats(server.api)
        assert time.monotonic() - started < 1.5
        assert isinstance(first["top_topics"], list), first["top_topics"]
        assert [t["topic"] for t in first["top_topics"]] == ["lively"]
        assert first["top_topics"][0]["subscribers"] == 1
        # Which server the figures are of, said plainly.
        assert first["scope"].startswith("one process (") and "no broker" in first["scope"]


def test_the_api_root_names_its_endpoints_and_what_publishing_needs(start_server):
    """Issue 54: `GET /` said "not found" with no pointer."""
    s = start_server()
    status, headers, body = s.request("GET", "/")
    text = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain"), text
    for word in ("POST /publish/TOPIC", "/healthz", "/metrics", "/dashboard", "client listener", "GET  /topics "):
        assert word in text, (word, text)
    assert "Publishing needs nothing: it is open (no api_key is set)." in text, text
    keyed = start_server("--api-key", "k3y-not-shown", "--auth-secret",
                         "an-hs256-secret-that-is-long-enough-0123")
    _, _, body = keyed.request("GET", "/")
    text = body.decode()
    assert "the API key, or a token" in text and "k3y-not-shown" not in text, text
    assert keyed.request("POST", "/")[0] == 405
