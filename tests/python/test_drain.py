"""The Helm chart's drain arithmetic, measured: a node holding N WebSockets with the chart's
settings (deploy/helm/clarion/values.yaml: `config`, and `drain` rendered as drain_period and
shutdown_timeout, as templates/configmap.yaml does) is terminated as the kubelet does it: the
preStop sleep, then SIGTERM. Every client must get Close 1001 (none reset, none left open),
the closes spread over drain_period, /healthz must answer 503 meanwhile, and the node must
exit 0 within terminationGracePeriodSeconds (the chart's sum: preStop + drain + shutdown +
margin), counted from the preStop's start as the kubelet counts it.

Two sizes:
- CI (default): N = 1,000 with the drain scaled down (preStop 1 s, drain 3 s, shutdown 2 s,
  the chart's margin): a few seconds.
- The chart's own numbers at N = 20,000, outside CI (about 90 s; docs/deploy.md):
      CLARION_DRAIN_N=20000 pytest tests/python/test_drain.py
  Any N >= 20,000 (or CLARION_DRAIN_CHART=1) takes values.yaml's drain unchanged.

No process holds more than 20,000 descriptors: the node is a `processes = 2` group (the
chart's extraConfig; a group needs a broker: a private Redis), so each member holds N/2, and
the clients are processes of at most 5,000 connections, each from its own loopback address."""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import yaml

from cluster_util import cluster, wait_until  # noqa: F401  (the fixture)
from conftest import ROOT

N = int(os.environ.get("CLARION_DRAIN_N", "1000"))
CHART = N >= 20000 or os.environ.get("CLARION_DRAIN_CHART") == "1"
PER_PROCESS = 5000

pytestmark = pytest.mark.timeout(120 if N < 5000 else 600)


def chart_values():
    return yaml.safe_load((ROOT / "deploy" / "helm" / "clarion" / "values.yaml").read_text())


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


def test_a_node_told_to_stop_as_the_kubelet_does_closes_every_client_with_1001_within_the_grace(
    cluster, tmp_path
):
    values = chart_values()
    drain = dict(values["drain"])
    if not CHART:
        drain.update(preStopSleepSeconds=1, drainPeriodSeconds=3, shutdownTimeoutSeconds=2)
    grace = drain["terminationGracePeriodSeconds"] or (
        drain["preStopSleepSeconds"] + drain["drainPeriodSeconds"]
        + drain["shutdownTimeoutSeconds"] + drain["graceMarginSeconds"]
    )  # fmt: skip
    # clarion.toml as the chart renders it, the listeners moved to loopback by the flags.
    config = {**values.get("extraConfig", {}), **values["config"]}
    config.update(drain_period=drain["drainPeriodSeconds"],
                  shutdown_timeout=drain["shutdownTimeoutSeconds"], processes=2)  # fmt: skip
    for key in ("listen", "api_listen"):
        config.pop(key)
    conf = tmp_path / "clarion.toml"
    conf.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in sorted(config.items())))
    redis = cluster.redis()
    node = cluster.node("--config", conf, "--broker", redis.url, "--workers", "1")

    procs = max(1, math.ceil(N / PER_PROCESS))
    counts = [N // procs + (1 if i < N % procs else 0) for i in range(procs)]
    host, port = node.clients.rsplit(":", 1)
    t_start = time.monotonic()
    deadline = t_start + 180 + grace
    clients = [
        subprocess.Popen(
            [sys.executable, str(pathlib.Path(__file__).with_name("drain_clients.py")), host,
             port, f"127.0.{90 + i}.1", str(c), "200", repr(deadline)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for i, c in enumerate(counts)
    ]
    try:
        for c, want in zip(clients, counts):
            line = c.stdout.readline()
            assert line.strip() == f"connected {want}", (line, c.stderr.read()[-2000:])
        connect_s = time.monotonic() - t_start
        wait_until(
            lambda: node.metrics().get('clarion_connections{transport="ws"}') == N,
            30, f"{N} WebSockets counted by the node",
        )  # fmt: skip

        # The kubelet: preStop first (the pod leaves the endpoints meanwhile), then SIGTERM,
        # then SIGKILL at the grace period, counted from the preStop's start.
        t_prestop = time.monotonic()
        time.sleep(drain["preStopSleepSeconds"])
        t_term = time.monotonic()
        node.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: node.healthz()[0] == 503, 5, "/healthz 503 while draining")
        try:
            code = node.proc.wait(timeout=grace - (t_term - t_prestop))
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running at the grace period ({grace} s): the kubelet kills it")
        t_exit = time.monotonic()
        assert code == 0

        got = {}
        for c in clients:
            out, err = c.communicate(timeout=60)
            for k, times in json.loads(out.strip().splitlines()[-1]).items():
                got.setdefault(k, []).extend(times)
        counts_by_code = {k: len(v) for k, v in got.items()}
        assert counts_by_code == {"1001": N}, counts_by_code
        closes = sorted(t - t_term for t in got["1001"])
        period = drain["drainPeriodSeconds"]
        print(
            f"\nN={N} connect {connect_s:.1f} s; after SIGTERM: first 1001 at {closes[0]:.2f} s,"
            f" median {closes[N // 2]:.2f} s, last {closes[-1]:.2f} s; exit at "
            f"{t_exit - t_term:.2f} s; from preStop {t_exit - t_prestop:.2f} s of {grace} s"
        )
        assert closes[0] >= 0 and closes[-1] <= period + drain["shutdownTimeoutSeconds"]
        # Spread over the drain period (a slice at a time), not all in the first instant.
        assert closes[-1] - closes[0] >= 0.5 * period, (closes[0], closes[-1])
        assert t_exit - t_prestop <= grace
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
                c.wait(timeout=10)
