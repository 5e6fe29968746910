"""bench/compare.py's table (bench/compare_table.py), also when a saved run is shown again
(`--table-from`): the ticker's p50 floor (what the CPU measured allows the median latency of a
round to be at best, docs/benchmarks.md "What sets the ticker's p50"), computed per run and
shown beside the p50; and the ratios by pairs under each table."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPARE = ROOT / "bench" / "compare.py"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare_table",
                                                  ROOT / "bench" / "compare_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_floor_is_half_a_rounds_work_over_the_cores(compare):
    # 15,000 subscribers at 4.9 CPU-s per million on each side: 73.5 ms of the server's and
    # 73.5 of the clients' per round, on two cores 73.5 ms of wall time, half of it for half
    # the deliveries.
    assert compare.p50_floor_ms(4.9, 4.9, 15000, 2) == pytest.approx(36.75)
    # With more cores the same work spreads further.
    assert compare.p50_floor_ms(4.9, 4.9, 15000, 4) == pytest.approx(18.375)
    # A server on one thread does its 163.5 ms alone, whatever the clients cost.
    assert compare.p50_floor_ms(10.9, 5.6, 15000, 2, threads=1) == pytest.approx(81.75)
    # With two threads the machine's term is the larger again.
    assert compare.p50_floor_ms(10.0, 6.3, 15000, 2, threads=2) == pytest.approx(61.125)


def test_no_floor_without_both_sides_cpu(compare):
    assert compare.p50_floor_ms(None, 4.9, 15000, 2) is None
    assert compare.p50_floor_ms(4.9, None, 15000, 2) is None
    assert compare.p50_floor_ms(4.9, 4.9, 0, 2) is None
    assert compare.p50_floor_ms(4.9, 4.9, 15000, None) is None


def bench_json(server_cpu, client_cpu_s, p50_ms, n=15000, messages=30):
    """What `clarion bench --json` writes for a ticker, the fields the table reads."""
    expected = n * messages
    return {
        "connections": n, "opened": n, "connect_rate": 20000.0, "expected": expected,
        "verdict": {"in_order": expected, "missing": 0, "duplicated": 0, "reordered": 0},
        "latency": {"count": expected, "p50": int(p50_ms * 1000), "p99": int(p50_ms * 2000)},
        "connection_means": {"p99": int(p50_ms * 1000)},
        "deliveries_per_second": 29000.0, "server_cpu_per_million": server_cpu,
        "server_bytes_per_connection": 86.0, "kernel_bytes_per_connection": 7800.0,
        "bench_publish_cpu_seconds": client_cpu_s, "bench_wakeups": 9000,
    }


def test_a_saved_ticker_shows_each_peers_floor(tmp_path):
    # Clarion's clients cost 2.205 CPU-s over 450,000 deliveries (4.9 per million), µWebSockets'
    # at one thread 2.61 (5.8 per million); three runs each, the floor is each run's.
    runs = {
        "clarion/ws": [{"bench": bench_json(cpu, 2.205, 38.0)} for cpu in (4.7, 4.9, 5.1)],
        "uws-cpp@1/ws": [{"bench": bench_json(12.5, 2.61, 93.0)} for _ in range(3)],
    }
    saved = tmp_path / "ticker.json"
    saved.write_text(json.dumps({"scenario": "ticker", "n": 15000, "repeats": 3, "steps": [],
                                 "machine": {"nproc": 2}, "runs": runs, "notes": []}))
    out = subprocess.run([sys.executable, str(COMPARE), "--table-from", str(saved)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    head = next(line for line in out.splitlines() if line.startswith("| server"))
    cells = [c.strip() for c in head.strip("|").split("|")]
    floor = cells.index("p50 floor ms")
    assert cells[floor - 2] == "p50 ms", cells
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in out.splitlines() if line.startswith("| ")}
    # Clarion: the median run, 4.9 + 4.9 over two cores, halved.
    assert rows["Clarion"][floor] == "36.8", rows["Clarion"]
    # µWebSockets at one thread: its own 187.5 ms of the round, halved; no ratio to Clarion's.
    uws = next(v for k, v in rows.items() if k.startswith("µWebSockets"))
    assert uws[floor] == "93.8", uws


def test_ratios_by_pairs_are_each_repeats_own_and_skip_a_failed_run(tmp_path):
    # Each repeat's ratio: 5.2/4.0, 5.5/5.0, 9.0/6.0 = 1.30, 1.10, 1.50; the fourth repeat's
    # TLS run failed and pairs with nothing. The ratio of the medians would be 5.5/5.0 = 1.10.
    base = [{"bench": bench_json(cpu, 2.0, 30.0)} for cpu in (4.0, 5.0, 6.0, 5.0)]
    peer = [{"bench": bench_json(cpu, 2.0, 36.0)} for cpu in (5.2, 5.5, 9.0)]
    peer.append({"error": "timed out after 300 s"})
    saved = tmp_path / "pairs.json"
    saved.write_text(json.dumps({"scenario": "ticker", "n": 15000, "repeats": 4, "steps": [],
                                 "machine": {"nproc": 2}, "notes": [],
                                 "runs": {"clarion/ws": base, "clarion-tls/ws": peer}}))
    out = subprocess.run([sys.executable, str(COMPARE), "--table-from", str(saved)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "By pairs (each repeat's ratio to Clarion; median and range):" in out, out
    line = next(l for l in out.splitlines() if l.startswith("- Clarion, HTTP/1.1 over TLS"))
    assert "server CPU per delivery 1.30× (1.10–1.50)" in line, line
    assert "p50 1.20× (1.20–1.20)" in line, line
    # The table's own cell stays the ratio of the medians.
    assert "5.5 (1.10×)" in out, out
