"""The Pusher Channels protocol on `/app/{key}`, spoken raw: the connection's greeting and
pings, every error a client can cause answered with the code pusher-js expects (unknown key
4001, protocol 4007/4008, over quota 4004, bad channel signature 4009 on the channel, malformed,
unknown and oversized messages without closing), public, private and cache channels, client
events (off unless enabled, not echoed, 10 a second), `socket_id` exclusion on the API trigger,
and signin. Signatures come from the official PyPI `pusher` library (docs/pusher.md)."""

import contextlib
import json
import time

import pusher
import pytest
import websockets.sync.client
from websockets.exceptions import ConnectionClosed

APP = {"app_id": "123", "key": "app1-key", "secret": "app1-secret"}


def start(start_server, *extra):
    return start_server(
        "--pusher-app-id", APP["app_id"], "--pusher-app-key", APP["key"],
        "--pusher-app-secret", APP["secret"], *extra,
    )


def lib(server):
    host, port = server.api.rsplit(":", 1)
    return pusher.Pusher(app_id=APP["app_id"], key=APP["key"], secret=APP["secret"],
                         host=host, port=int(port), ssl=False)


def connect(server, key=APP["key"], query="protocol=7&client=js&version=8.4.0"):
    return websockets.sync.client.connect(f"ws://{server.clients}/app/{key}?{query}",
                                          open_timeout=5, close_timeout=2)


def recv(ws, timeout=5):
    msg = json.loads(ws.recv(timeout=timeout))
    if isinstance(msg.get("data"), str):
        try:
            msg["data"] = json.loads(msg["data"])
        except ValueError:
            pass
    return msg


def send(ws, event, data=None, **extra):
    ws.send(json.dumps({"event": event, "data": data if data is not None else {}, **extra}))


def established(ws):
    msg = recv(ws)
    assert msg["event"] == "pusher:connection_established", msg
    return msg["data"]["socket_id"]


def subscribe(ws, channel, **data):
    send(ws, "pusher:subscribe", {"channel": channel, **data})
    return recv(ws)


def refused_with(server, code, **kw):
    """Connects and expects pusher:error `code`, then a Close with that code."""
    with connect(server, **kw) as ws:
        msg = recv(ws)
        assert msg["event"] == "pusher:error" and msg["data"]["code"] == code, msg
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd.code == code


def test_a_connection_is_greeted_with_its_socket_id_and_answers_pings(start_server):
    server = start(start_server, "--ping-interval", "30")
    with connect(server) as ws:
        msg = recv(ws)
        assert msg["event"] == "pusher:connection_established"
        sid = msg["data"]["socket_id"]
        a, _, b = sid.partition(".")
        assert a.isdigit() and b.isdigit(), sid
        assert msg["data"]["activity_timeout"] == 30
        send(ws, "pusher:ping")
        assert recv(ws)["event"] == "pusher:pong"
    with connect(server) as ws:
        assert established(ws) != sid


def test_wrong_key_and_protocol_versions_are_refused_with_pushers_codes(start_server):
    server = start(start_server)
    refused_with(server, 4001, key="not-the-key")
    refused_with(server, 4007, query="protocol=99")
    refused_with(server, 4008, query="client=js")
    m = server.metrics()
    assert m['clarion_pusher_ws_total{outcome="unknown_app"}'] == 1
    assert m['clarion_pusher_ws_total{outcome="protocol"}'] == 2


def test_an_app_over_its_connection_limit_refuses_with_4004(start_server, tmp_path):
    conf = tmp_path / "clarion.toml"
    conf.write_text('[[pusher_apps]]\nid = "1"\nkey = "k1"\nsecret = "s1"\nmax_connections = 1\n')
    server = start_server("--config", conf)
    with connect(server, key="k1") as first:
        established(first)
        refused_with(server, 4004, key="k1")
    # The first one's close gave its place back.
    deadline = time.monotonic() + 5
    while True:
        with connect(server, key="k1") as again:
            msg = recv(again)
            if msg["event"] == "pusher:connection_established" or time.monotonic() > deadline:
                break
    assert msg["event"] == "pusher:connection_established", msg


def test_malformed_unknown_and_oversized_messages_get_an_error_and_the_connection_stays(
        start_server):
    server = start(start_server)
    with connect(server) as ws:
        established(ws)
        for bad in ("not json", '{"event":"pusher:nope"}', json.dumps(
                {"event": "client-x", "channel": "private-a", "data": "x" * 20_000})):
            ws.send(bad)
            msg = recv(ws)
            assert msg["event"] == "pusher:error" and msg["data"]["code"] is None, msg
        send(ws, "pusher:ping")
        assert recv(ws)["event"] == "pusher:pong"
    m = server.metrics()
    for outcome in ("malformed", "unknown_event", "too_large"):
        assert m[f'clarion_pusher_ws_total{{outcome="{outcome}"}}'] == 1, outcome


