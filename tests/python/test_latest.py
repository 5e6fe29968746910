"""The latest value with its position (docs/history.md, "The latest value"): `GET
/topics/{t}/latest` on the API, `since=latest` on every transport and in clarion.v1's subscribe
message, and the state-then-follow recipe under a concurrent publisher: the subscriber gets the
last message and then every later one, with no gap and no duplicate, on one node and across a
two-node Redis cluster. Batch publishing with per-message answers is here too (docs/protocol.md,
"Batch publishing")."""

import http.client
import json
import pathlib
import socket
import sys
import threading
import time

import jwt
import pytest

from cluster_util import cluster  # noqa: F401  (the fixture)
from test_cluster import Sse, nodes, recv_json, ws_sub

pytestmark = pytest.mark.timeout(120)

SECRET = "latest-tests-hs256-secret-of-enough-length"
API_KEY = "the-backend-api-key"


def token(subscribe=(), publish=()):
    body = {"sub": "alice", "exp": int(time.time()) + 300}
    body["clarion"] = {"subscribe": list(subscribe), "publish": list(publish)}
    return jwt.encode(body, SECRET, algorithm="HS256")


def client_get(node, target, headers=""):
    """(status, body) of a GET on the client listener."""
    host, port = node.clients.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def poll(node, query):
    """(status, body) of a long-poll request on the client listener."""
    return client_get(node, f"/poll?{query}")


def latest(node, topic, headers=None):
    status, _, body = node.request("GET", f"/topics/{topic}/latest", headers=headers)
    return status, json.loads(body)


