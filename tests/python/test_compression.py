"""permessage-deflate (RFC 7692) against the real binary: negotiation, one shared compressed
frame per published message, the size threshold, inflating client messages with and without
context takeover, the zip-bomb limit, dedicated mode, and compression turned off."""

import asyncio
import json
import os
import socket
import struct
import zlib

from websockets.asyncio.client import connect

import rawws

PRICE = json.dumps(
    {"symbol": "EURUSD", "bids": [[1.08412 + i / 1e5, 1_000_000 + i] for i in range(30)]}
)


def open_raw(server, path, extensions):
    sock, head, rest = rawws.connect(
        server.clients, path, extra_headers=f"Sec-WebSocket-Extensions: {extensions}\r\n"
    )
    assert head.startswith("HTTP/1.1 101"), head
    return sock, head, rest


def read_frame(sock, buf=b""):
    """(rsv1, opcode, payload, rest) of one server frame."""
    while len(buf) < 2:
        buf += sock.recv(65536)
    b0, b1 = buf[0], buf[1]
    n, at = b1 & 0x7F, 2
    if n == 126:
        while len(buf) < 4:
            buf += sock.recv(65536)
        n, at = struct.unpack("!H", buf[2:4])[0], 4
    elif n == 127:
        while len(buf) < 10:
            buf += sock.recv(65536)
        n, at = struct.unpack("!Q", buf[2:10])[0], 10
    while len(buf) < at + n:
        buf += sock.recv(65536)
    return bool(b0 & 0x40), b0 & 0x0F, buf[at : at + n], buf[at + n :]


def inflate(payload, bits=15):
    d = zlib.decompressobj(-bits)
    return d.decompress(payload + b"\x00\x00\xff\xff")


def deflate(data, bits=15):
    c = zlib.compressobj(6, zlib.DEFLATED, -bits)
    out = c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
    assert out.endswith(b"\x00\x00\xff\xff")
    return out[:-4]


def masked(opcode, payload, rsv1=False):
    return rawws.frame(opcode, payload, rsv=4 if rsv1 else 0)


def test_browser_style_offer_gets_shared_mode_and_compressed_broadcasts(server):
    a, head, rest_a = open_raw(server, "/ws?topic=px", "permessage-deflate; client_max_window_bits")
    assert "Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover; client_max_window_bits=12" in head
    b, _, rest_b = open_raw(server, "/ws?topic=px", "permessage-deflate")
    plain, _, rest_p = rawws.connect(server.clients, "/ws?topic=px")
    server.publish("px", PRICE)
    rsv_a, op_a, pay_a, _ = read_frame(a, rest_a)
    rsv_b, op_b, pay_b, _ = read_frame(b, rest_b)
    assert rsv_a and rsv_b and op_a == op_b == 1
    # The same compressed bytes for every subscriber: compressed once per message.
    assert pay_a == pay_b
    assert len(pay_a) < len(PRICE) / 3
    assert inflate(pay_a).decode() == PRICE
    # A subscriber without the extension gets the plain frame of the same publish.
    rsv_p, _, pay_p, _ = read_frame(plain, rest_p)
    assert not rsv_p and pay_p.decode() == PRICE
    # Short messages are not worth compressing.
    server.publish("px", "tiny")
    rsv, _, pay, _ = read_frame(a, b"")
    assert not rsv and pay == b"tiny"
    for s in (a, b, plain):
        s.close()


def test_server_window_limits_are_honoured_or_declined(server):
    s, head, rest = open_raw(server, "/ws?topic=w", "permessage-deflate; server_max_window_bits=10")
    assert "server_max_window_bits=10" in head
    server.publish("w", PRICE * 4)
    rsv, _, pay, _ = read_frame(s, rest)
    assert rsv and inflate(pay, 10).decode() == PRICE * 4
    s.close()
    # 8 bits cannot be honoured by a raw deflate encoder: declined, the connection is plain.
    s, head, _ = open_raw(server, "/ws?topic=w", "permessage-deflate; server_max_window_bits=8")
    assert "Sec-WebSocket-Extensions" not in head
    s.close()
    # An invalid offer is declined, and the next acceptable one taken.
    s, head, _ = open_raw(
        server, "/ws?topic=w", "permessage-deflate; bogus, permessage-deflate; client_no_context_takeover"
    )
    assert "Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover" in head
    s.close()