def wait_subscribers(server, channel, n):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if lib(server).channel_info(channel, ["subscription_count"]).get(
                "subscription_count") == n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{channel} never had {n} subscribers")


def test_public_channels_take_library_triggers_and_clarion_publishes_on_the_same_topic(
        start_server):
    server = start(start_server)
    with connect(server) as ws, websockets.sync.client.connect(
            f"ws://{server.clients}/ws?topic=orders") as own:
        established(ws)
        msg = subscribe(ws, "orders")
        assert msg == {"event": "pusher_internal:subscription_succeeded", "channel": "orders",
                       "data": {}}
        wait_subscribers(server, "orders", 2)
        lib(server).trigger("orders", r"App\Events\OrderShipped", {"id": 7})
        got = json.loads(ws.recv(timeout=5))
        assert got == {"event": r"App\Events\OrderShipped", "channel": "orders",
                       "data": json.dumps({"id": 7})}
        assert json.loads(own.recv(timeout=5)) == {"id": 7}
        status, _, _ = server.request("POST", "/publish/orders", b"hello")
        assert status in (200, 202)
        assert recv(ws) == {"event": "message", "channel": "orders", "data": "hello"}
        send(ws, "pusher:unsubscribe", {"channel": "orders"})
        wait_subscribers(server, "orders", 1)


def test_private_channels_need_the_backends_signature(start_server):
    server = start(start_server)
    with connect(server) as ws:
        sid = established(ws)
        other = lib(server).authenticate("private-b", sid)["auth"]
        msg = subscribe(ws, "private-a", auth=other)
        assert msg["event"] == "pusher:error" and msg["channel"] == "private-a", msg
        assert msg["data"]["code"] == 4009
        msg = subscribe(ws, "private-a", auth=lib(server).authenticate("private-a", sid)["auth"])
        assert msg["event"] == "pusher_internal:subscription_succeeded", msg
        assert server.metrics()['clarion_pusher_ws_total{outcome="auth"}'] == 1


def test_client_events_are_off_unless_enabled(start_server):
    server = start(start_server)
    with connect(server) as ws:
        sid = established(ws)
        subscribe(ws, "private-a", auth=lib(server).authenticate("private-a", sid)["auth"])
        send(ws, "client-typing", {"who": "me"}, channel="private-a")
        msg = recv(ws)
        assert msg["event"] == "pusher:error" and msg["data"]["code"] is None, msg


def test_client_events_reach_the_others_not_the_sender_within_the_rate(start_server):
    server = start(start_server, "--pusher-client-messages")
    with connect(server) as a, connect(server) as b:
        sids = [established(a), established(b)]
        for ws, sid in zip((a, b), sids):
            subscribe(ws, "private-room", auth=lib(server).authenticate("private-room", sid)["auth"])
        send(a, "client-typing", {"who": "a"}, channel="private-room")
        assert recv(b) == {"event": "client-typing", "channel": "private-room",
                           "data": {"who": "a"}}
        # Public channels take none.
        subscribe(a, "lobby")
        send(a, "client-x", {}, channel="lobby")
        assert recv(a)["event"] == "pusher:error"
        # The sender got nothing of its own; past 10 in one second it is told 4301.
        for i in range(12):
            send(a, "client-n", i, channel="private-room")
        errors = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                msg = recv(a, timeout=0.5)
            except TimeoutError:
                break
            assert msg["event"] == "pusher:error", msg
            errors.append(msg["data"]["code"])
        assert errors and set(errors) == {4301}, errors
        received = []
        while True:
            try:
                received.append(recv(b, timeout=0.5)["data"])
            except TimeoutError:
                break
        assert 10 - len(errors) <= len(received) <= 10


def test_a_trigger_leaves_out_the_socket_id_it_names(start_server):
    server = start(start_server)
    with connect(server) as a, connect(server) as b:
        sid_a, _ = established(a), established(b)
        subscribe(a, "news")
        subscribe(b, "news")
        wait_subscribers(server, "news", 2)
        lib(server).trigger("news", "story", "one", socket_id=sid_a)
        lib(server).trigger("news", "story", "two")
        assert recv(b)["data"] == "one"
        assert recv(b)["data"] == "two"
        assert recv(a)["data"] == "two"


