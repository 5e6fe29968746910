"""Idempotent publishing (docs/protocol.md, "Idempotent publishing"): a publish repeated with
the same `Idempotency-Key` on the same topic within `idempotency_window` answers the first
publish's id and is not delivered again: on one node (HTTP/1.1 and the API's HTTP/2), across a
Redis cluster, and across a node that died after Redis took the message but before it answered.
The same for an appendable message's fragments (open, append, done)."""

import json
import select
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from cluster_util import cluster, free_port, wait_until  # noqa: F401  (the fixture)
from test_cluster import nodes, recv_json, ws_sub

pytestmark = pytest.mark.timeout(120)


def publish(node, topic, data, key=None):
    """(status, answer) of `POST /publish/{topic}`, with `key` as its Idempotency-Key."""
    headers = {"Content-Type": "text/plain"}
    if key is not None:
        headers["Idempotency-Key"] = key
    status, _, body = node.request("POST", f"/publish/{topic}", data.encode(), headers)
    return status, json.loads(body)


def drain(ws, quiet=0.5):
    """Every message that arrives until `quiet` seconds pass without one."""
    out = []
    while True:
        try:
            out.append(recv_json(ws, timeout=quiet))
        except TimeoutError:
            return out


def test_a_repeated_key_answers_the_first_id_and_is_delivered_once(server):
    ws = ws_sub(server, "orders")
    try:
        status, first = publish(server, "orders", "one", key="order-17")
        assert status == 200 and "repeat" not in first, first
        status, again = publish(server, "orders", "one, again", key="order-17")
        assert status == 200, again
        assert again["id"] == first["id"] and again["repeat"] is True, again
        # A key belongs to its topic; another key is another message.
        status, other = publish(server, "orders", "two", key="order-18")
        assert other["id"] != first["id"]
        got = [m["data"] for m in drain(ws)]
        assert got == ["one", "two"], got
    finally:
        ws.close()
    m = server.metrics()
    assert m["clarion_publish_repeats_total"] == 1
    assert m["clarion_messages_published_total"] == 2


@pytest.mark.parametrize(
    "key, why",
    [
        ("", "empty"),
        ("k" * 129, "longer than 128"),
        ("two words", "outside visible ASCII"),
    ],
)
def test_a_malformed_key_is_refused_with_400_and_counted(server, key, why):
    status, answer = publish(server, "orders", "x", key=key)
    assert status == 400, answer
    assert "Idempotency-Key" in answer["error"] and why in answer["error"], answer
    assert server.metrics()["clarion_idempotency_key_errors_total"] == 1


def test_a_key_on_a_batch_is_refused_rather_than_ignored(server):
    body = json.dumps({"messages": [{"topic": "t", "data": "x"}]}).encode()
    status, _, out = server.request(
        "POST", "/publish", body, {"Content-Type": "application/json", "Idempotency-Key": "k1"}
    )
    assert status == 400 and b"not to a batch" in out, out


def test_a_key_is_forgotten_after_the_window(start_server):
    s = start_server("--idempotency-window", "1")
    _, first = publish(s, "t", "a", key="k")
    _, again = publish(s, "t", "a", key="k")
    assert again == {**first, "repeat": True}
    time.sleep(1.1)
    _, later = publish(s, "t", "a", key="k")
    assert later["id"] != first["id"] and "repeat" not in later


def test_the_key_holds_over_the_apis_http2(server):
    from test_http2_api import curl

    answers = []
    for _ in range(2):
        status, rest = curl(
            "--http2-prior-knowledge",
            "-XPOST",
            f"http://{server.api}/publish/h2t",
            "-H",
            "Idempotency-Key: h2-key",
            "-d",
            "x",
        )
        assert status == "HTTP/2 200", (status, rest)
        answers.append(json.loads(rest.partition("\r\n\r\n")[2]))
    assert answers[1]["id"] == answers[0]["id"] and answers[1]["repeat"] is True, answers


def test_a_key_repeated_on_another_node_of_a_redis_cluster_is_not_delivered_again(cluster):
    _, (a, b) = nodes(cluster, 2)
    ws = ws_sub(b, "pay")
    try:
        _, first = publish(a, "pay", "charge 1", key="charge-1")
        _, again = publish(b, "pay", "charge 1", key="charge-1")
        assert again["id"] == first["id"] and again["repeat"] is True, again
        got = [m["data"] for m in drain(ws)]
        assert got == ["charge 1"], got
    finally:
        ws.close()


