"""HTTP/2 limits a hostile client meets on both listeners: streams the server resets free their
slots at once and count in the reset budget (the "MadeYouReset" attack, CVE-2025-8671), an idle
or half-sent connection is closed in time, and a request's `host`/`:authority` must be one
well-formed name."""

import struct
import time

import pytest

import h2client
from h2client import Raw, frame

# What each flood makes the server reset, for stream `sid`: an SSE request, then a frame that
# is a stream error.
PROVOKE = {
    "zero_window_update": lambda r, sid: [
        r.headers(sid, "/sse?topic=mr", end_stream=True),
        frame(h2client.WINDOW_UPDATE, 0, sid, struct.pack("!I", 0)),
    ],
    "data_on_a_half_closed_stream": lambda r, sid: [
        r.headers(sid, "/sse?topic=mr", end_stream=True),
        frame(h2client.DATA, 0, sid, b"x"),
    ],
}


def metric(s, name):
    return s.metrics().get(name, 0.0)


def wait_metric(s, name, pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        value = metric(s, name)
        if pred(value):
            return value
        assert time.monotonic() < deadline, f"{name} = {value}"
        time.sleep(0.05)


def send(r, frames):
    try:
        r.send(*frames)
    except (BrokenPipeError, ConnectionResetError):
        pass


@pytest.mark.parametrize("how", sorted(PROVOKE))
def test_streams_the_server_resets_free_their_slots_for_other_clients(start_server, how):
    # Behind a load balancer every client has one address: no per-address cap to hide behind.
    s = start_server("--max-connections", 600, "--max-connections-per-address", 0)
    r = Raw(s.clients)
    sid = 1
    # 900 streams, 150 at a time every half second: within the reset budget (512 a second),
    # so the connection stays; without the fix each kept a slot and 600 filled the server.
    for _ in range(6):
        burst = []
        for _ in range(150):
            burst += PROVOKE[how](r, sid)
            sid += 2
        send(r, burst)
        time.sleep(0.5)
    r.send(frame(h2client.PING, 0, 0, b"12345678"))
    f, seen = r.until(lambda f: f[0] == h2client.PING and f[1] & h2client.ACK, timeout=10)
    assert f is not None, "the connection ended"
    assert not [x for x in seen if x[0] == h2client.GOAWAY]
    assert len([x for x in seen if x[0] == h2client.RST_STREAM]) >= 800
    # The flooding connection holds no stream; a fresh client is served.
    assert wait_metric(s, "clarion_h2_streams", lambda v: v == 0) == 0
    sock, _ = h2client.h1_sse(s.clients, "t")
    sock.close()
    r.close()


@pytest.mark.parametrize("how", sorted(PROVOKE))
def test_a_burst_of_provoked_resets_ends_the_connection_with_enhance_your_calm(start_server, how):
    s = start_server("--max-connections", 600, "--max-connections-per-address", 0)
    before = metric(s, "clarion_h2_errors_total")
    r = Raw(s.clients)
    burst = []
    for i in range(2000):
        burst += PROVOKE[how](r, 1 + 2 * i)
    send(r, burst)
    assert r.goaway(timeout=10)[0] == h2client.ENHANCE_YOUR_CALM
    wait_metric(s, "clarion_h2_errors_total", lambda v: v > before)
    assert wait_metric(s, "clarion_h2_streams", lambda v: v == 0) == 0
    sock, _ = h2client.h1_sse(s.clients, "t")
    sock.close()


def test_an_h2_connection_sending_only_pings_is_closed_at_the_handshake_timeout(start_server):
    s = start_server("--handshake-timeout", 2)
    r = Raw(s.clients)
    start = time.monotonic()
    goaway = None
    while time.monotonic() - start < 8 and goaway is None:
        send(r, [frame(h2client.PING, 0, 0, b"pingping")])
        f, _ = r.until(lambda f: f[0] in (h2client.GOAWAY, h2client.PING), timeout=5)
        if f is None:
            break
        if f[0] == h2client.GOAWAY:
            goaway = struct.unpack("!II", f[3][:8])[1]
        time.sleep(0.5)
    assert goaway == h2client.NO_ERROR, "still open after 8 s of PINGs"
    assert time.monotonic() - start < 5
    assert r.drain(5), "the connection stayed open after its GOAWAY"


def trickle_header_block(r, sid, every, limit):
    """Sends a header block's first byte, then a CONTINUATION byte every `every` seconds;
    returns (seconds until the server's GOAWAY, its code), or (None, None) after `limit`."""
    block = r.block("/sse?topic=t", extra=[("x-pad", "p" * 40)])
    start = time.monotonic()
    send(r, [frame(h2client.HEADERS, h2client.END_STREAM, sid, block[:1])])
    for i in range(1, len(block)):
        deadline = time.monotonic() + every
        while time.monotonic() < deadline:
            try:
                f = r.read(max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                f = ()
            if f is None:
                return time.monotonic() - start, None
            if f and f[0] == h2client.GOAWAY:
                return time.monotonic() - start, struct.unpack("!II", f[3][:8])[1]
        if time.monotonic() - start > limit:
            return None, None
        send(r, [frame(h2client.CONTINUATION, 0, sid, block[i : i + 1])])
    return None, None


def test_a_header_block_that_never_ends_closes_the_connection_at_the_handshake_timeout(start_server):
    s = start_server("--handshake-timeout", 2)
    r = Raw(s.clients)
    # A stream open, so the connection is not idle: only the block's own deadline applies.
    r.send(r.headers(1, "/sse?topic=t"))
    r.until(lambda f: f[0] == h2client.HEADERS and f[2] == 1)
    before = metric(s, "clarion_h2_errors_total")
    took, code = trickle_header_block(r, 3, every=0.5, limit=10)
    assert code == h2client.PROTOCOL_ERROR, f"after {took} s"
    assert took < 5
    wait_metric(s, "clarion_h2_errors_total", lambda v: v > before)


def test_a_header_block_on_the_api_must_end_within_the_request_deadline(start_server):
    s = start_server()
    r = Raw(s.api)
    r.until(lambda f: f[0] == h2client.SETTINGS)
    took, code = trickle_header_block(r, 1, every=2, limit=25)
    # The request deadline is 10 s; the idle limit (what held it before) 30 s.
    assert code == h2client.PROTOCOL_ERROR, f"after {took} s"
    assert 9 < took < 14


def request_block(r, fields):
    return r.enc.encode(fields)


@pytest.mark.parametrize(
    "fields",
    [
        [("host", "a.example"), ("host", "b.example")],
        [(":authority", "x y")],
        [(":authority", "a/b")],
        [(":authority", "user@localhost")],
        [(":authority", "localhost"), ("host", "elsewhere.example")],
        [("host", "a b")],
    ],
    ids=["two-hosts", "space", "slash", "userinfo", "host-differs", "bad-host"],
)
def test_a_request_naming_no_single_wellformed_host_is_refused(start_server, fields):
    s = start_server()
    r = Raw(s.clients)
    pseudo = [(n, v) for n, v in fields if n.startswith(":")]
    regular = [(n, v) for n, v in fields if not n.startswith(":")]
    block = request_block(r, [(":method", "GET"), (":scheme", "http"), *pseudo, (":path", "/nope"), *regular])
    r.send(frame(h2client.HEADERS, h2client.END_STREAM | h2client.END_HEADERS, 1, block))
    assert r.rst(1) == h2client.PROTOCOL_ERROR
    wait_metric(s, "clarion_h2_stream_errors_total", lambda v: v == 1)
    # The connection goes on.
    r.send(r.headers(3, "/nope"))
    assert r.response(3)[0] == 404


@pytest.mark.parametrize("honours", [True, False], ids=["client-honours", "client-ignores"])
def test_with_a_table_of_zero_the_fields_a_client_indexed_are_dropped_at_its_ack(start_server, honours):
    """`--h2-header-table 0` (docs/protocol.md, "HTTP/2"): the server advertises an HPACK table
    of 0 bytes. A client's first request, sent before it read that, indexes its fields in the
    default table; once the client acknowledges, the server has dropped them. A client that
    applies the setting starts its next block with the size update and is answered; one that
    ignores it refers to the dropped entries: COMPRESSION_ERROR."""
    s = start_server("--h2-header-table", 0)
    r = Raw(s.clients)
    r.honour_table_size = honours
    r.send(r.headers(1, "/nope", extra=[("x-trace", "a-value-worth-indexing")]))
    # Reading the answer reads (and acknowledges) the server's SETTINGS first.
    assert r.response(1)[0] == 404
    r.send(r.headers(3, "/nope", extra=[("x-trace", "a-value-worth-indexing")]))
    if honours:
        assert r.response(3)[0] == 404
    else:
        assert r.goaway()[0] == h2client.COMPRESSION_ERROR