def test_every_client_is_told_to_compress_each_message_on_its_own(start_server):
    """RFC 7692 7.1.1.2: the server adds `client_no_context_takeover` whether offered or not,
    so no inflate state outlives a client's message (and an upgrade has none to carry)."""
    server = start_server("--allow-client-publish")
    for offer in [
        "permessage-deflate; client_no_context_takeover",
        "permessage-deflate",
        "permessage-deflate; client_max_window_bits",
    ]:
        s, head, rest = open_raw(server, "/ws", offer)
        answer = next(l for l in head.split("\r\n") if l.startswith("Sec-WebSocket-Extensions"))
        assert answer.count("client_no_context_takeover") == 1, answer
        for topic in ["a", "b", "c"]:
            msg = json.dumps({"type": "subscribe", "topic": topic}).encode()
            z = deflate(msg)
            s.sendall(masked(1, z, rsv1=True))
            rsv, op, pay, rest = read_frame(s, rest)
            text = inflate(pay).decode() if rsv else pay.decode()
            assert json.loads(text) == {"type": "subscribed", "topic": topic}
        s.close()


def test_zip_bombs_and_corrupt_data_are_refused(start_server):
    server = start_server("--max-message-size", 65536)
    bomb = deflate(b"\x00" * (10 << 20))
    assert len(bomb) < 20_000
    s, _, rest = open_raw(server, "/ws?topic=z", "permessage-deflate; client_no_context_takeover")
    s.sendall(masked(2, bomb, rsv1=True))
    assert rawws.Reader(s, rest).close_code()[0] == 1009
    s.close()
    s, _, rest = open_raw(server, "/ws?topic=z", "permessage-deflate")
    s.sendall(masked(1, b"\xff\xff\xff\xff\xff", rsv1=True))
    assert rawws.Reader(s, rest).close_code()[0] == 1007
    s.close()
    # Compressed text that inflates to invalid UTF-8.
    s, _, rest = open_raw(server, "/ws?topic=z", "permessage-deflate")
    s.sendall(masked(1, deflate(b"\xff\xfe"), rsv1=True))
    assert rawws.Reader(s, rest).close_code()[0] == 1007
    s.close()
    # RSV1 without negotiation stays a protocol error.
    s, _, rest = rawws.connect(server.clients, "/ws?topic=z")
    s.sendall(masked(1, deflate(b"{}"), rsv1=True))
    assert rawws.Reader(s, rest).close_code()[0] == 1002
    s.close()


def test_dedicated_mode_keeps_context_per_connection(start_server):
    server = start_server("--compression", "dedicated")
    s, head, rest = open_raw(server, "/ws?topic=d", "permessage-deflate; client_max_window_bits")
    assert "server_no_context_takeover" not in head.split("Sec-WebSocket-Extensions:")[1].split("\r\n")[0]
    d = zlib.decompressobj(-15)
    sizes = []
    for i in range(10):
        msg = PRICE.replace("EURUSD", f"EURUSD{i}")
        server.publish("d", msg)
        rsv, _, pay, rest = read_frame(s, rest)
        assert rsv
        sizes.append(len(pay))
        assert d.decompress(pay + b"\x00\x00\xff\xff").decode() == msg
    assert sizes[-1] < sizes[0] / 3, f"later messages reuse the context: {sizes}"
    s.close()


def test_compression_off(start_server):
    server = start_server("--compression", "off")
    s, head, _ = open_raw(server, "/ws?topic=o", "permessage-deflate")
    assert "Sec-WebSocket-Extensions" not in head
    s.close()


def test_websockets_library_round_trip_with_compression(server):
    async def main():
        async with connect(server.ws_url(topics=["lib"]), subprotocols=["clarion.v1"]) as ws:
            ext = ws.response.headers["Sec-WebSocket-Extensions"]
            assert "permessage-deflate" in ext and "client_no_context_takeover" in ext, ext
            r = await asyncio.to_thread(server.publish, "lib", PRICE)
            msg = json.loads(await ws.recv())
            assert msg == {"type": "message", "topic": "lib", "id": r["id"], "data": PRICE}
            # Its own messages, compressed each on its own as agreed, are understood.
            for topic in ["x", "y", "z"]:
                await ws.send(json.dumps({"type": "subscribe", "topic": topic}))
                assert json.loads(await ws.recv()) == {"type": "subscribed", "topic": topic}

    asyncio.run(main())