class Publisher:
    """Publishes `1..count` on `topic` through one kept-alive API connection, in a thread."""

    def __init__(self, node, topic, count):
        self.node, self.topic, self.count = node, topic, count
        self.ids = {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        host, port = self.node.api.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        for i in range(1, self.count + 1):
            conn.request("POST", f"/publish/{self.topic}", str(i).encode(), {"Content-Type": "text/plain"})
            r = conn.getresponse()
            self.ids[i] = json.loads(r.read())["id"]
        conn.close()

    def wait_for(self, n):
        deadline = time.monotonic() + 20
        while len(self.ids) < n:
            assert time.monotonic() < deadline, f"only {len(self.ids)} published"
            time.sleep(0.002)

    def join(self):
        self.thread.join(60)
        assert not self.thread.is_alive()


def assert_unbroken(got, count, ids):
    """`got` (values with their ids) is `k, k+1, ..., count` for some k, each with its own id."""
    values = [int(d) for d, _ in got]
    assert values == list(range(values[0], count + 1)), values[:10]
    assert [i for _, i in got] == [ids[v] for v in values]


def test_latest_on_the_api_gives_the_last_message_with_its_id_and_404_before_any(server):
    status, answer = latest(server, "prices")
    assert status == 404 and "no message" in answer["error"], answer
    server.publish("prices", "1.00")
    last = server.publish("prices", b"\x00\xff", binary=True)
    status, answer = latest(server, "prices")
    assert status == 200, answer
    assert answer == {
        "type": "message", "topic": "prices", "id": last["id"], "encoding": "base64", "data": "AP8=",
    }
    status, answer = latest(server, "bad%20name")
    assert status == 400, answer


def test_latest_on_the_api_is_granted_as_a_subscription_is(start_server):
    s = start_server("--auth-secret", SECRET, "--api-key", API_KEY)
    s.publish("news", "hello", headers={"Authorization": f"Bearer {API_KEY}"})
    for headers, want in [
        ({"Authorization": f"Bearer {API_KEY}"}, 200),
        ({"Authorization": f"Bearer {token(subscribe=['news'])}"}, 200),
        ({"Authorization": f"Bearer {token(subscribe=['other'])}"}, 403),
        ({"Authorization": "Bearer not.a.token"}, 401),
        ({}, 401),
    ]:
        status, answer = latest(s, "news", headers)
        assert status == want, (headers, answer)
        if want == 200:
            assert answer["data"] == "hello"


def test_latest_on_the_client_listener_is_a_long_poll_since_latest_with_its_checks(start_server):
    s = start_server("--auth-secret", SECRET, "--api-key", API_KEY)
    s.publish("news", "first", headers={"Authorization": f"Bearer {API_KEY}"})
    last = s.publish("news", "second", headers={"Authorization": f"Bearer {API_KEY}"})
    ok = poll(s, f"topic=news&since=latest&timeout=0&token={token(subscribe=['news'])}")
    assert ok[0] == 200, ok
    body = json.loads(ok[1])
    assert [(m["data"], m["id"]) for m in body["messages"]] == [("second", last["id"])], body
    refused = poll(s, f"topic=news&since=latest&timeout=0&token={token(subscribe=['x'])}")
    assert refused[0] == 403, refused
    assert poll(s, "topic=news&since=latest&timeout=0")[0] == 401


def test_latest_on_the_client_listener_answers_the_message_with_a_subscriptions_checks(start_server):
    s = start_server("--auth-secret", SECRET, "--api-key", API_KEY)
    auth = {"Authorization": f"Bearer {API_KEY}"}
    assert client_get(s, f"/topics/news/latest?token={token(subscribe=['news'])}")[0] == 404
    s.publish("news", "first", headers=auth)
    last = s.publish("news", "second", headers=auth)
    # The token in the query (as a browser's EventSource sends it) or in the header.
    for target, header in [
        (f"/topics/news/latest?token={token(subscribe=['news'])}", ""),
        ("/topics/news/latest", f"Authorization: Bearer {token(subscribe=['news'])}\r\n"),
    ]:
        status, body = client_get(s, target, header)
        assert status == 200, body
        answer = json.loads(body)
        assert (answer["type"], answer["topic"]) == ("message", "news"), answer
        assert (answer["data"], answer["id"]) == ("second", last["id"]), answer
    assert client_get(s, f"/topics/news/latest?token={token(subscribe=['x'])}")[0] == 403
    assert client_get(s, "/topics/news/latest")[0] == 401
    assert client_get(s, f"/topics/bad%20name/latest?token={token(subscribe=['*'])}")[0] == 400
    # Percent-decoded once, as on the API listener: `news%2Eeu` is the topic `news.eu`.
    s.publish("news.eu", "eu", headers=auth)
    status, body = client_get(s, f"/topics/news%2Eeu/latest?token={token(subscribe=['news.*'])}")
    assert (status, json.loads(body)["data"]) == (200, "eu"), body


def ws_follow(node, topic, count, since="latest", in_band=False):
    """(data, id) of each message a clarion.v1 WebSocket started with `since` receives, up to
    `count`."""
    if in_band:
        ws = ws_sub(node)
        ws.send(json.dumps({"type": "subscribe", "topic": topic, "since": since}))
    else:
        ws = ws_sub(node, topic, since=since)
    got = []
    try:
        while not got or int(got[-1][0]) < count:
            m = recv_json(ws)
            if m.get("type") == "message":
                got.append((m["data"], m["id"]))
    finally:
        ws.close()
    return got


def sse_follow(node, topic, count):
    sse = Sse(node, f"{topic}&since=latest")
    got = []
    try:
        while not got or int(got[-1][0]) < count:
            i, _, data = sse.event()
            got.append((data, i))
    finally:
        sse.close()
    return got


@pytest.mark.parametrize("how", ["ws-url", "ws-in-band", "sse"])
def test_state_then_follow_under_a_concurrent_publisher_has_no_gap_and_no_duplicate(server, how):
    count = 400
    server.publish("doc", "0")
    pub = Publisher(server, "doc", count)
    pub.wait_for(100)
    if how == "sse":
        got = sse_follow(server, "doc", count)
    else:
        got = ws_follow(server, "doc", count, in_band=how == "ws-in-band")
    pub.join()
    assert int(got[0][0]) >= 100, "started mid-stream"
    assert int(got[0][0]) < count, "the publisher was still running"
    assert_unbroken(got, count, pub.ids)


def test_since_latest_on_a_topic_with_no_message_is_just_live(server):
    ws = ws_sub(server, "fresh", since="latest")
    try:
        sent = server.publish("fresh", "live")
        m = recv_json(ws)
        assert (m["data"], m["id"]) == ("live", sent["id"])
    finally:
        ws.close()


def test_state_then_follow_across_a_two_node_redis_cluster(cluster):
    _, (a, b) = nodes(cluster, 2)
    count = 300
    a.publish("quote", "0")
    pub = Publisher(a, "quote", count)
    pub.wait_for(80)
    status, state = latest(b, "quote")
    assert status == 200 and int(state["data"]) >= 80 and state["id"] == pub.ids[int(state["data"])]
    got = ws_follow(b, "quote", count)
    pub.join()
    assert int(got[0][0]) < count, "the publisher was still running"
    assert_unbroken(got, count, pub.ids)
    status, state = latest(b, "quote")
    assert (state["data"], state["id"]) == (str(count), pub.ids[count])


def batch(node, messages, headers=None):
    body = json.dumps({"messages": messages}).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    status, _, out = node.request("POST", "/publish", body, hdrs)
    return status, json.loads(out)


def test_a_batch_publishes_its_valid_messages_and_answers_each_bad_one_in_place(start_server):
    s = start_server("--auth-secret", SECRET, "--api-key", API_KEY)
    tok = {"Authorization": f"Bearer {token(publish=['a', 'b', 'c'], subscribe=['a', 'b', 'c'])}"}
    status, answer = batch(
        s,
        [
            {"topic": "a", "data": "a1"},
            {"topic": "b", "data": "b1"},
            {"topic": "bad topic", "data": "x"},
            {"topic": "b", "data": "b2", "encoding": "hex"},
            {"topic": "secret", "data": "s1"},
            {"topic": "c", "data": "c1", "key": "c-1"},
            {"topic": "c", "data": "c1 again", "key": "c-1"},
            {"data": "no topic"},
            {"topic": "a", "data": "a2"},
        ],
        tok,
    )
    assert status == 200, answer
    r = answer["results"]
    assert len(r) == 9
    assert r[0]["topic"] == "a" and "id" in r[0]
    # b: one bad message holds back the whole topic.
    assert r[1] == {"error": "not published: messages[3] of the same topic was refused", "status": 424}
    assert r[2]["status"] == 400 and "invalid topic" in r[2]["error"]
    assert r[3] == {"error": 'unknown encoding "hex"', "status": 400}
    assert r[4]["status"] == 403 and "secret" in r[4]["error"]
    assert "id" in r[5] and r[6]["id"] == r[5]["id"] and r[6]["repeat"] is True
    assert r[7]["status"] == 400 and r[7]["error"].startswith("invalid message")
    assert r[8]["topic"] == "a" and "id" in r[8]
    for topic, want in [("a", "a2"), ("c", "c1")]:
        assert latest(s, topic, tok)[1]["data"] == want
    assert latest(s, "b", tok)[0] == 404
    assert s.metrics()["clarion_batch_items_refused_total"] == 5
    # Only a body that is not a batch is refused whole.
    status, answer = batch(s, {"topic": "a"}, tok)
    assert status == 400 and answer["error"].startswith("invalid batch"), answer


def test_the_python_subscriber_starts_from_the_latest_value(server):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python" / "client" / "src"))
    from clarion_client.subscriber import Delivery, SyncSubscriber

    server.publish("doc2", "old")
    last = server.publish("doc2", "state")
    client = SyncSubscriber(f"ws://{server.clients}/ws", initial_delay=0.05, max_delay=0.4)
    try:
        items = client.subscribe("doc2", since="latest", timeout=10)
        assert next(items) == Delivery("doc2", last["id"], "state")
        later = server.publish("doc2", "next")
        assert next(items) == Delivery("doc2", later["id"], "next")
    finally:
        client.close()
