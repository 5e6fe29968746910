#!/usr/bin/env python3
"""An upgrade that keeps connections, at scale: N WebSocket connections (spread over T topics
and several client processes) receive a steady publishing loop while `clarion serve
--upgrade-from PID` replaces the server. Reports how long the hand-over took (the old
process's own log: from the request to the acknowledgement, and how long its broker was
frozen), the longest delivery latency during the hand-over against the longest in the same
run's steady state, and checks that every connection stayed open and got every message of its
topic once, in order.

    cargo build --release -p clarion
    python3 bench/handover.py --connections 15000 --repeats 3
    python3 bench/handover.py --connections 15000 --repeats 3 --with-state
    python3 bench/handover.py --connections 15000 --repeats 3 --tls
    .ci/.venv/bin/python bench/handover.py --connections 3000 --repeats 3 --browser-mix  # needs h2

Every repeat measures clear WebSocket connections first, then, in the same repeat, each variant
asked for, and reports each one's medians and its ratios to the clear run of the same repeat:
`--with-state` turns authentication and presence on (every connection holds its own JWT, every
topic is a presence room, so every connection is a member under its own identity): what
carrying the rights, deadline and room membership of each connection costs the hand-over;
`--tls` runs the connections over TLS 1.3 (whose record layer, keys and sequence numbers move
with them); `--browser-mix` runs what browsers and the project's clients make, over TLS 1.3: a
third each permessage-deflate WebSockets that subscribed in-band with a compressed message,
HTTP/2 connections (ALPN h2) with one SSE stream, and HTTP/2 connections with six (so 8/3
streams per connection; each stream must get every message of its topic once, in order).

Latency is publish-to-arrival: the publisher stamps each message with the time of its first
attempt (a publish refused while the broker is frozen is sent again, keeping its stamp), and
each client subtracts it on arrival (CLOCK_MONOTONIC is shared by the processes of one host).
Every loop is bounded: the publisher stops after --seconds, the clients after the last message
or --seconds + 60.
"""

import argparse
import base64
import hashlib
import hmac
import json
import http.client
import multiprocessing as mp
import os
import pathlib
import queue
import re
import selectors
import socket
import ssl
import statistics
import tempfile
import struct
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLARION = os.environ.get("CLARION_BIN", str(ROOT / "target" / "release" / "clarion"))