def test_dedicated_compressors_are_capped_and_the_rest_share(start_server):
    server = start_server("--compression", "dedicated", "--compression-dedicated-limit", 1,
                          "--workers", 1)
    a, _, rest_a = open_raw(server, "/ws?topic=cap", "permessage-deflate")
    server.publish("cap", PRICE)  # a gets the one dedicated compressor
    assert inflate(read_frame(a, rest_a)[2]).decode() == PRICE
    b, _, rest_b = open_raw(server, "/ws?topic=cap", "permessage-deflate")
    for i in range(3):
        msg = PRICE.replace("EURUSD", f"GBPUSD{i}")
        server.publish("cap", msg)
        rsv, _, pay, rest_b = read_frame(b, rest_b)
        # b is past the cap: each message compressed on its own (a fresh inflater works).
        assert rsv and inflate(pay).decode() == msg
    a.close()
    b.close()


def open_envelope(server, path, extensions):
    sock, head, rest = rawws.connect(
        server.clients, path,
        extra_headers=f"Sec-WebSocket-Protocol: clarion.v1\r\nSec-WebSocket-Extensions: {extensions}\r\n",
    )
    assert head.startswith("HTTP/1.1 101"), head
    return sock, head, rest


def read_envelopes(sock, rest, count, inflater=None):
    """`count` text frames as (compressed, envelope JSON), skipping in-band replies."""
    out = []
    while len(out) < count:
        rsv, op, payload, rest = read_frame(sock, rest)
        assert op == 1, op
        text = (inflater.decompress(payload + b"\x00\x00\xff\xff") if inflater else inflate(payload)) if rsv else payload
        env = json.loads(text)
        if env.get("type") in ("message", "append", "gap"):
            out.append((rsv, env))
    return out, rest


def test_a_resume_is_compressed_as_live_messages_are(server):
    # A clarion.v1 WebSocket that agreed permessage-deflate gets its replay (after `since=` in
    # the URL or in a subscribe message) compressed once per message, as its live messages: a
    # reconnect after a long answer is mostly text.
    ids = [server.publish("rz", PRICE.replace("EURUSD", f"EUR{i}"))["id"] for i in range(3)]
    start = ids[0].split("-")[0] + "-0"
    s, _, rest = open_envelope(server, f"/ws?topic=rz&since={start}", "permessage-deflate")
    got, rest = read_envelopes(s, rest, 3)
    assert [(z, e["id"]) for z, e in got] == [(True, i) for i in ids], got
    assert json.loads(got[2][1]["data"])["symbol"] == "EUR2"
    server.publish("rz", "tiny")
    (live,), _ = read_envelopes(s, rest, 1)
    assert live[1]["data"] == "tiny"
    s.close()
    # In band, with an appendable message's text so far folded into one message.
    opened = json.loads(server.request("POST", "/publish/ai?stream=open", b"Once upon a time, " * 20,
                                       {"Content-Type": "text/plain"})[2])
    s, _, rest = open_envelope(server, "/ws", "permessage-deflate; client_max_window_bits")
    s.sendall(masked(1, json.dumps({"type": "subscribe", "topic": "ai", "since": start}).encode()))
    ((compressed, folded),), _ = read_envelopes(s, rest, 1)
    assert compressed and folded["stream"] == opened["stream"], folded
    assert folded["data"] == "Once upon a time, " * 20
    s.close()


def test_with_a_context_of_its_own_a_resume_is_sent_uncompressed(start_server):
    # Dedicated mode: the connection's compressor keeps context across its live messages, which
    # a shared frame would break; the replay goes uncompressed and the context stays whole.
    server = start_server("--compression", "dedicated")
    first = server.publish("rd", PRICE)["id"]
    since = first.split("-")[0] + "-0"
    s, _, rest = open_envelope(server, f"/ws?topic=rd&since={since}", "permessage-deflate")
    d = zlib.decompressobj(-15)
    (replayed,), rest = read_envelopes(s, rest, 1, d)
    assert not replayed[0] and replayed[1]["id"] == first
    for i in range(3):
        server.publish("rd", PRICE.replace("EURUSD", f"USD{i}"))
    live, _ = read_envelopes(s, rest, 3, d)
    assert [z for z, _ in live] == [True] * 3
    assert [json.loads(e["data"])["symbol"] for _, e in live] == ["USD0", "USD1", "USD2"]
    s.close()
