"""Upgrades that keep connections when authentication, backend hooks and presence are on: each
connection's rights and token deadline, the identity the `connect` hook gave it, its webhook
connection and its presence rooms move with it. The backend sees no disconnect/connect, the
rooms no leave/join, a token still ends at its own deadline (now in the new process), and a
client without a right is still refused."""

import json
import queue
import threading
import time

import httpx
import jwt
import websockets.sync.client

from test_handover import Publisher, upgrade, wait_exit
from test_hooks import Backend as HookBackend
from test_hooks import Receiver

JWT_SECRET = "a-handover-test-secret-long-enough-0123456"
HOOK_SECRET = "hook-secret-for-tests"
API_KEY = "handover-api-key"
KEYED = {"Authorization": f"Bearer {API_KEY}"}


def token(sub, exp_in=300, subscribe=("t", "room.*"), publish=()):
    claim = {"subscribe": list(subscribe), "publish": list(publish)}
    body = {"sub": sub, "exp": int(time.time()) + exp_in, "clarion": claim}
    return jwt.encode(body, JWT_SECRET, algorithm="HS256"), body["exp"]


class Backend(HookBackend):
    """The application's hooks: `connect` knows the session `s-alice` (identity, info and
    grants); `subscribe` allows `extra.*` only. Records every call with its time; with `stall`
    set, the first call waits 2 s."""

    def __init__(self):
        self.calls = []
        self.stall = None
        super().__init__(self.behave)

    def behave(self, kind, body):
        if self.stall is not None and not self.stall.is_set():
            self.stall.set()
            time.sleep(2)
        self.calls.append((time.monotonic(), kind, body))
        if kind == "connect":
            if body["cookies"].get("session") != "s-alice":
                answer = {"allow": False, "status": 401, "reason": "log in first"}
            else:
                answer = {"allow": True, "sub": "alice", "info": {"name": "Alice"},
                          "subscribe": ["t", "room.*"], "publish": ["t"]}
        elif body["topic"].startswith("extra."):
            answer = {"allow": True}
        else:
            answer = {"allow": False, "reason": "not for you"}
        return 200, {"Content-Type": "application/json"}, json.dumps(answer).encode()


class Conn(threading.Thread):
    """A client reading everything one connection gets: message numbers on `t`, presence
    events (with the time they came), other replies (in a queue), and how it ended."""

    def __init__(self, name):
        super().__init__(daemon=True)
        self.name = name
        self.got = []
        self.events = []  # (monotonic time, type, sub)
        self.listings = []
        self.replies = queue.Queue()
        self.expiring = 0
        self.ended = None
        self.ended_at = None
        self.close_code = None

    def on_json(self, m):
        kind = m.get("type")
        if kind == "message" and m.get("topic") == "t":
            self.got.append(int(m["data"].split(":", 1)[0][1:]))
        elif kind in ("join", "leave"):
            self.events.append((time.monotonic(), kind, m["member"]["sub"]))
        elif kind == "presence":
            self.listings.append(m)
        else:
            if kind == "expiring":
                self.expiring += 1
            self.replies.put(m)

    def reply(self, kind, timeout=10):
        deadline = time.monotonic() + timeout
        while True:
            m = self.replies.get(timeout=max(deadline - time.monotonic(), 0.01))
            if m.get("type") == kind:
                return m

    def run(self):
        try:
            self.read()
        except Exception as e:  # noqa: BLE001 - any end is recorded, the test judges it
            self.ended = repr(e)
        self.ended_at = time.monotonic()


class Ws(Conn):
    def __init__(self, server, name, query, headers=None):
        super().__init__(name)
        self.ws = websockets.sync.client.connect(
            f"ws://{server.clients}/ws?{query}", subprotocols=["clarion.v1"],
            additional_headers=headers or {}, open_timeout=10, compression=None,
        )

    def read(self):
        try:
            while True:
                self.on_json(json.loads(self.ws.recv()))
        except websockets.exceptions.ConnectionClosed as e:
            self.close_code = e.rcvd.code if e.rcvd else None
            raise

    def send(self, msg):
        self.ws.send(json.dumps(msg))


class Sse(Conn):
    def __init__(self, server, name, query):
        super().__init__(name)
        self.url = f"http://{server.clients}/sse?{query}"
        self.ready = threading.Event()

    def read(self):
        with httpx.Client(timeout=httpx.Timeout(10, read=120)) as c:
            with c.stream("GET", self.url) as r:
                assert r.status_code == 200, r.read()
                self.ready.set()
                event, data = "message", []
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        event = line[len("event: "):]
                    elif line.startswith("data: "):
                        data.append(line[len("data: "):])
                    elif line == "" and data:
                        text = "\n".join(data)
                        if event == "message":
                            self.got.append(int(text.split(":", 1)[0][1:]))
                        else:
                            self.on_json(json.loads(text))
                        event, data = "message", []
        raise EOFError("stream ended")