def start(extra):
    p = subprocess.Popen(
        [CLARION, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = p.stdout.readline()
    if not line.startswith("clarion ready"):
        p.kill()
        raise RuntimeError(f"server did not start: {line!r} {p.stderr.read()}")
    fields = dict(part.split("=", 1) for part in line.split()[2:])
    return p, fields["clients"], fields["api"], fields.get("tls")


# With --with-state: the JWT secret and API key of the server, and its extra flags.
SECRET = "bench-handover-secret-long-enough-0123456789"
API_KEY = "bench-handover-api-key"
STATE_FLAGS = ["--auth-secret", SECRET, "--api-key", API_KEY, "--presence-topics", "t*"]


def b64(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def token(sub, topic):
    """An HS256 token for `sub` granting `topic`, valid for an hour."""
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = {"sub": sub, "exp": int(time.time()) + 3600, "clarion": {"subscribe": [topic]}}
    signed = f"{head}.{b64(json.dumps(body).encode())}"
    mac = hmac.new(SECRET.encode(), signed.encode(), hashlib.sha256).digest()
    return f"{signed}.{b64(mac)}"


def client_proc(addr, first, count, topics, deadline, ready, go, out, ca=None, state=False):
    """Opens `count` connections (conn i follows topic (first + i) % topics; over TLS 1.3
    trusting `ca` when given; each with its own token when `state`), then reads until every
    one has `expected[topic]` messages (sent by the parent through `go`) or `deadline`."""
    host, port = addr.rsplit(":", 1)
    sel = selectors.DefaultSelector()
    conns = {}
    tls = None
    if ca:
        tls = ssl.create_default_context(cafile=ca)
        tls.minimum_version = ssl.TLSVersion.TLSv1_3
    for i in range(count):
        topic = (first + i) % topics
        s = socket.create_connection((host, int(port)), timeout=30)
        if tls:
            s = tls.wrap_socket(s, server_hostname="localhost")
        key = base64.b64encode(os.urandom(16)).decode()
        auth = f"&token={token(f'u{first + i}', f't{topic}')}" if state else ""
        s.sendall(
            f"GET /ws?topic=t{topic}{auth} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                raise RuntimeError("closed during the handshake")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        assert b" 101 " in head, head
        s.setblocking(False)
        conns[s.fileno()] = [s, topic, rest, 0]  # socket, topic, buffer, last number seen
        sel.register(s, selectors.EVENT_READ)
    ready.put(count)
    expected = None  # per topic, sent by the parent once publishing is over
    lat = []  # (publish stamp, latency)
    errors, ended = 0, 0
    while time.monotonic() < deadline:
        if expected is None:
            try:
                expected = go.get_nowait()
            except queue.Empty:
                pass
        if expected is not None and all(c[3] == expected[c[1]] for c in conns.values()):
            break
        for key, _ in sel.select(timeout=0.2):
            c = conns[key.fd]
            try:
                data = c[0].recv(262144)
                # Records already decrypted by OpenSSL do not make the socket readable again.
                while tls and data and c[0].pending():
                    data += c[0].recv(262144)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                continue
            except OSError:
                data = b""
            if not data:
                ended += 1
                sel.unregister(c[0])
                continue
            now = time.monotonic()
            buf = c[2] + data
            while len(buf) >= 2:
                n = buf[1] & 0x7F
                at = 2
                if n == 126:
                    if len(buf) < 4:
                        break
                    n = struct.unpack("!H", buf[2:4])[0]
                    at = 4
                elif n == 127:
                    if len(buf) < 10:
                        break
                    n = struct.unpack("!Q", buf[2:10])[0]
                    at = 10
                if len(buf) < at + n:
                    break
                op = buf[0] & 0x0F
                payload = buf[at : at + n]
                buf = buf[at + n :]
                if op == 8:
                    ended += 1
                    continue
                if op != 1:
                    continue
                num, stamp = payload.split(b":")[:2]
                num = int(num)
                if num != c[3] + 1:
                    errors += 1
                c[3] = num
                stamp = float(stamp)
                lat.append((stamp, now - stamp))
            c[2] = buf
    short = sum(1 for c in conns.values() if expected is None or c[3] != expected[c[1]])
    out.put({"errors": errors, "ended": ended, "short": short, "lat": lat})


# With --browser-mix: what browsers and the project's clients make over TLS, a third each:
# permessage-deflate WebSockets that subscribed in-band with a compressed message, HTTP/2
# connections (ALPN h2) with one SSE stream, and HTTP/2 connections with six.
MIX_KINDS = ("deflate_ws", "h2_1", "h2_6")


class Stream:
    """One subscription's progress: its topic, its buffer, the last number seen."""

    def __init__(self, topic):
        self.topic, self.buf, self.last = topic, b"", 0


def _read_blocking(s, want):
    buf = b""
    while want not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("closed during the handshake")
        buf += chunk
    return buf


def _mix_open(kind, host, port, topic, ws_ctx, h2_ctx):
    """Opens one mix connection; returns (socket, state) with the state's handshake done."""
    import zlib

    import h2.config
    import h2.connection
    import h2.events

    s = socket.create_connection((host, int(port)), timeout=30)
    if kind == "deflate_ws":
        s = ws_ctx.wrap_socket(s, server_hostname="localhost")
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(
            f"GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n".encode()
        )
        head, _, rest = _read_blocking(s, b"\r\n\r\n").partition(b"\r\n\r\n")
        assert b" 101 " in head and b"permessage-deflate" in head, head
        # The in-band subscribe, compressed (RSV1) and masked, as the browser client sends it.
        z = zlib.compressobj(wbits=-15)
        body = z.compress(json.dumps({"type": "subscribe", "topic": f"t{topic}"}).encode())
        body += z.flush(zlib.Z_SYNC_FLUSH)
        body = body[:-4]
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(body))
        s.sendall(bytes([0xC1, 0x80 | len(body)]) + mask + masked)
        return s, {"kind": kind, "streams": {0: Stream(topic)}, "buf": rest}
    s = h2_ctx.wrap_socket(s, server_hostname="localhost")
    assert s.selected_alpn_protocol() == "h2", s.selected_alpn_protocol()
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.increment_flow_control_window(1 << 24)
    streams = {}
    for _ in range(6 if kind == "h2_6" else 1):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(
            sid,
            [(":method", "GET"), (":path", f"/sse?topic=t{topic}"), (":scheme", "https"),
             (":authority", "localhost")],
            end_stream=True,
        )
        streams[sid] = Stream(topic)
    s.sendall(conn.data_to_send())
    answered = set()
    while len(answered) < len(streams):
        data = s.recv(65536)
        if not data:
            raise RuntimeError("closed during the HTTP/2 requests")
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                assert dict(ev.headers).get(b":status") == b"200", ev.headers
                answered.add(ev.stream_id)
        out = conn.data_to_send()
        if out:
            s.sendall(out)
    return s, {"kind": kind, "streams": streams, "h2": conn, "buf": b""}


def _numbered(st, payload, now, lat):
    """Counts one message `NUMBER:STAMP:...` of stream `st`; returns 1 when out of order."""
    if payload.startswith(b"{"):
        return 0  # the answer to an in-band subscribe
    num, stamp = payload.split(b":")[:2]
    num = int(num)
    bad = int(num != st.last + 1)
    st.last = num
    lat.append((float(stamp), now - float(stamp)))
    return bad


def _mix_feed(c, data, now, lat):
    """Takes bytes of mix connection `c`; returns (out of order, ended)."""
    import zlib

    import h2.events

    errors = ended = 0
    if c["kind"] == "deflate_ws":
        st = c["streams"][0]
        buf = c["buf"] + data
        while len(buf) >= 2:
            n, at = buf[1] & 0x7F, 2
            if n == 126:
                if len(buf) < 4:
                    break
                n, at = struct.unpack("!H", buf[2:4])[0], 4
            elif n == 127:
                if len(buf) < 10:
                    break
                n, at = struct.unpack("!Q", buf[2:10])[0], 10
            if len(buf) < at + n:
                break
            first, payload, buf = buf[0], buf[at : at + n], buf[at + n :]
            if first & 0x0F == 8:
                ended += 1
            elif first & 0x0F == 1:
                if first & 0x40:  # compressed on its own (shared frames): a fresh inflater
                    payload = zlib.decompressobj(wbits=-15).decompress(payload + b"\x00\x00\xff\xff")
                errors += _numbered(st, payload, now, lat)
        c["buf"] = buf
        return errors, ended
    conn = c["h2"]
    for ev in conn.receive_data(data):
        if isinstance(ev, h2.events.DataReceived):
            conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            st = c["streams"].get(ev.stream_id)
            if st is None:
                continue
            st.buf += ev.data
            while b"\n\n" in st.buf:
                event, st.buf = st.buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        errors += _numbered(st, line[5:].lstrip(), now, lat)
        elif isinstance(ev, (h2.events.StreamReset, h2.events.StreamEnded, h2.events.ConnectionTerminated)):
            ended += 1
    out = conn.data_to_send()
    if out:
        c["sock"].setblocking(True)
        c["sock"].sendall(out)
        c["sock"].setblocking(False)
    return errors, ended


def mix_client_proc(addr, first, count, topics, deadline, ready, go, out, ca):
    """As `client_proc` for the browser mix over TLS 1.3 (connection i is of kind
    MIX_KINDS[i % 3]); every stream must get every message of its topic once, in order."""
    host, port = addr.rsplit(":", 1)
    ws_ctx = ssl.create_default_context(cafile=ca)
    ws_ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    h2_ctx = ssl.create_default_context(cafile=ca)
    h2_ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    h2_ctx.set_alpn_protocols(["h2"])
    sel = selectors.DefaultSelector()
    conns = {}
    for i in range(count):
        topic = (first + i) % topics
        s, c = _mix_open(MIX_KINDS[(first + i) % 3], host, port, topic, ws_ctx, h2_ctx)
        c["sock"] = s
        s.setblocking(False)
        conns[s.fileno()] = c
        sel.register(s, selectors.EVENT_READ)
    ready.put(count)
    expected, lat = None, []
    errors = ended = 0
    streams = [st for c in conns.values() for st in c["streams"].values()]
    while time.monotonic() < deadline:
        if expected is None:
            try:
                expected = go.get_nowait()
            except queue.Empty:
                pass
        if expected is not None and all(st.last == expected[st.topic] for st in streams):
            break
        for key, _ in sel.select(timeout=0.2):
            c = conns[key.fd]
            try:
                data = c["sock"].recv(262144)
                while data and c["sock"].pending():
                    data += c["sock"].recv(262144)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                continue
            except OSError:
                data = b""
            if not data:
                ended += 1
                sel.unregister(c["sock"])
                continue
            e, d = _mix_feed(c, data, time.monotonic(), lat)
            errors += e
            ended += d
    short = sum(1 for st in streams if expected is None or st.last != expected[st.topic])
    out.put({"errors": errors, "ended": ended, "short": short, "lat": lat,
             "streams": [st.topic for st in streams]})


def publish_loop(api, topics, rate, seconds, counts, headers):
    """Publishes round-robin over the topics at `rate` per second for `seconds`; each payload is
    `NUMBER:STAMP:padding`, NUMBER counting per topic. Returns (refused attempts, stamps)."""
    host, port = api.rsplit(":", 1)
    refused, t0 = 0, time.monotonic()
    i = 0
    while time.monotonic() - t0 < seconds:
        topic = i % topics
        counts[topic] += 1
        stamp = time.monotonic()
        body = f"{counts[topic]}:{stamp:.6f}:{'x' * 32}".encode()
        while True:
            try:
                c = http.client.HTTPConnection(host, int(port), timeout=10)
                c.request("POST", f"/publish/t{topic}", body, headers)
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    break
                assert r.status == 503, r.status
            except OSError:
                pass
            refused += 1
            assert time.monotonic() - stamp < 30, "a publish was refused for 30 s"
            time.sleep(0.005)
        i += 1
        next_at = t0 + i / rate
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    return refused


# The same flags for the old and the new process; one address opens every connection.
FLAGS = ["--max-connections-per-address", "0"]


def dev_cert():
    """A development CA and certificate (`clarion cert --dev`): (ca, cert, key) paths."""
    d = tempfile.mkdtemp(prefix="clarion-handover-bench-")
    subprocess.run([CLARION, "cert", "--dev", "--dir", d], check=True, capture_output=True)
    return tuple(os.path.join(d, f"{k}.pem") for k in ("ca", "cert", "key"))


def one_run(args, cert=None, state=False, mix=False):
    flags = FLAGS + (STATE_FLAGS if state else [])
    if cert:
        flags += ["--tls-listen", "127.0.0.1:0", "--tls-cert", cert[1], "--tls-key", cert[2]]
    old, clients, api, tls = start(flags)
    try:
        return measure(
            args, old, tls if cert else clients, api, flags, cert[0] if cert else None, state, mix
        )
    finally:
        old.kill()


def measure(args, old, clients, api, flags, ca, state, mix=False):
    ctx = mp.get_context("fork")
    ready, out = ctx.Queue(), ctx.Queue()
    gos = []
    per = args.connections // args.procs
    deadline = time.monotonic() + args.seconds + 120
    procs = []
    for k in range(args.procs):
        go = ctx.Queue()
        gos.append(go)
        if mix:
            p = ctx.Process(
                target=mix_client_proc,
                args=(clients, k * per, per, args.topics, deadline, ready, go, out, ca),
            )
        else:
            p = ctx.Process(
                target=client_proc,
                args=(clients, k * per, per, args.topics, deadline, ready, go, out, ca, state),
            )
        p.start()
        procs.append(p)
    for _ in procs:
        ready.get(timeout=300)
    counts = [0] * args.topics
    import threading

    result = {}

    def upgrader():
        time.sleep(args.seconds / 2)
        result["began"] = time.monotonic()
        new = subprocess.Popen(
            [CLARION, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
             *flags, "--upgrade-from", str(old.pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = new.stdout.readline()
        assert line.startswith("clarion ready"), (line, new.stderr.read())
        result["ready"] = time.monotonic()
        old.wait(timeout=60)
        result["old_exited"] = time.monotonic()
        result["new"] = new

    t = threading.Thread(target=upgrader)
    t.start()
    try:
        headers = {"Content-Type": "text/plain"}
        if state:
            headers["Authorization"] = f"Bearer {API_KEY}"
        refused = publish_loop(api, args.topics, args.rate, args.seconds, counts, headers)
    finally:
        t.join()
        for p in procs:
            if p.is_alive() and time.monotonic() > deadline:
                p.kill()
    for go in gos:
        go.put(counts)
    outs = [out.get(timeout=args.seconds + 180) for _ in procs]
    for p in procs:
        p.join()
    log = old.stderr.read()
    m = re.search(r"(\d+) connections moved in (\d+) ms \(frozen for (\d+) ms\)", log)
    assert m, log
    moved, took, frozen = int(m.group(1)), int(m.group(2)), int(m.group(3))
    new = result["new"]
    new.terminate()
    new.wait(timeout=30)
    lat = [x for o in outs for x in o["lat"]]
    began, acked = result["began"], result["old_exited"]
    during = [l for s, l in lat if began - 1 <= s <= acked + 1] or [0.0]
    steady = [l for s, l in lat if s < began - 1] or [0.0]
    return {
        "moved": moved,
        "handover_ms": took,
        "frozen_ms": frozen,
        "spawn_to_old_exit_ms": (acked - began) * 1000,
        "max_latency_during_ms": max(during) * 1000,
        "max_latency_steady_ms": max(steady) * 1000,
        "p99_steady_ms": statistics.quantiles(steady, n=100)[98] * 1000 if len(steady) > 100 else 0,
        "deliveries": len(lat),
        "expected": (
            sum(counts[t] for o in outs for t in o["streams"]) if mix
            else sum(counts[(k * per + i) % args.topics] for k in range(args.procs) for i in range(per))
        ),
        "out_of_order": sum(o["errors"] for o in outs),
        "ended": sum(o["ended"] for o in outs),
        "short": sum(o["short"] for o in outs),
        "refused_publishes": refused,
    }


def check(args, res):
    ok = (
        res["moved"] == args.connections
        and res["ended"] == 0
        and res["short"] == 0
        and res["out_of_order"] == 0
        and res["deliveries"] == res["expected"]
    )
    if not ok:
        print("FAILED: a connection ended, or a message was lost, repeated or reordered")
        sys.exit(1)


def report(args, name, runs):
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(
        f"\n{args.connections} {name} connections, {args.topics} topics, "
        f"{args.rate:g} publishes/s, median of {len(runs)}:\n"
        f"  hand-over (request to ack, old process's log): {med['handover_ms']:.0f} ms, "
        f"broker frozen {med['frozen_ms']:.0f} ms\n"
        f"  new process started to old process exited: {med['spawn_to_old_exit_ms']:.0f} ms\n"
        f"  longest delivery latency around the hand-over: {med['max_latency_during_ms']:.0f} ms; "
        f"in the steady state of the same runs: {med['max_latency_steady_ms']:.0f} ms "
        f"(ratio {med['max_latency_during_ms'] / max(med['max_latency_steady_ms'], 1e-3):.1f}); "
        f"steady p99 {med['p99_steady_ms']:.0f} ms\n"
        f"  every connection open, every message once and in order "
        f"({med['deliveries']:.0f} deliveries per run)"
    )
    return med


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=15000)
    ap.add_argument("--procs", type=int, default=6)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--rate", type=float, default=100, help="publishes per second")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tls", action="store_true", help="also over TLS 1.3, in the same repeats")
    ap.add_argument("--with-state", action="store_true",
                    help="also with auth and presence on, in the same repeats")
    ap.add_argument("--browser-mix", action="store_true",
                    help="also a browser-like mix over TLS 1.3, in the same repeats: a third "
                    "each deflate WebSockets that sent a compressed message, HTTP/2 connections "
                    "with 1 SSE stream, HTTP/2 connections with 6")
    args = ap.parse_args()
    modes = [("clear", {})]
    if args.with_state:
        modes.append(("with auth and presence (own token and room membership each)", {"state": True}))
    if args.tls:
        modes.append(("TLS 1.3", {"cert": dev_cert()}))
    if args.browser_mix:
        modes.append(("browser mix", {"cert": dev_cert(), "mix": True}))
    runs = {name: [] for name, _ in modes}
    for r in range(args.repeats):
        for name, kw in modes:
            res = one_run(args, **kw)
            print(f"run {r + 1} ({name}): {res}", flush=True)
            check(args, res)
            runs[name].append(res)
    meds = {name: report(args, name, runs[name]) for name, _ in modes}
    for name, _ in modes[1:]:
        per_run = [
            v["handover_ms"] / max(c["handover_ms"], 1e-3) for c, v in zip(runs["clear"], runs[name])
        ]
        ratio = lambda k: meds[name][k] / max(meds["clear"][k], 1e-3)  # noqa: E731
        print(
            f"\n{name} / clear: hand-over {ratio('handover_ms'):.2f} (medians; same-repeat ratios "
            f"{', '.join(f'{x:.2f}' for x in per_run)}), frozen {ratio('frozen_ms'):.2f}, new "
            f"started to old exited {ratio('spawn_to_old_exit_ms'):.2f}, longest latency around "
            f"the hand-over {ratio('max_latency_during_ms'):.2f}"
        )


if __name__ == "__main__":
    main()