class WithholdingProxy:
    """A TCP proxy to Redis that, once `arm()`ed, forwards the next EVALSHA (the publish script)
    to Redis but keeps Redis's answer from the node, and sets `answered` when Redis has answered:
    the moment at which Redis holds the message and the node does not know it yet."""

    def __init__(self, target_port, needle=b"EVALSHA"):
        self.target = ("127.0.0.1", target_port)
        # What the withheld command holds: EVALSHA (any script call) unless told more.
        self.needle = needle
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.armed = threading.Event()
        self.answered = threading.Event()
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self):
        self.armed.set()

    def _accept(self):
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            upstream = socket.create_connection(self.target, timeout=5)
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client, upstream):
        withholding = False
        try:
            while not self.stop.is_set():
                ready, _, _ = select.select([client, upstream], [], [], 0.2)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    if s is client:
                        if self.armed.is_set() and self.needle in data and not self.answered.is_set():
                            withholding = True
                        upstream.sendall(data)
                    elif withholding:
                        self.answered.set()
                    else:
                        client.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def close(self):
        self.stop.set()
        self.listener.close()


def test_a_node_killed_after_redis_took_the_message_and_a_retry_on_another_node_deliver_once(
    cluster,
):
    redis = cluster.redis()
    proxy = WithholdingProxy(redis.port)
    try:
        a = cluster.node("--broker", f"redis://127.0.0.1:{proxy.port}", "--node-name", "a")
        b = cluster.node("--broker", redis.url, "--node-name", "b")
        ws = ws_sub(b, "ledger")
        try:
            # Nodes learn a topic's position on first use; warm both up with a keyless message.
            publish(a, "ledger", "warm-up")
            assert recv_json(ws)["data"] == "warm-up"
            proxy.arm()
            outcome = {}

            def first_attempt():
                try:
                    outcome["answer"] = publish(a, "ledger", "debit 40", key="debit-40")
                except (OSError, urllib.error.URLError) as e:
                    outcome["error"] = e

            t = threading.Thread(target=first_attempt, daemon=True)
            t.start()
            assert proxy.answered.wait(10), "Redis never answered the publish script"
            # Redis ran the script (the message is in its stream and was published to b);
            # node a dies before it can answer its publisher.
            a.kill9()
            t.join(10)
            assert "answer" not in outcome, outcome
            # The publisher retries on the other node with the same key.
            status, retry = publish(b, "ledger", "debit 40", key="debit-40")
            assert status == 200 and retry.get("repeat") is True, retry
            got = drain(ws, quiet=1.0)
            assert [m["data"] for m in got] == ["debit 40"], got
            assert got[0]["id"] == retry["id"]
        finally:
            ws.close()
    finally:
        proxy.close()


def keyed_fragment(node, topic, query, body, key):
    """(status, answer) of one fragment (`query`: stream=open, append_to=ID[&done=1]) sent with
    `key` as its Idempotency-Key."""
    headers = {"Content-Type": "text/plain", "Idempotency-Key": key}
    status, _, out = node.request("POST", f"/publish/{topic}?{query}", body.encode(), headers)
    return status, json.loads(out)


def same_receipt(first, again):
    """`again` is `first` repeated: the same answer, marked so."""
    assert again.get("repeat") is True and "repeat" not in first, (first, again)
    for f in ("id", "stream", "seq", "done"):
        assert again[f] == first[f], (f, first, again)