def members(server):
    status, _, body = server.request("GET", "/topics/room.a/presence", headers=KEYED)
    assert status == 200, body
    listing = json.loads(body)
    return sorted((m["sub"], json.dumps(m.get("info"))) for m in listing["members"])


def wait_until(pred, timeout=10, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_auth_hooks_and_presence_move_with_their_connections(start_server):
    backend, receiver = Backend(), Receiver(secret=HOOK_SECRET)
    flags = [
        "--auth-secret", JWT_SECRET,
        "--api-key", API_KEY,
        "--hook-connect-url", f"{backend.url}/hooks/connect",
        "--hook-subscribe-url", f"{backend.url}/hooks/subscribe",
        "--hook-secret", HOOK_SECRET,
        "--webhook-url", receiver.url,
        "--webhook-batch-ms", "20",
        "--allow-client-publish",
        "--presence-topics", "room.*",
    ]
    old = start_server(*flags)
    topics = "topic=t&topic=room.a"
    # alice: identity, info and grants from the connect hook; listens to the room's events.
    alice = Ws(old, "alice", f"{topics}&presence=1", {"Cookie": "session=s-alice"})
    alice.start()
    wait_until(lambda: alice.listings, what="alice's member list")
    # bob: a token without publish rights (refreshed below with one more topic).
    bob_token, _ = token("bob")
    bob = Ws(old, "bob", f"{topics}&token={bob_token}")
    bob.start()
    # carol: an SSE stream that listens to the room.
    carol_token, _ = token("carol")
    carol = Sse(old, "carol", f"{topics}&presence=1&token={carol_token}")
    carol.start()
    assert carol.ready.wait(10)
    wait_until(lambda: carol.listings, what="carol's member list")
    # dave: a token that runs out a few seconds after the hand-over.
    dave_token, dave_exp = token("dave", exp_in=20)
    dave = Ws(old, "dave", f"{topics}&token={dave_token}")
    dave.start()
    for c in (alice, carol):
        wait_until(lambda c=c: ("join", "dave") in [(k, s) for _, k, s in c.events],
                   what=f"{c.name} sees dave join")
    # dave is warned once (its token expires within auth_expiry_warning).
    dave.reply("expiring")
    # bob refreshes: the new token also grants `bonus`.
    refreshed, _ = token("bob", subscribe=("t", "room.*", "bonus"))
    bob.send({"type": "refresh", "token": refreshed})
    assert bob.reply("authenticated")["sub"] == "bob"
    before = members(old)
    assert [m[0] for m in before] == ["alice", "bob", "carol", "dave"], before
    connected = receiver.wait_for(lambda ev: sum(e["type"] == "connected" for e in ev) == 4)
    conn_of = {e["sub"]: e["conn"] for e in connected if e["type"] == "connected"}
    assert sorted(conn_of) == ["alice", "bob", "carol", "dave"], connected

    n = 300
    pub = Publisher(old.api, n, headers=KEYED)
    pub.start()
    assert pub.progress.wait(30)
    handover_at = time.monotonic()
    hooks_before = len(backend.calls)
    events_before = len(receiver.delivered())
    new = upgrade(old, *flags)
    code = wait_exit(old.proc)
    log = old.proc.stderr.read()
    assert code == 0, log
    assert "4 connections moved" in log and "0 stay" in log, log
    # The room lists the same members, with the same info, in the new process.
    assert members(new) == before
    pub.join(timeout=90)
    assert len(pub.ids) == n
    for c in (alice, bob, carol):
        wait_until(lambda c=c: len(c.got) >= n, timeout=60, what=f"{c.name}'s messages")
        assert c.ended is None, (c.name, c.ended)
        assert c.got == list(range(1, n + 1)), (c.name, c.got[:5], c.got[-5:])
    assert dave.got == list(range(1, len(dave.got) + 1)), dave.got[-5:]

    # Rights: bob's refreshed token still grants `bonus`, still no publish; alice's identity
    # reaches the subscribe hook; nobody asked connect again.
    bob.send({"type": "subscribe", "topic": "bonus"})
    assert bob.reply("subscribed")["topic"] == "bonus"
    bob.send({"type": "publish", "topic": "t", "data": "not allowed"})
    refusal = bob.reply("error")
    assert refusal["error"] == "the token does not allow publishing to this topic", refusal
    alice.send({"type": "subscribe", "topic": "extra.a"})
    assert alice.reply("subscribed")["topic"] == "extra.a"
    after = backend.calls[hooks_before:]
    assert [(k, b.get("sub"), b.get("info"), b.get("topic")) for _, k, b in after] == [
        ("subscribe", "alice", {"name": "Alice"}, "extra.a")
    ], after
    assert [k for _, k, _ in backend.calls].count("connect") == 1

    # dave's token ends at its own deadline, by the new process: close 4001, warned once.
    dave.join(timeout=30)
    assert dave.close_code == 4001, (dave.ended, dave.close_code)
    # Within the coarse clock's precision: both processes count whole seconds and sweep once
    # a second.
    ended_unix = time.time() - (time.monotonic() - dave.ended_at)
    assert dave_exp - 1.2 <= ended_unix <= dave_exp + 3.5, (ended_unix, dave_exp)
    assert dave.expiring == 1
    gone = receiver.wait_for(lambda ev: any(e["type"] == "disconnected" for e in ev))
    time.sleep(0.5)
    # The backend saw no connection or topic come or go because of the hand-over: the events
    # since are the two topics subscribed after it, and dave's disconnect under the connection
    # id and identity it came with.
    since = receiver.delivered()[events_before:]
    assert [(e["type"], e.get("topic") or e.get("sub"), e.get("conn")) for e in since] == [
        ("topic_occupied", "bonus", None),
        ("topic_occupied", "extra.a", None),
        ("disconnected", "dave", conn_of["dave"]),
    ], since
    assert [e for e in gone if e["type"] == "disconnected"][0]["duration"] >= 15
    # The rooms' listeners saw no leave or join from the hand-over: dave's leave only.
    for c in (alice, carol):
        wait_until(lambda c=c: ("leave", "dave") in [(k, s) for _, k, s in c.events],
                   what=f"{c.name} sees dave leave")
        later = [(k, s) for t, k, s in c.events if t >= handover_at]
        assert later == [("leave", "dave")], (c.name, c.events)
        assert [(k, s) for _, k, s in c.events].count(("join", "dave")) == 1
    assert [m[0] for m in members(new)] == ["alice", "bob", "carol"]
    # alice's own end reaches the webhook under the id and identity the old process gave her.
    alice.ws.close()
    bye = receiver.wait_for(
        lambda ev: any(e["type"] == "disconnected" and e["sub"] == "alice" for e in ev)
    )
    assert [e["conn"] for e in bye if e["type"] == "disconnected" and e["sub"] == "alice"] == [
        conn_of["alice"]
    ]
    m = new.metrics()
    assert m['clarion_handover_connections{outcome="taken"}'] == 4
    backend.close()
    receiver.close()


def test_a_connection_waiting_for_a_hook_falls_back_and_is_counted(start_server):
    """A `connect` call in flight belongs to the old process: that connection is told to
    reconnect (reason `hook_wait`), and its retry is served by the new process."""
    backend = Backend()
    slow = backend.stall = threading.Event()
    flags = ["--auth-secret", JWT_SECRET, "--api-key", API_KEY,
             "--hook-connect-url", f"{backend.url}/hooks/connect"]
    old = start_server(*flags)
    cookie = {"Cookie": "session=s-alice"}
    outcome = {}

    def first_try():
        try:
            with websockets.sync.client.connect(
                f"ws://{old.clients}/ws?topic=t", additional_headers=cookie, open_timeout=10
            ) as ws:
                outcome["opened"] = ws.recv(timeout=10)
        except Exception as e:  # noqa: BLE001 - the fallback ends it one way or another
            outcome["ended"] = repr(e)

    t = threading.Thread(target=first_try, daemon=True)
    t.start()
    assert slow.wait(10)
    new = upgrade(old, *flags)
    assert wait_exit(old.proc) == 0
    log = old.proc.stderr.read()
    assert "0 connections moved" in log and "1 stay" in log and "(1 hook_wait)" in log, log
    t.join(timeout=20)
    assert "ended" in outcome, outcome
    # Its retry goes to the new process, which asks the hook itself.
    with websockets.sync.client.connect(
        f"ws://{new.clients}/ws?topic=t", additional_headers=cookie, open_timeout=10
    ) as ws:
        new.publish("t", "after", headers=KEYED)
        assert ws.recv(timeout=10) == "after"
    backend.close()
