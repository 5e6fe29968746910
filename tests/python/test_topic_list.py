"""`GET /topics` on the API listener: every topic with its subscribers and history, a page at a
time in name order (`?cursor=&limit=`), behind the dashboard's rights. The example in
docs/protocol.md ("Listing topics") is run as written."""

import contextlib
import json
import pathlib
import re
import subprocess
import time

import jwt
import pytest
import websockets.sync.client

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def get(server, path, headers=None):
    status, _, body = server.request("GET", path, headers=headers)
    return status, json.loads(body)


def wait_for_subscribers(server, want):
    """Until GET /topics shows `want` ({topic: subscribers}), at most 5 s."""
    deadline = time.monotonic() + 5
    while True:
        _, page = get(server, "/topics?limit=1000")
        seen = {t["topic"]: t["subscribers"] for t in page["topics"]}
        if all(seen.get(k) == v for k, v in want.items()) or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


def test_the_documented_example_pages_through_topics_with_their_counts(server):
    block = re.search(r"\*\*Listing topics\.\*\*.*?```sh\n(.*?)```", DOC.read_text(), re.S).group(1)
    lines = block.strip().splitlines()
    commands, outputs = lines[0::2], [json.loads(o.removeprefix("# ")) for o in lines[1::2]]
    assert len(commands) == 2 and all(c.startswith("curl -s ") for c in commands)
    # The setup the doc describes.
    with contextlib.ExitStack() as subs:
        for t in ("chat.lobby", "chat.lobby", "alerts"):
            subs.enter_context(websockets.sync.client.connect(f"ws://{server.clients}/ws?topic={t}"))
        for i in range(3):
            server.publish("news", f"m{i}")
        wait_for_subscribers(server, {"chat.lobby": 2, "alerts": 1})
        for command, expected in zip(commands, outputs):
            argv = [a.strip("'") for a in command.split()]
            argv[-1] = argv[-1].replace("127.0.0.1:8081", server.api)
            got = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout
            assert json.loads(got) == expected, (command, got)


def test_every_topic_is_listed_once_across_pages_in_name_order(server):
    names = [f"t{i:03d}" for i in range(25)]
    for n in reversed(names):
        server.publish(n, "x")
    seen, cursor, pages = [], "", 0
    while True:
        status, page = get(server, f"/topics?limit=7&cursor={cursor}")
        assert status == 200 and len(page["topics"]) <= 7 and page["total"] == 25 + (pages > 0)
        seen += [t["topic"] for t in page["topics"]]
        pages += 1
        if page["next"] is None:
            break
        cursor = page["next"]
        if pages == 1:
            # A topic created between pages, before the cursor, moves nothing after it.
            server.publish("a-late-topic", "x")
    assert seen == names and pages == 4


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=many"])
def test_a_limit_out_of_bounds_is_a_400_that_says_the_bounds(server, query):
    status, body = get(server, f"/topics?{query}")
    assert status == 400 and "1 to 1000" in body["error"], body


def test_the_list_needs_the_api_key_when_one_is_set(start_server):
    s = start_server("--api-key", "k3y")
    status, body = get(s, "/topics")
    assert status == 401 and "API key or an admin token" in body["error"], body
    assert get(s, "/topics", {"Authorization": "Bearer k3y"})[0] == 200


def test_with_tokens_on_only_an_admin_token_lists_topics(start_server):
    secret = "s" * 32
    s = start_server("--auth-secret", secret)
    now = int(time.time())

    def token(**clarion):
        claims = {"sub": "u", "iat": now, "exp": now + 60, "clarion": {"subscribe": ["*"], **clarion}}
        return {"Authorization": "Bearer " + jwt.encode(claims, secret, algorithm="HS256")}

    assert get(s, "/topics")[0] == 401
    assert get(s, "/topics", token())[0] == 401
    assert get(s, "/topics", token(admin=True))[0] == 200
