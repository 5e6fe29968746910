"""`clarion bench` against the real server: a small run of each transport, checked end to end
(every delivery verified by the workers), a steady feed with no clumps, and a run that must
report losses when the server cuts its subscribers."""

import json
import subprocess
import time

import pytest

from cluster_util import wait_until
from conftest import _binary
from test_tls import make_dev_cert, tls_args


def bench(server, *args, target=None):
    path = f"/tmp/clarion-bench-{server.port}.json"
    proc = subprocess.run(
        [_binary(), "bench", "--target", target or server.clients, "--api", server.api,
         "--server-pid", str(server.proc.pid), "--json", path, *map(str, args)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    with open(path) as f:
        return json.load(f), proc.stdout + proc.stderr


def test_burst_over_websocket_sse_and_long_poll_is_delivered_exactly(start_server):
    server = start_server("--max-connections-per-address", 0)
    for transport in ("ws", "sse", "poll"):
        result, text = bench(server, "-n", 400, "--transport", transport, "--topics", 4,
                             "-m", 25, "--procs", 2)
        v = result["verdict"]
        assert result["opened"] == 400, text
        assert result["expected"] == 400 * 25
        assert (v["in_order"], v["missing"], v["duplicated"], v["reordered"]) == (400 * 25, 0, 0, 0)
        assert result["latency"]["count"] == 400 * 25
        assert result["server_cpu_per_million"] is not None
        assert "LOSSES" not in text


def test_ticker_feed_arrives_without_clumps_and_is_plotted(start_server, tmp_path):
    server = start_server()
    report = tmp_path / "report.html"
    result, text = bench(server, "-n", 100, "--interval-ms", 300, "-m", 5, "--size", 200,
                         "--report", report)
    assert result["verdict"]["in_order"] == 500, text
    assert result["clumped"] == 0
    assert "clumps" in text
    # 300 ms apart, every message finds each worker asleep.
    assert result["bench_wakeups"] >= 5, text
    assert f"woken {result['bench_wakeups']} times" in text
    assert len(result["samples"]) >= 2
    page = report.read_text()
    assert page.count("<polyline") == 4 and "Latency" in page


def test_a_worker_holds_its_connections_past_its_report_until_let_go(start_server):
    # The server's CPU "per delivery" is read between the last report and the closes: a worker
    # that closed its connections as it reported would put the server's closing work inside it.
    server = start_server("--max-connections-per-address", 0)
    open_ws = lambda: server.metrics().get('clarion_connections{transport="ws"}', 0)
    worker = subprocess.Popen([_binary(), "bench-worker"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        job = {"target": server.clients, "source": "127.0.0.1", "transport": "ws",
               "topics": ["held"] * 5, "connect_rate": 0, "interval_us": 0}
        worker.stdin.write(json.dumps(job) + "\n")
        worker.stdin.flush()
        while not json.loads(worker.stdout.readline()).get("ready"):
            pass
        wait_until(lambda: open_ws() == 5, 10, "5 WebSockets open")
        worker.stdin.write(json.dumps({"published": {"held": 0}, "deadline_ms": 1000}) + "\n")
        worker.stdin.flush()
        while "verdict" not in (line := json.loads(worker.stdout.readline())):
            pass
        assert line["opened"] == 5
        time.sleep(0.5)
        assert worker.poll() is None, "the worker left as it reported"
        assert open_ws() == 5
        worker.stdin.close()
        assert worker.wait(timeout=10) == 0
        wait_until(lambda: open_ws() == 0, 10, "the closes after the worker was let go")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_losses_are_reported_loudly(start_server):
    # A tiny backlog cap and big messages: the server cuts subscribers that lag, and the
    # checker must count what they never received.
    server = start_server("--max-backlog", 1024, "--max-connections-per-address", 0)
    result, text = bench(server, "-n", 300, "-m", 200, "--size", 60000, "--drain", 5)
    v = result["verdict"]
    assert v["missing"] > 0, text
    assert "LOSSES" in text


def test_churn_gives_back_every_open_file(start_server):
    # Three cycles of 300 connections opened, fed and closed: the server's open files must be
    # back to what they were before the first (a leaked socket per connection would leave
    # hundreds), and RSS must not keep what the connections held.
    server = start_server("--max-connections-per-address", 0)
    result, text = bench(server, "--scenario", "churn", "-n", 300, "--rounds", 3, "--procs", 2)
    c = result["churn"]
    assert c["opened"] == [300, 300, 300], text
    assert c["fds_baseline"] is not None and c["fds_after"] is not None, text
    assert c["fds_after"] <= c["fds_baseline"] and c["fds_returned"], text
    assert "LEAK" not in text and "churn open files" in text
    assert c["rss_after"] - c["rss_baseline"] < 4 << 20, text
    assert result["expected"] == 900 and result["verdict"]["in_order"] == 900, text


def test_steps_report_memory_per_connection_at_each(start_server):
    server = start_server("--max-connections-per-address", 0)
    result, text = bench(server, "--steps", "100,400", "-m", 2, "--procs", 2)
    assert [s["opened"] for s in result["steps"]] == [100, 400], text
    assert all(s["server_bytes_per_connection"] is not None for s in result["steps"])
    assert result["verdict"]["in_order"] == 800
    assert "step     400" in text


@pytest.mark.parametrize("tls", [False, True], ids=["ws", "wss"])
def test_the_million_path_small_holds_every_connection_and_checks_every_delivery(
        start_server, tmp_path, tls):
    # `bench/million.sh`'s path at 600 connections: two topics per connection (everyone's and a
    # room), keep-alive pings, two rounds, over clear text and TLS 1.3.
    extra = tls_args(make_dev_cert(tmp_path)) if tls else []
    server = start_server("--max-connections-per-address", 0, *extra)
    ca = ["--tls-ca", str(tmp_path / "ca.pem")] if tls else []
    result, text = bench(server, "--scenario", "million", "-n", 600, "--hold", 4,
                         "--interval-ms", 2000, "--topics", 30, "--drain", 20, *ca,
                         target=server.tls if tls else None)
    assert result["opened"] == 600 and result["tls"] == tls, text
    assert result["closed_by_server"] == 0 and not result["errors"], text
    assert result["rounds"] == 2
    for kind, expected in (("broadcast", 600 * 2), ("chat", 600 * 2)):
        v = result[kind]
        assert (v["in_order"], v["missing"], v["duplicated"], v["reordered"]) == \
            (expected, 0, 0, 0), text
    assert result["pings"] >= 600 and result["pongs"] == result["pings"], text
    assert ("over TLS 1.3" in text) == tls


def test_the_million_path_pings_only_publishes_nothing_and_answers_every_ping(start_server):
    # The Raspberry Pi seed's "a million sockets pinged every 16 s", at 300 connections and a
    # 1 s interval: nothing is published, every connection pings once a round, every ping is
    # answered, and the expected deliveries are zero (not the rounds).
    server = start_server("--max-connections-per-address", 0)
    result, text = bench(server, "--scenario", "million", "-n", 300, "--hold", 3,
                         "--interval-ms", 1000, "--topics", 10, "--drain", 10, "--pings-only")
    assert result["opened"] == 300 and result["closed_by_server"] == 0, text
    assert result["rounds"] == 3 and "pings only" in text
    assert (result["broadcast_expected"], result["chat_expected"]) == (0, 0), text
    assert result["broadcast"]["in_order"] == 0 and result["chat"]["in_order"] == 0, text
    assert result["pings"] >= 600 and result["pongs"] == result["pings"], text
    assert result["ping_rtt"]["count"] == result["pongs"], text
    assert "clean" in text


@pytest.mark.parametrize("tls", [False, True], ids=["h2c", "h2"])
@pytest.mark.parametrize("streams", [1, 10])
@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_streams_over_http2_are_delivered_exactly(start_server, tmp_path, tls, streams,
                                                  transport):
    # `--http2`: 200 subscribers as streams, one or ten per connection, over h2c (prior
    # knowledge) and h2 (ALPN over TLS 1.3): SSE streams, or WebSockets opened with RFC 8441's
    # extended CONNECT; every delivery checked per stream.
    extra = tls_args(make_dev_cert(tmp_path)) if tls else []
    server = start_server("--max-connections-per-address", 0, *extra)
    ca = ["--tls-ca", str(tmp_path / "ca.pem")] if tls else []
    result, text = bench(server, "-n", 200, "--transport", transport, "--http2",
                         "--streams-per-conn", streams, "--topics", 4, "-m", 20, "--procs", 2,
                         *ca, target=server.tls if tls else None)
    v = result["verdict"]
    assert result["opened"] == 200 and not result["errors"], text
    assert result["protocol"] == ("h2" if tls else "h2c")
    assert result["streams_per_connection"] == streams
    assert result["tcp_connections"] == 200 // streams, text
    assert (v["in_order"], v["missing"], v["duplicated"], v["reordered"]) == (200 * 20, 0, 0, 0)
    assert result["latency"]["count"] == 200 * 20
    assert "LOSSES" not in text and "protocol" in text
    assert result["stream"] == ("WebSocket" if transport == "ws" else "SSE stream"), text


def test_http2_against_a_port_without_it_fails_clearly(start_server):
    # A port that answers the h2c preface in HTTP/1.1 (here a server with HTTP/2 off; in the
    # field a proxy or an older build) is one clear error per connection, not a hang or a crash.
    server = start_server("--max-connections-per-address", 0, "--http2", "false")
    result, text = bench(server, "-n", 20, "--transport", "sse", "--http2", "-m", 1,
                         "--drain", 2)
    assert result["opened"] == 0, text
    assert result["errors"] == {
        "h2: the server answered in HTTP/1.1 (no h2c prior knowledge)": 20}, text
    assert "LOSSES" in text
    # HTTP/2 carries SSE streams and WebSockets, not long-polls.
    proc = subprocess.run([_binary(), "bench", "--http2", "--transport", "poll"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--http2 opens SSE streams or WebSockets" in proc.stderr


@pytest.mark.parametrize("per_request,deflate", [(1, False), (7, True)])
def test_streams_scenario_checks_every_fragment_and_every_resume(start_server, per_request, deflate):
    # Issue 52's AI streams, small: 20 streams x 50 fragments x 3 subscribers, 10 resumers per
    # phase; the stream phase and the plain phase of the same shape twice, in alternating order.
    # Each fragment its own request, or 7 streams' fragments per batch (10 streams a publisher:
    # batches of 7 and 3) to subscribers that negotiated permessage-deflate.
    server = start_server("--max-connections-per-address", 0)
    result, text = bench(server, "--scenario", "streams", "--topics", 20, "--fragments", 50,
                         "--subscribers", 3, "--resumers", 10, "--fragment-rate", 100,
                         "--publishers", 2, "--repeats", 2, "--fragment-batch", per_request,
                         *(["--deflate"] if deflate else []))
    assert result["passed"], text
    assert (result["fragment_batch"], result["deflate"]) == (per_request, deflate), text
    # Compressed, the folded text and its envelope arrive in fewer bytes than the text itself.
    assert (result["resume_frame_vs_text"] < 1.0) == deflate, text
    assert [p["kind"] for p in result["phases"]] == ["stream", "plain", "plain", "stream"]
    for p in result["phases"]:
        assert (p["published"], p["complete"], p["failure_count"]) == (20 * 50, 60, 0), text
        assert p["resumes"] == 10 and p["server_cpu_per_delivery_us"] is not None, text
    # One folded message per resume, its data exactly the text so far.
    assert result["resume_messages_per_resume"] == 1.0, text
    assert result["resume_data_vs_text"] == 1.0, text
    assert len(result["cpu_ratios"]) == 2 and result["cpu_ratio_median"] > 0
    assert "verdict: PASS" in text


def test_streams_scenario_fails_when_a_resume_is_not_exact(start_server):
    # One message of history per topic: a plain subscriber resuming mid-way is told of a gap
    # (the fragments it missed are gone), which the check must count as a failure of the run.
    server = start_server("--max-connections-per-address", 0, "--history-size", 1)
    path = f"/tmp/clarion-bench-{server.port}-fail.json"
    proc = subprocess.run(
        [_binary(), "bench", "--target", server.clients, "--api", server.api,
         "--server-pid", str(server.proc.pid), "--json", path, "--scenario", "streams",
         "--topics", "5", "--fragments", "40", "--subscribers", "2", "--resumers", "5",
         "--fragment-rate", "100", "--publishers", "1", "--repeats", "1", "--drain", "5"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    with open(path) as f:
        result = json.load(f)
    assert not result["passed"]
    plain = next(p for p in result["phases"] if p["kind"] == "plain")
    assert plain["failure_count"] > 0 and any("gap" in f for f in plain["failures"]), plain
    assert "verdict: FAIL" in proc.stdout
