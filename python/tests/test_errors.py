"""The clients' error mapping against a real server: every status the publish API answers
becomes its exception, and transport failures are typed too."""

import asyncio
import base64
import hashlib
import hmac
import json
import socket
import time

import httpx
import pytest

import clarion
from clarion_client.client import _check
from clarion.testing import ClarionServer, ServerStartError

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def keyed():
    with ClarionServer(["--api-key", KEY, "--max-publish-size", "1024"]) as server:
        yield server


def hs256(key, claims):
    def b64(raw):
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims).encode())
    sig = hmac.new(key.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(sig)}"


def test_api_key_and_jwt_bearer(keyed):
    with keyed.client() as c:  # the helper passes the server's --api-key
        assert c.publish("k", "ok").topic == "k"
    token = hs256(KEY, {"exp": int(time.time()) + 60})
    with clarion.Client(keyed.api_url, token=token) as c:
        assert c.publish("k", "ok").topic == "k"
    with clarion.Client(keyed.api_url, token=lambda: hs256(KEY, {"exp": int(time.time()) + 60})) as c:
        assert len(c.publish_batch([("k", "a"), ("k", "b")])) == 2
    with pytest.raises(ValueError):
        clarion.Client(keyed.api_url, api_key=KEY, token=token)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"api_key": "wrong"},
        {"token": hs256("other-key", {"exp": 2**40})},
        {"token": hs256(KEY, {"exp": 1})},  # expired
    ],
)
def test_unauthorized(keyed, kwargs):
    with clarion.Client(keyed.api_url, **kwargs) as c:
        with pytest.raises(clarion.Unauthorized) as e:
            c.publish("k", "x")
    assert e.value.status == 401 and "expected the API key (api_key)" in e.value.message


def test_bad_requests(keyed):
    with keyed.client() as c:
        for call in (
            lambda: c.publish("bad topic", "x"),
            lambda: c.publish("t", "x", event="no spaces"),
            lambda: c.publish("", "x"),
            lambda: c.publish_batch([("ok", "x"), ("not ok!", "y")]),
        ):
            with pytest.raises(clarion.BadRequest) as e:
                call()
            assert e.value.status == 400 and e.value.message
        assert "invalid topic" in str(pytest.raises(clarion.BadRequest, c.publish, "a b", "x").value)


def test_a_batch_with_a_refused_message_publishes_the_other_topics_and_says_which(keyed):
    with keyed.client() as c:
        with pytest.raises(clarion.BatchPartlyRefused) as e:
            c.publish_batch([("ok", "x"), ("not ok!", "y"), ("ok", "z")])
    results = e.value.results
    assert [type(r) for r in results] == [clarion.Receipt, dict, clarion.Receipt], results
    assert results[1]["status"] == 400 and "invalid topic" in results[1]["error"]
    assert e.value.status == 400 and "messages[1]" in e.value.message


def test_payload_too_large(keyed):
    with keyed.client() as c:
        with pytest.raises(clarion.PayloadTooLarge) as e:
            c.publish("t", "x" * 2000)
        assert "max_publish_size" in e.value.message
        assert c.publish("t", "x" * 1000).topic == "t"  # and the client still works


def test_head_limits(keyed):
    with keyed.client() as c:
        with pytest.raises(clarion.RequestHeadTooLarge) as e:
            c.publish("t" * 9000, "x")  # request line over max_request_line
        assert e.value.status == 414
    big = httpx.Client(headers={f"x-{i}": "v" for i in range(100)})
    with clarion.Client(keyed.api_url, api_key=KEY, http_client=big) as c:
        with pytest.raises(clarion.RequestHeadTooLarge) as e:
            c.publish("t", "x")
        assert e.value.status == 431
    big.close()


def test_not_found_and_method(keyed):
    with clarion.Client(keyed.api_url + "/nowhere", api_key=KEY) as c:
        with pytest.raises(clarion.NotFound):
            c.publish("t", "x")
    with pytest.raises(clarion.MethodNotAllowed) as e:
        _check(httpx.get(keyed.api_url + "/publish/t"))
    assert e.value.message == "use POST"


def test_publishing_to_the_client_listener_says_which_listener_to_use(keyed):
    # Not PayloadTooLarge: the client listener says what it is and where the API is.
    for publish in (lambda c: c.publish("t", "x"), lambda c: c.publish_batch([("t", "x")])):
        with clarion.Client(f"http://{keyed.clients}", api_key=KEY) as c:
            with pytest.raises(clarion.NotFound) as e:
                publish(c)
        assert e.value.status == 404
        assert "this is the client listener" in e.value.message, e.value.message
        assert "api_listen" in e.value.message, e.value.message


def test_unavailable_when_api_connections_are_exhausted(clarion_server):
    # The API serves at most 256 connections at once and answers 503 past that.
    held = []
    try:
        for _ in range(256):
            s = socket.create_connection(tuple_addr(clarion_server.api), timeout=5)
            held.append(s)
        deadline = time.monotonic() + 10
        with clarion_server.client() as c:
            while True:
                try:
                    c.publish("t", "x")
                except clarion.Unavailable as e:
                    assert "too many API connections" in e.message
                    break
                except clarion.ConnectionFailed:
                    pass  # the refusal may close the connection before httpx reads it
                assert time.monotonic() < deadline, "no 503 with every API connection taken"
                time.sleep(0.05)
    finally:
        for s in held:
            s.close()