def test_a_retried_fragment_answers_its_first_receipt_and_is_appended_once(server):
    ws = ws_sub(server, "ai")
    try:
        status, opened = keyed_fragment(server, "ai", "stream=open", "Hel", "s-open")
        assert status == 200, opened
        sid = opened["stream"]
        _, again = keyed_fragment(server, "ai", "stream=open", "Hel", "s-open")
        same_receipt(opened, again)
        _, mid = keyed_fragment(server, "ai", f"append_to={sid}", "lo", "s-2")
        _, again = keyed_fragment(server, "ai", f"append_to={sid}", "lo", "s-2")
        same_receipt(mid, again)
        _, last = keyed_fragment(server, "ai", f"append_to={sid}&done=1", "!", "s-3")
        # The retried close is its first answer, not 409 closed.
        status, again = keyed_fragment(server, "ai", f"append_to={sid}&done=1", "!", "s-3")
        assert status == 200, again
        same_receipt(last, again)
        assert (last["seq"], last["done"]) == (3, True), last
        got = drain(ws)
        assert [(m["type"], m["seq"], m["data"]) for m in got] == [
            ("append", 1, "Hel"), ("append", 2, "lo"), ("append", 3, "!")
        ], got
    finally:
        ws.close()
    ws = ws_sub(server, "ai", since=sid.split("-")[0] + "-0")
    try:
        folded = recv_json(ws)
        assert (folded["stream"], folded["data"], folded["seq"]) == (sid, "Hello!", 3), folded
    finally:
        ws.close()
    assert server.metrics()["clarion_publish_repeats_total"] == 3


def test_a_fragment_retried_on_another_node_of_a_redis_cluster_is_appended_once(cluster):
    _, (a, b) = nodes(cluster, 2)
    subs = [ws_sub(a, "answer"), ws_sub(b, "answer")]
    try:
        _, opened = keyed_fragment(a, "answer", "stream=open", "Forty", "q-1")
        sid = opened["stream"]
        _, again = keyed_fragment(b, "answer", "stream=open", "Forty", "q-1")
        same_receipt(opened, again)
        _, mid = keyed_fragment(a, "answer", f"append_to={sid}", "-two", "q-2")
        _, again = keyed_fragment(b, "answer", f"append_to={sid}", "-two", "q-2")
        same_receipt(mid, again)
        _, last = keyed_fragment(b, "answer", f"append_to={sid}&done=1", ".", "q-3")
        status, again = keyed_fragment(a, "answer", f"append_to={sid}&done=1", ".", "q-3")
        assert status == 200, again
        same_receipt(last, again)
        for ws in subs:
            got = drain(ws)
            assert [(m["seq"], m["data"]) for m in got] == [(1, "Forty"), (2, "-two"), (3, ".")]
    finally:
        for ws in subs:
            ws.close()
    since = sid.split("-")[0] + "-0"
    for node in (a, b):
        ws = ws_sub(node, "answer", since=since)
        try:
            folded = recv_json(ws)
            assert (folded["data"], folded["seq"], folded.get("done")) == ("Forty-two.", 3, True)
        finally:
            ws.close()


def test_a_node_killed_after_redis_took_a_fragment_and_a_retry_on_another_node_append_once(
    cluster,
):
    redis = cluster.redis()
    # Only the stream script call carrying this fragment is withheld (not a timeout sweep).
    proxy = WithholdingProxy(redis.port, needle=b"lo, wor")
    try:
        a = cluster.node("--broker", f"redis://127.0.0.1:{proxy.port}", "--node-name", "a")
        b = cluster.node("--broker", redis.url, "--node-name", "b")
        ws = ws_sub(b, "tokens")
        try:
            # The stream opens on a (the script is loaded, the topic's position known).
            _, opened = keyed_fragment(a, "tokens", "stream=open", "Hel", "t-1")
            sid = opened["stream"]
            assert recv_json(ws)["data"] == "Hel"
            proxy.arm()
            outcome = {}

            def first_attempt():
                try:
                    outcome["answer"] = keyed_fragment(
                        a, "tokens", f"append_to={sid}", "lo, wor", "t-2"
                    )
                except (OSError, urllib.error.URLError) as e:
                    outcome["error"] = e

            t = threading.Thread(target=first_attempt, daemon=True)
            t.start()
            assert proxy.answered.wait(10), "Redis never answered the stream script"
            a.kill9()
            t.join(10)
            assert "answer" not in outcome, outcome
            status, retry = keyed_fragment(b, "tokens", f"append_to={sid}", "lo, wor", "t-2")
            assert status == 200 and retry.get("repeat") is True, retry
            assert (retry["stream"], retry["seq"]) == (sid, 2), retry
            _, last = keyed_fragment(b, "tokens", f"append_to={sid}&done=1", "ld", "t-3")
            assert last["seq"] == 3, last
            got = drain(ws, quiet=1.0)
            assert [(m["seq"], m["data"]) for m in got] == [(2, "lo, wor"), (3, "ld")], got
            assert got[0]["id"] == retry["id"]
        finally:
            ws.close()
    finally:
        proxy.close()
