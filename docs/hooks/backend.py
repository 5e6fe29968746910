"""A minimal application backend for Clarion's hooks (docs/hooks.md), standard library only.

    CLARION_HOOK_SECRET=s3cret python3 backend.py 8000

It answers the three hooks at /hooks/connect, /hooks/subscribe and /hooks/publish, and takes
webhook events at /hooks/events. Sessions are a dict here; a real application looks the cookie
up in its session store. Every request's Clarion-Signature is checked first; a request it
cannot trust gets 401. GET /stats shows what it was asked and told (for tests).
"""

import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = os.environ.get("CLARION_HOOK_SECRET", "").encode()
SESSIONS = {"s-alice": "alice", "s-admin": "admin"}
CALLS = {"connect": 0, "subscribe": 0, "publish": 0}
EVENTS = {}  # webhook events by type
SEEN = set()  # webhook event ids: a batch whose answer was lost is sent again
ONLINE = {}  # connection id -> user, from `connected` / `disconnected`


def verified(header: str, body: bytes, max_age: int = 300) -> bool:
    """Checks `Clarion-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`."""
    fields = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        t = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - t) > max_age:
        return False
    want = hmac.new(SECRET, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, fields.get("v1", ""))


def decide(kind: str, req: dict) -> dict:
    if kind == "connect":
        user = SESSIONS.get(req["cookies"].get("session", ""))
        if user is None:
            return {"allow": False, "status": 401, "reason": "log in first"}
        return {
            "allow": True,
            "sub": user,
            "info": {"name": user.title()},
            "subscribe": ["chat.*", f"user.{user}"],
            "topics": [f"user.{user}"],
        }
    if kind == "subscribe":
        if req["topic"].startswith("admin.") and req["sub"] != "admin":
            return {"allow": False, "reason": "admins only"}
        return {"allow": True}
    # publish: every client publish comes here (the connect answer grants none).
    return {"allow": True, "data": req["data"].replace("darn", "****")}


def record(events: list) -> None:
    """Webhook events, at least once and in order: an id seen before is a repeat."""
    for event in events:
        if event["id"] in SEEN:
            continue
        SEEN.add(event["id"])
        kind = event["type"]
        EVENTS[kind] = EVENTS.get(kind, 0) + 1
        if kind == "connected":
            ONLINE[event["conn"]] = event.get("sub")
        elif kind == "disconnected":
            ONLINE.pop(event["conn"], None)
        # topic_occupied / topic_vacated, and types added later: counted, nothing else.


class Hooks(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: Clarion reuses connections

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if SECRET and not verified(self.headers.get("Clarion-Signature", ""), body):
            return self.answer(401, {"allow": False, "reason": "bad signature"})
        kind = self.path.strip("/").split("/")[-1]
        if kind == "events":
            record(json.loads(body)["events"])
            return self.answer(200, {})
        if kind not in CALLS:
            return self.answer(404, {"error": "no such hook"})
        CALLS[kind] += 1
        self.answer(200, decide(kind, json.loads(body)))

    def do_GET(self):
        # /stats, for tests: hook calls by kind, webhook events by type, who is online.
        self.answer(200, {**CALLS, "events": EVENTS, "online": sorted(filter(None, ONLINE.values()))})

    def answer(self, status, obj):
        out = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 8000), Hooks)
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()