def test_transport_errors():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        # Bound, not listening: connections are refused.
        with clarion.Client(f"http://127.0.0.1:{port}") as c:
            with pytest.raises(clarion.ConnectionFailed):
                c.publish("t", "x")
        # Listening, never answering: the read times out.
        s.listen(4)
        with clarion.Client(f"http://127.0.0.1:{port}", timeout=0.3) as c:
            with pytest.raises(clarion.Timeout):
                c.publish("t", "x")

        async def async_timeout():
            async with clarion.AsyncClient(f"http://127.0.0.1:{port}", timeout=0.3) as c:
                await c.publish("t", "x")

        with pytest.raises(clarion.Timeout):
            asyncio.run(async_timeout())
    assert issubclass(clarion.Timeout, clarion.TransportError)
    assert issubclass(clarion.Unavailable, clarion.APIError)
    assert issubclass(clarion.APIError, clarion.ClarionError)


def test_async_client_maps_errors_too(keyed):
    async def run():
        async with clarion.AsyncClient(keyed.api_url) as c:
            with pytest.raises(clarion.Unauthorized):
                await c.publish("t", "x")
        async with keyed.async_client() as c:
            with pytest.raises(clarion.BadRequest):
                await c.publish_batch([("bad topic", "x")])
            with pytest.raises(clarion.PayloadTooLarge):
                await c.publish("t", b"\x00" * 4096)
            assert await c.healthy()

    asyncio.run(run())


def test_status_mapping_covers_every_documented_status():
    from clarion_client.errors import error_for

    expected = {
        400: clarion.BadRequest,
        401: clarion.Unauthorized,
        403: clarion.Forbidden,
        404: clarion.NotFound,
        405: clarion.MethodNotAllowed,
        413: clarion.PayloadTooLarge,
        414: clarion.RequestHeadTooLarge,
        431: clarion.RequestHeadTooLarge,
        500: clarion.ServerError,
        502: clarion.ServerError,
        503: clarion.Unavailable,
    }
    for status, cls in expected.items():
        assert type(error_for(status, "m")) is cls
    assert type(error_for(418, "m")) is clarion.APIError


def test_server_that_cannot_start_reports_why():
    with pytest.raises(ServerStartError) as e:
        ClarionServer(["--workers", "nope"]).start()
    assert "workers" in str(e.value)


def tuple_addr(hostport):
    host, port = hostport.rsplit(":", 1)
    return host, int(port)


class _Upgrading:
    """A stand-in API that answers its first `refusals` publishes as a server in a hand-over's
    freeze does (503, Retry-After: 1, "an upgrade is in progress"), then 200 with a receipt."""

    def __init__(self, refusals, retry_after="1"):
        import http.server
        import threading

        outer = self
        self.requests = []
        self.keys = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.requests.append(time.monotonic())
                outer.keys.append(self.headers.get("Idempotency-Key"))
                if len(outer.requests) <= refusals:
                    body = json.dumps({"error": "message not published: an upgrade is in progress"}).encode()
                    self.send_response(503)
                    if retry_after is not None:
                        self.send_header("Retry-After", retry_after)
                else:
                    body = json.dumps({"topic": "t", "id": "e-1", "subscribers": 0}).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_publish_refused_during_an_upgrade_is_sent_again_after_retry_after():
    api = _Upgrading(refusals=2)
    try:
        with clarion.Client(api.url) as c:
            assert c.publish("t", "x").id == "e-1"
        assert len(api.requests) == 3
        # Each retry waited what Retry-After asked.
        assert api.requests[1] - api.requests[0] >= 0.95
        assert api.requests[2] - api.requests[1] >= 0.95

        async def batch():
            async with clarion.AsyncClient(api.url) as c:
                return await c.publish("t", "y")

        assert asyncio.run(batch()).id == "e-1"
    finally:
        api.close()


def test_a_retried_publish_carries_the_same_idempotency_key_and_each_publish_its_own():
    api = _Upgrading(refusals=1)
    try:
        with clarion.Client(api.url) as c:
            c.publish("t", "x")
            c.publish("t", "y", idempotency_key="order-17")
        first, retry, own = api.keys
        assert first and retry == first, api.keys
        assert own == "order-17"
    finally:
        api.close()


def test_retrying_a_refused_publish_is_bounded_by_retry_for():
    api = _Upgrading(refusals=100)
    try:
        started = time.monotonic()
        with clarion.Client(api.url, retry_for=2.5) as c:
            with pytest.raises(clarion.Unavailable) as e:
                c.publish("t", "x")
        assert "upgrade is in progress" in e.value.message
        assert len(api.requests) == 3  # at 0, 1 and 2 s; a wait to 3 s would pass 2.5 s
        assert time.monotonic() - started < 3
        with clarion.Client(api.url, retry_for=0) as c:
            with pytest.raises(clarion.Unavailable):
                c.publish("t", "x")
        assert len(api.requests) == 4
    finally:
        api.close()
    # A 503 without Retry-After is not retried.
    api = _Upgrading(refusals=1, retry_after=None)
    try:
        with clarion.Client(api.url) as c:
            with pytest.raises(clarion.Unavailable):
                c.publish("t", "x")
        assert len(api.requests) == 1
    finally:
        api.close()