def test_cache_channels_send_the_last_event_or_a_cache_miss(start_server):
    server = start(start_server)
    with connect(server) as ws:
        established(ws)
        assert subscribe(ws, "cache-ticker")["event"] == "pusher_internal:subscription_succeeded"
        assert recv(ws) == {"event": "pusher:cache_miss", "channel": "cache-ticker", "data": {}}
    lib(server).trigger("cache-ticker", "price", "1")
    lib(server).trigger("cache-ticker", "price", "2")
    with connect(server) as ws:
        established(ws)
        assert subscribe(ws, "cache-ticker")["event"] == "pusher_internal:subscription_succeeded"
        assert recv(ws) == {"event": "price", "channel": "cache-ticker", "data": 2}


def test_signin_with_the_backends_signature_and_refused_without(start_server):
    server = start(start_server)
    user = {"id": "42", "user_info": {"name": "Ada"}}
    with connect(server) as ws:
        sid = established(ws)
        signed = lib(server).authenticate_user(sid, user)
        send(ws, "pusher:signin", signed)
        msg = recv(ws)
        assert msg["event"] == "pusher:signin_success", msg
        assert json.loads(msg["data"]["user_data"])["id"] == "42"
    with connect(server) as ws:
        established(ws)
        send(ws, "pusher:signin", signed)  # signed for another socket id
        refusal = recv(ws)
        assert refusal["event"] == "pusher:error" and refusal["data"]["code"] == 4009
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd.code == 4009


def join(ws, sid, server, channel, user):
    data = json.dumps(user)
    auth = lib(server).authenticate(channel, sid, user)["auth"]
    return subscribe(ws, channel, auth=auth, channel_data=data)


def test_presence_channels_list_members_and_announce_joins_and_leaves(start_server):
    server = start(start_server)
    with connect(server) as a:
        sid_a = established(a)
        first = join(a, sid_a, server, "presence-room", {"user_id": "1", "user_info": {"n": "a"}})
        assert first["event"] == "pusher_internal:subscription_succeeded", first
        assert first["data"] == {"presence": {"ids": ["1"], "hash": {"1": {"n": "a"}}, "count": 1}}
        with connect(server) as b:
            sid_b = established(b)
            second = join(b, sid_b, server, "presence-room", {"user_id": "2"})
            assert sorted(second["data"]["presence"]["ids"]) == ["1", "2"], second
            added = recv(a)
            assert added == {"event": "pusher_internal:member_added", "channel": "presence-room",
                             "data": {"user_id": "2", "user_info": None}}
            users = lib(server).users_info("presence-room")
            assert sorted(u["id"] for u in users["users"]) == ["1", "2"]
        assert recv(a) == {"event": "pusher_internal:member_removed", "channel": "presence-room",
                           "data": {"user_id": "2"}}
        # channel_data that is not the signed one is refused.
        forged = subscribe(a, "presence-other", auth=lib(server).authenticate(
            "presence-other", sid_a, {"user_id": "1"})["auth"], channel_data='{"user_id":"9"}')
        assert forged["event"] == "pusher:error" and forged["data"]["code"] == 4009


def test_terminate_connections_closes_every_connection_of_that_user_only(start_server):
    server = start(start_server)
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(connect(server)) for _ in range(3)]
        for ws, user in zip(conns, ("42", "42", "7")):
            sid = established(ws)
            send(ws, "pusher:signin", lib(server).authenticate_user(sid, {"id": user}))
            assert recv(ws)["event"] == "pusher:signin_success"
        lib(server).terminate_user_connections("42")
        for ws in conns[:2]:
            msg = recv(ws)
            assert msg["event"] == "pusher:error" and msg["data"]["code"] == 4009, msg
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
            assert closed.value.rcvd.code == 4009
        send(conns[2], "pusher:ping")
        assert recv(conns[2])["event"] == "pusher:pong"
        assert server.metrics()['clarion_pusher_ws_total{outcome="terminated"}'] == 2


def test_a_quiet_client_is_pinged_in_pushers_form_and_closed_with_4201_without_a_pong(
        start_server):
    server = start(start_server, "--ping-interval", "1", "--idle-timeout", "3")
    with connect(server) as ws:
        assert established(ws)
        assert recv(ws, timeout=4) == {"event": "pusher:ping", "data": {}}
        msg = recv(ws, timeout=6)
        assert msg["event"] == "pusher:error" and msg["data"]["code"] == 4201, msg
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd.code == 4201


