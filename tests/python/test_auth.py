"""JWT authentication against the real binary, with tokens made by PyJWT (and keys made by
`cryptography`): each algorithm, each place a token can come from, each way a token is refused,
wildcard grants, the publish API, and expiry on long-lived connections (short `exp` values of a
few seconds; the precise timing cases run under simulated time in the engine's tests)."""

import asyncio
import json
import socket
import time

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

SECRET = "an-hs256-secret-that-is-long-enough-0123"
OLD_SECRET = "the-previous-hs256-secret-still-in-use-99"
API_KEY = "the-backend-api-key"
KEYED = {"Authorization": f"Bearer {API_KEY}"}


def hs(claims=None, secret=SECRET, exp_in=300, **extra):
    body = {"sub": "alice", "exp": int(time.time()) + exp_in}
    body.update(claims or {})
    body.update(extra)
    return jwt.encode(body, secret, algorithm="HS256")


def grants(subscribe=(), publish=()):
    return {"clarion": {"subscribe": list(subscribe), "publish": list(publish)}}


def raw(server, request: bytes, read_for=2.0) -> bytes:
    """Sends raw bytes to the client port and returns what arrives within `read_for` seconds."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=read_for) as s:
        s.sendall(request)
        out = b""
        deadline = time.monotonic() + read_for
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
            if b"\r\n\r\n" in out and (b"401 " in out[:20] or b"403 " in out[:20]):
                break
        return out


def status_and_json(out: bytes):
    head, _, body = out.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body.decode().strip() or "{}")


def sse_first_event(server, path, headers=None, cookies=None, timeout=5.0):
    """Opens an SSE stream; returns (status, first data line or the JSON error)."""
    url = f"http://{server.clients}{path}"
    with httpx.Client(timeout=timeout, cookies=cookies) as c:
        with c.stream("GET", url, headers={"Accept": "text/event-stream", **(headers or {})}) as r:
            if r.status_code != 200:
                r.read()
                return r.status_code, r.json()
            return 200, None


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    ec_other = ec.generate_private_key(ec.SECP256R1())

    def pem(k):
        return k.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    (d / "rsa.pem").write_bytes(pem(rsa_key))
    (d / "ec.pem").write_bytes(pem(ec_key))
    jwks = {"keys": []}
    for kid, k in (("one", ec_other), ("two", ec_key)):
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(k.public_key()))
        jwk.update({"kid": kid, "use": "sig", "alg": "ES256"})
        jwks["keys"].append(jwk)
    (d / "jwks.json").write_text(json.dumps(jwks))
    (d / "bad.pem").write_text("not a key\n")
    return {
        "dir": d,
        "rsa": rsa_key,
        "rsa_pem": pem(rsa_key),
        "ec": ec_key,
        "ec_other": ec_other,
    }


@pytest.fixture
def hs_server(start_server):
    return start_server(
        "--auth-secret", SECRET,
        "--auth-previous-secret", OLD_SECRET,
        "--auth-public-topics", "public.*,lobby",
        "--auth-audience", "clarion-tests",
        "--allow-client-publish",
        "--api-key", API_KEY,
        env={"CLARION_LOG": "debug"},
    )


def aud(**kw):
    return {"aud": "clarion-tests", **kw}


def test_hs256_token_from_each_source_on_each_transport(hs_server):
    tok = hs(aud(**grants(["news"])))
    # SSE: header, query, cookie.
    assert sse_first_event(hs_server, "/sse?topic=news", {"Authorization": f"Bearer {tok}"})[0] == 200
    assert sse_first_event(hs_server, f"/sse?topic=news&token={tok}")[0] == 200
    assert sse_first_event(hs_server, "/sse?topic=news", cookies={"clarion_token": tok})[0] == 200
    # NDJSON stream and long-poll with the header.
    with httpx.Client(timeout=5) as c:
        with c.stream("GET", f"http://{hs_server.clients}/stream?topic=news",
                      headers={"Authorization": f"Bearer {tok}"}) as r:
            assert r.status_code == 200
        r = c.get(f"http://{hs_server.clients}/poll?topic=news&timeout=0",
                  headers={"Authorization": f"Bearer {tok}"})
        assert r.status_code == 200, r.text
        r = c.get(f"http://{hs_server.clients}/poll?topic=news&timeout=0")
        assert r.status_code == 401 and r.json() == {"error": "a token is required"}

    async def ws():
        # WebSocket: header, query, and the auth message.
        async with connect(f"ws://{hs_server.clients}/ws?topic=news",
                           additional_headers={"Authorization": f"Bearer {tok}"}) as a, \
                connect(f"ws://{hs_server.clients}/ws?topic=news&token={tok}") as b, \
                connect(f"ws://{hs_server.clients}/ws") as c:
            await c.send(json.dumps({"type": "auth", "token": tok}))
            reply = json.loads(await asyncio.wait_for(c.recv(), 5))
            assert reply["type"] == "authenticated" and reply["sub"] == "alice"
            await c.send(json.dumps({"type": "subscribe", "topic": "news"}))
            assert json.loads(await asyncio.wait_for(c.recv(), 5))["type"] == "subscribed"
            hs_server.publish("news", "hello", headers=KEYED)
            for w in (a, b, c):
                assert await asyncio.wait_for(w.recv(), 5) == "hello"

    asyncio.run(ws())


@pytest.mark.parametrize(
    "make, status, reason",
    [
        (lambda k: hs(aud(**grants(["news"])), exp_in=-60), 401, "token expired"),
        (lambda k: hs(aud(**grants(["news"])), nbf=int(time.time()) + 300), 401, "token not yet valid"),
        (lambda k: hs({"aud": "someone-else", **grants(["news"])}), 401, "token audience not accepted"),
        (lambda k: hs(aud(**grants(["news"])), secret="a-different-secret-of-enough-length"), 401,
         "bad token signature"),
        (lambda k: tamper(hs(aud(**grants(["other"]))), {"clarion": {"subscribe": ["news"]}}), 401,
         "bad token signature"),
        (lambda k: jwt.encode({"exp": int(time.time()) + 60, **aud(**grants(["news"]))}, None,
                              algorithm="none"), 401, "token algorithm not accepted"),
        (lambda k: "not.a.token", 401, "malformed token"),
        (lambda k: hs(aud(**grants(["elsewhere"]))), 403, "the token does not grant this topic"),
        (lambda k: None, 401, "a token is required"),
    ],
    ids=["expired", "not-yet-valid", "wrong-audience", "wrong-key", "tampered", "alg-none",
         "malformed", "topic-not-granted", "no-token"],
)
def test_refused_tokens_get_401_or_403_with_a_short_reason(hs_server, make, status, reason):
    tok = make(None)
    target = "/sse?topic=news" + (f"&token={tok}" if tok else "")
    assert sse_first_event(hs_server, target) == (status, {"error": reason})
    # The same refusal before a WebSocket's 101.
    out = raw(hs_server, (
        f"GET /ws?topic=news{'&token=' + tok if tok else ''} HTTP/1.1\r\nHost: x\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode())
    assert status_and_json(out) == (status, {"error": reason})
    # The token never reaches the log, whatever happened to it.
    code, stderr = hs_server.stop()
    assert code == 0
    if tok:
        assert tok not in stderr
        signature = tok.split(".")[-1]
        assert len(signature) < 16 or signature not in stderr


def tamper(token, changes):
    h, p, s = token.split(".")
    claims = json.loads(jwt.utils.base64url_decode(p))
    claims.update(changes)
    return ".".join([h, jwt.utils.base64url_encode(json.dumps(claims).encode()).decode(), s])


def test_previous_secret_is_accepted_during_rotation(hs_server):
    tok = hs(aud(**grants(["news"])), secret=OLD_SECRET)
    assert sse_first_event(hs_server, f"/sse?topic=news&token={tok}")[0] == 200


def test_failures_are_counted_by_reason(hs_server):
    sse_first_event(hs_server, f"/sse?topic=news&token={hs(aud(), exp_in=-5)}")
    sse_first_event(hs_server, "/sse?topic=news")
    sse_first_event(hs_server, f"/sse?topic=news&token={hs(aud(**grants(['x'])))}")
    m = hs_server.metrics()
    assert m['clarion_auth_failures_total{reason="expired"}'] == 1
    assert m['clarion_auth_failures_total{reason="missing"}'] == 1
    assert m['clarion_auth_failures_total{reason="forbidden"}'] == 1


@pytest.mark.parametrize(
    "pattern, topic, allowed",
    [
        ("chat.*", "chat.lobby", True),
        ("chat.*", "chat.a.b", True),
        ("chat.*", "chat", False),
        ("chat.*", "chatroom", False),
        ("chat.*", "chat.", False),  # a prefix pattern needs one more character
        ("user:42/*", "user:42/inbox", True),
        ("user:42/*", "user:421/inbox", False),
        ("*", "anything", True),
        ("news", "news", True),
        ("news", "newsroom", False),
    ],
)
def test_wildcard_grants(hs_server, pattern, topic, allowed):
    tok = hs(aud(**grants([pattern])))
    status, _ = sse_first_event(hs_server, f"/sse?topic={topic}&token={tok}")
    assert status == (200 if allowed else 403)


def test_public_topics_need_no_token_and_a_bad_token_still_fails(hs_server):
    assert sse_first_event(hs_server, "/sse?topic=public.weather")[0] == 200
    assert sse_first_event(hs_server, "/sse?topic=lobby")[0] == 200
    assert sse_first_event(hs_server, "/sse?topic=lobby2")[0] == 401
    assert sse_first_event(hs_server, "/sse?topic=lobby&token=x.y.z")[0] == 401


def test_refused_websocket_subscribe_keeps_the_connection(hs_server):
    async def run():
        async with connect(f"ws://{hs_server.clients}/ws") as ws:
            await ws.send(json.dumps({"type": "subscribe", "topic": "secret"}))
            r = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert r == {"type": "error", "error": "a token is required", "topic": "secret"}
            await ws.send(json.dumps({"type": "subscribe", "topic": "public.a"}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "subscribed"
            await ws.send(json.dumps({"type": "auth", "token": hs(aud(), exp_in=-10)}))
            r = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert r == {"type": "error", "error": "token expired"}
            hs_server.publish("public.a", "still open", headers=KEYED)
            assert await asyncio.wait_for(ws.recv(), 5) == "still open"

    asyncio.run(run())


def test_in_band_publish_needs_the_topic_in_the_publish_list(hs_server):
    async def run():
        tok = hs(aud(**grants(["chat.*"], ["chat.*"])))
        async with connect(f"ws://{hs_server.clients}/ws?topic=chat.1&token={tok}") as ws:
            await ws.send(json.dumps({"type": "publish", "topic": "chat.1", "data": "hi"}))
            got = [json.loads(m) if m.startswith("{") else m
                   for m in [await asyncio.wait_for(ws.recv(), 5) for _ in range(2)]]
            assert "hi" in got and any(isinstance(m, dict) and m["type"] == "published" for m in got)
            await ws.send(json.dumps({"type": "publish", "topic": "news", "data": "no"}))
            r = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert r["type"] == "error" and r["topic"] == "news"

    asyncio.run(run())


def test_publish_api_takes_the_key_or_a_token_with_the_topic(start_server):
    s = start_server("--auth-secret", SECRET, "--api-key", "the-api-key")
    body = b"x"
    tok = hs(grants(publish=["chat.*"]))
    assert s.request("POST", "/publish/chat.1", body, {"Authorization": f"Bearer {tok}"})[0] == 200
    st, _, out = s.request("POST", "/publish/news", body, {"Authorization": f"Bearer {tok}"})
    assert st == 403 and b"does not allow" in out
    st, _, out = s.request("POST", "/publish/news", body, {"Authorization": f"Bearer {hs(exp_in=-5)}"})
    assert (st, json.loads(out)) == (401, {"error": "token expired"})
    assert s.request("POST", "/publish/news", body)[0] == 401
    assert s.request("POST", "/publish/news", body, {"Authorization": "Bearer the-api-key"})[0] == 200
    batch = json.dumps({"messages": [{"topic": "chat.1", "data": "a"}, {"topic": "news", "data": "b"}]}).encode()
    st, _, out = s.request("POST", "/publish", batch,
                           {"Authorization": f"Bearer {tok}", "Content-Type": "application/json"})
    # Each message is answered in place: the allowed topic is published, the other refused.
    results = json.loads(out)["results"]
    assert st == 200 and "id" in results[0] and results[1]["status"] == 403, results


def test_rs256_with_a_pem_key_and_confusion_refused(start_server, keys):
    s = start_server("--auth-public-key", keys["dir"] / "rsa.pem")
    good = jwt.encode({"exp": int(time.time()) + 60, **grants(["news"])}, keys["rsa"], algorithm="RS256")
    assert sse_first_event(s, f"/sse?topic=news&token={good}")[0] == 200
    # HS256 signed with the public key's PEM as the secret: the algorithm-confusion attack.
    header = jwt.utils.base64url_encode(b'{"alg":"HS256","typ":"JWT"}').decode()
    payload = jwt.utils.base64url_encode(
        json.dumps({"exp": int(time.time()) + 60, **grants(["news"])}).encode()).decode()
    import hashlib
    import hmac
    sig = hmac.new(keys["rsa_pem"], f"{header}.{payload}".encode(), hashlib.sha256).digest()
    confused = f"{header}.{payload}.{jwt.utils.base64url_encode(sig).decode()}"
    assert sse_first_event(s, f"/sse?topic=news&token={confused}") == (
        401, {"error": "token algorithm not accepted"})
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    wrong = jwt.encode({"exp": int(time.time()) + 60, **grants(["news"])}, other, algorithm="RS256")
    assert sse_first_event(s, f"/sse?topic=news&token={wrong}") == (401, {"error": "bad token signature"})


def test_es256_with_a_pem_key(start_server, keys):
    s = start_server("--auth-public-key", keys["dir"] / "ec.pem")
    good = jwt.encode({"exp": int(time.time()) + 60, **grants(["news"])}, keys["ec"], algorithm="ES256")
    assert sse_first_event(s, f"/sse?topic=news&token={good}")[0] == 200


def test_es256_jwks_keys_chosen_by_kid(start_server, keys):
    s = start_server("--auth-jwks", keys["dir"] / "jwks.json", "--auth-algorithm", "ES256")
    claims = {"exp": int(time.time()) + 60, **grants(["news"])}
    for kid, key in (("one", keys["ec_other"]), ("two", keys["ec"])):
        tok = jwt.encode(claims, key, algorithm="ES256", headers={"kid": kid})
        assert sse_first_event(s, f"/sse?topic=news&token={tok}")[0] == 200
    # The right key under the wrong name is refused; an unknown name too.
    swapped = jwt.encode(claims, keys["ec"], algorithm="ES256", headers={"kid": "one"})
    assert sse_first_event(s, f"/sse?topic=news&token={swapped}") == (401, {"error": "bad token signature"})
    unknown = jwt.encode(claims, keys["ec"], algorithm="ES256", headers={"kid": "three"})
    assert sse_first_event(s, f"/sse?topic=news&token={unknown}") == (401, {"error": "unknown signing key"})


def test_a_bad_key_file_stops_startup_naming_it(keys):
    import subprocess
    from conftest import _binary
    path = keys["dir"] / "bad.pem"
    r = subprocess.run([_binary(), "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
                        "--auth-public-key", str(path)], capture_output=True, text=True, timeout=20)
    assert r.returncode != 0 and str(path) in r.stderr, r.stderr


def test_with_auth_on_the_publish_api_needs_a_credential(start_server):
    s = start_server("--auth-secret", SECRET)
    st, _, out = s.request("POST", "/publish/news", b"x")
    error = json.loads(out)["error"]
    assert st == 401 and error.startswith("no credentials: expected a token"), out
    # No key is configured: the answer says so, and how to get in (issue 54).
    assert "no api_key is set" in error and "clarion token --admin" in error, error
    assert s.request("GET", "/healthz")[0] == 200
    # The presence lookup says the same, naming no key that does not exist.
    st, _, out = s.request("GET", "/topics/chat.lobby/presence")
    error = json.loads(out)["error"]
    assert st == 401 and "no api_key is set" in error, out
    assert "the API key or a token" not in error, error


def test_a_wrong_api_key_says_which_credential_was_expected(start_server):
    # With auth on, a mistyped API key used to read "malformed token"; without auth, "missing or
    # wrong bearer key". Both now say what was wrong and which credential the API expected.
    wrong = {"Authorization": "Bearer not-the-key"}
    s = start_server("--auth-secret", SECRET, "--api-key", "right-key")
    st, _, out = s.request("POST", "/publish/news", b"x", wrong)
    assert st == 401
    assert json.loads(out)["error"] == (
        "the bearer is neither the API key nor a token: expected the API key (api_key) as "
        "`Authorization: Bearer KEY`, or a token (a JWT signed HS256 with auth_secret) as "
        "`Authorization: Bearer TOKEN`"
    )
    s = start_server("--auth-secret", SECRET)
    st, _, out = s.request("POST", "/publish/news", b"x", wrong)
    assert st == 401 and json.loads(out)["error"] == (
        "the bearer is neither the API key nor a token: expected a token (a JWT signed HS256 "
        "with auth_secret) as `Authorization: Bearer TOKEN`; no api_key is set: set one for "
        "backends (api_key), or make a token that publishes anywhere with `clarion token --admin`"
    )
    expired = {"Authorization": f"Bearer {hs(exp_in=-5)}"}
    st, _, out = s.request("POST", "/publish/news", b"x", expired)
    assert (st, json.loads(out)) == (401, {"error": "token expired"})
    forged = {"Authorization": f"Bearer {hs(secret='another-secret')}"}
    st, _, out = s.request("POST", "/publish/news", b"x", forged)
    assert st == 401 and json.loads(out)["error"].startswith(
        "bad token signature: expected a token (a JWT signed HS256 with auth_secret)"
    ), out
    s = start_server("--api-key", "right-key")
    for headers, what in ((wrong, "wrong API key"), ({}, "no credentials")):
        st, _, out = s.request("POST", "/publish/news", b"x", headers)
        assert st == 401 and json.loads(out)["error"] == (
            f"{what}: expected the API key (api_key) as `Authorization: Bearer KEY`"
        ), out


def test_with_auth_on_the_dashboard_needs_the_key_or_an_admin_token(start_server):
    import base64
    s = start_server("--auth-secret", SECRET)
    admin = hs({"clarion": {"admin": True}})
    plain = hs(grants(["news"], ["news"]))
    assert s.request("GET", "/dashboard")[0] == 401
    assert s.request("GET", "/dashboard", headers={"Authorization": f"Bearer {plain}"})[0] == 401
    assert s.request("GET", "/dashboard", headers={"Authorization": f"Bearer {hs(exp_in=-5)}"})[0] == 401
    assert s.request("GET", "/dashboard", headers={"Authorization": f"Bearer {admin}"})[0] == 200
    # A browser's sign-in prompt sends the token as the Basic password; the page's publish
    # action then goes through with the same credentials, to any topic.
    basic = {"Authorization": "Basic " + base64.b64encode(f"admin:{admin}".encode()).decode()}
    assert s.request("GET", "/dashboard", headers=basic)[0] == 200
    assert s.request("POST", "/publish/anything", b"x", basic)[0] == 200
    assert s.request("POST", "/publish/other", b"x", {"Authorization": f"Bearer {plain}"})[0] == 403
    # With an API key as well, the key opens it too.
    k = start_server("--auth-secret", SECRET, "--api-key", API_KEY)
    assert k.request("GET", "/dashboard", headers=KEYED)[0] == 200
    assert k.request("GET", "/dashboard", headers={"Authorization": f"Bearer {admin}"})[0] == 200
    assert k.request("GET", "/dashboard")[0] == 401


def test_without_auth_settings_tokens_are_ignored(server):
    assert sse_first_event(server, "/sse?topic=news&token=whatever")[0] == 200
    assert server.request("POST", "/publish/news", b"x")[0] == 200


def test_query_tokens_can_be_turned_off(start_server):
    s = start_server("--auth-secret", SECRET, "--auth-query-token=false")
    tok = hs(grants(["news"]))
    assert sse_first_event(s, f"/sse?topic=news&token={tok}")[0] == 401
    assert sse_first_event(s, "/sse?topic=news", {"Authorization": f"Bearer {tok}"})[0] == 200


def test_sse_ends_with_an_expired_event_at_exp(hs_server):
    tok = hs(aud(**grants(["news"])), exp_in=2)
    url = f"http://{hs_server.clients}/sse?topic=news&token={tok}"
    started = time.monotonic()
    with httpx.Client(timeout=8) as c:
        with c.stream("GET", url, headers={"Accept": "text/event-stream"}) as r:
            assert r.status_code == 200
            text = "".join(r.iter_text())
    assert "event: expired\ndata: {\"error\":\"token expired\"}" in text
    assert time.monotonic() - started < 6


def test_websocket_warned_refreshed_then_closed_4001(start_server):
    s = start_server("--auth-secret", SECRET, "--auth-expiry-warning", "2", "--api-key", API_KEY)

    async def run():
        tok = hs(grants(["news"]), exp_in=3)
        async with connect(f"ws://{s.clients}/ws?topic=news&token={tok}") as ws:
            warn = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert warn["type"] == "expiring" and warn["seconds"] <= 2
            # Refresh before expiry: the connection outlives the first token.
            await ws.send(json.dumps({"type": "refresh", "token": hs(grants(["news"]), exp_in=5)}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "authenticated"
            await asyncio.sleep(2)
            s.publish("news", "after the first exp", headers=KEYED)
            got = await asyncio.wait_for(ws.recv(), 5)
            while got.startswith("{"):
                got = await asyncio.wait_for(ws.recv(), 5)
            assert got == "after the first exp"
            # No refresh this time: closed with 4001 at exp.
            with pytest.raises(ConnectionClosed) as e:
                while True:
                    await asyncio.wait_for(ws.recv(), 8)
            assert e.value.rcvd.code == 4001
        # Refresh after expiry is too late: the server has closed; a new connection needs a
        # fresh token, and an expired one is refused before the 101.
        with pytest.raises(InvalidStatus) as e:
            async with connect(f"ws://{s.clients}/ws?topic=news&token={tok}"):
                pass
        assert e.value.response.status_code == 401

    asyncio.run(run())


def test_the_token_cookie_is_refused_from_another_sites_page(start_server):
    """Cross-site WebSocket hijacking: a page on evil.example opens a WebSocket to Clarion and
    the browser attaches the user's cookie. Only the server's own origin and allowed_origins
    may use the cookie; tokens a page cannot make a browser send are unaffected."""
    tok = hs(grants(["private"]))
    cookie = {"Cookie": f"clarion_token={tok}"}
    plain = start_server("--auth-secret", SECRET)
    listed = start_server("--auth-secret", SECRET, "--allowed-origins", "https://app.example,https://b.example")

    async def upgrade(server, headers):
        try:
            async with connect(f"ws://{server.clients}/ws?topic=private", additional_headers=headers):
                return 101, None
        except InvalidStatus as e:
            return e.response.status_code, json.loads(e.response.body or b"{}")

    async def run():
        evil = {**cookie, "Origin": "https://evil.example"}
        for server in (plain, listed):
            status, body = await upgrade(server, evil)
            assert status == 403, (status, body)
            assert body == {"error": "the token cookie is not accepted from this page's origin (allowed_origins)"}
            # `Origin: null` (a sandboxed frame) is nobody's own origin.
            assert (await upgrade(server, {**cookie, "Origin": "null"}))[0] == 403
            # The server's own pages, and clients that are not pages.
            assert (await upgrade(server, {**cookie, "Origin": f"http://{server.clients}"}))[0] == 101
            assert (await upgrade(server, cookie))[0] == 101
            # A token the page could not have made the browser send still counts.
            assert (await upgrade(server, {"Origin": "https://evil.example", "Authorization": f"Bearer {tok}"}))[0] == 101
            async with connect(f"ws://{server.clients}/ws?topic=private&token={tok}",
                               additional_headers={"Origin": "https://evil.example"}):
                pass
        assert (await upgrade(listed, {**cookie, "Origin": "https://app.example"}))[0] == 101
        assert (await upgrade(listed, {**cookie, "Origin": "https://B.example"}))[0] == 101
        assert (await upgrade(plain, {**cookie, "Origin": "https://app.example"}))[0] == 403

    asyncio.run(run())
    # Credentialed cross-site SSE is refused the same way; the page's own is not.
    status, body = sse_first_event(plain, "/sse?topic=private", {"Origin": "https://evil.example"},
                                   cookies={"clarion_token": tok})
    assert status == 403 and "allowed_origins" in body["error"], body
    assert sse_first_event(plain, "/sse?topic=private", cookies={"clarion_token": tok})[0] == 200
    assert plain.metrics()['clarion_auth_failures_total{reason="origin"}'] >= 3


# --------------------------------------------------------------------------------------------
# `clarion token`: a token for trying things, signed with the server's own key


def clarion_token(*args, env=None):
    import os
    import subprocess

    from conftest import _binary

    out = subprocess.run(
        [_binary(), "token", *args],
        capture_output=True,
        text=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}, **(env or {})},
        timeout=30,
    )
    return out.returncode, out.stdout.strip(), out.stderr


def test_clarion_token_makes_a_token_the_server_accepts_from_its_secret_its_file_or_a_key(
    start_server, tmp_path
):
    import subprocess

    # From the secret in a variable: the presence example's identity and grants.
    code, token, err = clarion_token(
        "--sub", "alice", "--subscribe", "chat.*", "--info", '{"name":"Alice"}', "--ttl", "10m",
        env={"CLARION_AUTH_SECRET": SECRET},
    )
    assert code == 0, err
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims["sub"] == "alice" and 590 <= claims["exp"] - time.time() <= 600
    assert claims["clarion"] == {"subscribe": ["chat.*"], "publish": [], "info": {"name": "Alice"}}
    s = start_server("--auth-secret", SECRET)
    assert sse_first_event(s, f"/sse?topic=chat.lobby&token={token}")[0] == 200
    assert sse_first_event(s, f"/sse?topic=secret&token={token}")[0] == 403

    # From the server's own TOML file, with its audience.
    config = tmp_path / "clarion.toml"
    config.write_text(f'auth_secret = "{SECRET}"\nauth_audience = "my-app"\n')
    code, token, err = clarion_token("--config", str(config), "--sub", "bob", "--publish", "chat.*")
    assert code == 0, err
    assert jwt.decode(token, SECRET, algorithms=["HS256"], audience="my-app")["aud"] == "my-app"
    s2 = start_server("--config", config)
    status, _, body = s2.request(
        "POST", "/publish/chat.lobby", b"hi", {"Authorization": f"Bearer {token}"}
    )
    assert status == 200, body

    # RS256 and ES256 from the private half of the server's public key.
    for algorithm in (["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
                      ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]):
        key, pub = tmp_path / "key.pem", tmp_path / "pub.pem"
        subprocess.run(["openssl", "genpkey", *algorithm, "-out", key], check=True,
                       capture_output=True)
        subprocess.run(["openssl", "pkey", "-in", key, "-pubout", "-out", pub], check=True,
                       capture_output=True)
        code, token, err = clarion_token("--private-key", str(key), "--subscribe", "*")
        assert code == 0, err
        s3 = start_server("--auth-public-key", pub)
        assert sse_first_event(s3, f"/sse?topic=any&token={token}")[0] == 200, algorithm

    # Without a key, and with a server that verifies with a public key, it says what to give.
    code, _, err = clarion_token("--sub", "x")
    assert code != 0 and "--auth-secret" in err and "--private-key" in err, err
    config.write_text(f'auth_public_key = "{pub}"\n')
    code, _, err = clarion_token("--config", str(config))
    assert code != 0 and "--private-key" in err, err
    # A pattern the server would refuse is refused here, not by a 401 later.
    code, _, err = clarion_token("--auth-secret", SECRET, "--subscribe", "a*b")
    assert code != 0 and "a*b" in err, err


def test_the_token_cookie_is_refused_on_a_subresource_another_page_made(start_server):
    """Issue 55 item 6, with the raw headers Chromium sends for an <img> on a sibling subdomain:
    `Sec-Fetch-Site: same-site`, `Sec-Fetch-Mode: no-cors`, no `Origin`, and the cookie. The
    cookie does not count there; the server's own page, a typed address, a client that is not a
    browser and an allowed origin's credentialed request still connect with it."""
    tok = hs(grants(["private"]))
    s = start_server("--auth-secret", SECRET, "--allowed-origins", "https://app.example.com")

    def status(extra):
        req = (f"GET /sse?topic=private HTTP/1.1\r\nHost: push.example.com\r\n"
               f"Cookie: clarion_token={tok}\r\n{extra}\r\n").encode()
        out = raw(s, req, read_for=1.0)
        return out.split(b"\r\n", 1)[0].decode(), out

    for site in ("same-site", "cross-site"):
        line, out = status(f"Sec-Fetch-Site: {site}\r\nSec-Fetch-Mode: no-cors\r\nSec-Fetch-Dest: image\r\n")
        assert line.startswith("HTTP/1.1 403 "), out
        assert b"another page made without an Origin" in out, out
    for extra in ("Sec-Fetch-Site: same-origin\r\nSec-Fetch-Mode: cors\r\n", "Sec-Fetch-Site: none\r\n", "",
                  "Sec-Fetch-Site: same-site\r\nOrigin: https://app.example.com\r\n"):
        line, out = status(extra)
        assert line == "HTTP/1.1 200 OK", (extra, out)
    assert s.metrics()['clarion_auth_failures_total{reason="origin"}'] == 2
