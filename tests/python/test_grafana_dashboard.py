"""deploy/grafana/clarion.json names only metrics the server exposes: every metric in every
panel's query is in `/metrics` of a server with a Redis broker after a short run (a WebSocket
subscriber, a publish, a delivery)."""

import json
import pathlib
import re

import websockets.sync.client
from cluster_util import Redis

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "clarion.json"


def metric_names(expr):
    return {m for m in re.findall(r"\b(clarion_[a-z0-9_]+)", expr)}


def test_every_dashboard_query_names_a_metric_the_server_exposes(start_server, tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    wanted = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, (panel["title"], target["expr"])
            wanted |= names
    for var in dashboard["templating"]["list"]:
        wanted |= metric_names(var.get("query", "") if isinstance(var.get("query"), str) else "")
    redis = Redis(tmp_path)
    try:
        server = start_server("--broker", redis.url)
        with websockets.sync.client.connect(server.ws_url(topics=["t"])) as ws:
            server.publish("t", "hello")
            assert "hello" in str(ws.recv(timeout=10))
        exposed = {name.split("{", 1)[0] for name in server.metrics()}
        missing = sorted(wanted - exposed)
        assert not missing, f"the dashboard queries metrics /metrics does not have: {missing}"
    finally:
        redis.kill()