def test_published_messages_reach_a_deflate_connection_compressed_once_for_all(start_server):
    import rawws
    from test_compression import PRICE, inflate, masked, read_frame

    server = start(start_server)
    conns = []
    for offer in ("permessage-deflate; client_max_window_bits", "permessage-deflate"):
        sock, head, rest = rawws.connect(
            server.clients, f"/app/{APP['key']}?protocol=7",
            extra_headers=f"Sec-WebSocket-Extensions: {offer}\r\n")
        assert head.startswith("HTTP/1.1 101") and "permessage-deflate" in head, head
        _, _, _, rest = read_frame(sock, rest)  # connection_established
        sub = json.dumps({"event": "pusher:subscribe", "data": {"channel": "ticker"}})
        sock.sendall(masked(1, sub.encode()))
        rsv, _, payload, rest = read_frame(sock, rest)
        text = inflate(payload) if rsv else payload
        assert json.loads(text)["event"] == "pusher_internal:subscription_succeeded"
        conns.append((sock, rest))
    server.publish("ticker", PRICE)
    lib(server).trigger("ticker", "quote", PRICE)
    got = []
    for sock, rest in conns:
        frames = []
        for _ in range(2):
            rsv, op, payload, rest = read_frame(sock, rest)
            assert rsv and op == 1, "compressed"
            frames.append(payload)
            msg = json.loads(inflate(payload))
            assert msg["channel"] == "ticker" and msg["data"] == PRICE, msg
        got.append(frames)
        sock.close()
    # The same compressed bytes for both: one compression per message, shared.
    assert got[0] == got[1]
    assert len(got[0][0]) < len(PRICE) / 2


def test_presence_events_reach_a_deflate_connection_compressed(start_server):
    import rawws
    from test_compression import inflate, masked, read_frame

    server = start(start_server)
    sock, head, rest = rawws.connect(
        server.clients, f"/app/{APP['key']}?protocol=7",
        extra_headers="Sec-WebSocket-Extensions: permessage-deflate\r\n")
    assert "permessage-deflate" in head, head

    def next_json():
        nonlocal rest
        rsv, op, payload, rest = read_frame(sock, rest)
        assert op == 1
        return rsv, json.loads(inflate(payload) if rsv else payload)

    _, hello = next_json()
    sid = json.loads(hello["data"])["socket_id"]
    me = {"user_id": "1"}
    auth = lib(server).authenticate("presence-room", sid, me)["auth"]
    sock.sendall(masked(1, json.dumps({"event": "pusher:subscribe", "data": {
        "channel": "presence-room", "auth": auth, "channel_data": json.dumps(me)}}).encode()))
    assert next_json()[1]["event"] == "pusher_internal:subscription_succeeded"
    # A member whose info is long enough to compress (over compression_threshold).
    info = {"name": "Ada Lovelace", "bio": "analytical engine " * 20}
    with connect(server) as b:
        join(b, established(b), server, "presence-room", {"user_id": "2", "user_info": info})
        rsv, added = next_json()
        assert added["event"] == "pusher_internal:member_added", added
        assert json.loads(added["data"]) == {"user_id": "2", "user_info": info}
        assert rsv, "member_added compressed"
    rsv, removed = next_json()
    assert removed["event"] == "pusher_internal:member_removed", removed
    sock.close()


def test_in_dedicated_compression_mode_published_messages_keep_the_connections_context_intact(
        start_server):
    import zlib

    import rawws
    from test_compression import PRICE, masked, read_frame

    server = start(start_server, "--compression", "dedicated", "--compression-threshold", "0")
    sock, head, rest = rawws.connect(
        server.clients, f"/app/{APP['key']}?protocol=7",
        extra_headers="Sec-WebSocket-Extensions: permessage-deflate\r\n")
    assert "permessage-deflate" in head, head
    window = zlib.decompressobj(-15)  # the client's window, kept across messages

    def next_json():
        nonlocal rest
        rsv, _, payload, rest = read_frame(sock, rest)
        return json.loads(window.decompress(payload + b"\x00\x00\xff\xff") if rsv else payload)

    assert next_json()["event"] == "pusher:connection_established"
    sock.sendall(masked(1, json.dumps(
        {"event": "pusher:subscribe", "data": {"channel": "ticker"}}).encode()))
    assert next_json()["event"] == "pusher_internal:subscription_succeeded"
    for _ in range(2):
        server.publish("ticker", PRICE)
        assert next_json()["data"] == PRICE
        sock.sendall(masked(1, b'{"event":"pusher:ping","data":{}}'))
        assert next_json()["event"] == "pusher:pong"
    sock.close()
