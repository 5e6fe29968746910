#!/usr/bin/env python3
"""What durable history (`history_dir`) costs a publish: server CPU per published message,
publish latency (request sent to answer read, one publish at a time over a kept-alive
connection) and disk bytes per message, with history in memory only, on disk with the default
fsync every second, and on disk with an fsync before every answer.

    cargo build --release -p clarion
    python3 bench/durable_publish.py --messages 5000 --repeats 3

With `--recovery`, it measures instead how long a restart takes with a full history: fill
history to `history_memory` (64 MiB by default) in batches of 100, stop gracefully, start again
on the same directory, and time the start until the ready line, three times:

    python3 bench/durable_publish.py --recovery --size 300

Each repeat runs every variant in turn (interleaved, so drift on a shared machine hits all
alike) on a fresh server and an empty directory, with no subscriber (the cost measured is the
publish path and the history write, not the fan-out; bench/compare.py measures delivery with
the peers `clarion-durable` and `clarion-durable-sync`). Prints medians and ratios against
memory-only history.
"""

import argparse
import http.client
import os
import pathlib
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLARION = os.environ.get("CLARION_BIN", str(ROOT / "target" / "release" / "clarion"))
TICK = os.sysconf("SC_CLK_TCK")
VARIANTS = {
    "memory": [],
    "disk, fsync every 1 s": ["--history-fsync-ms", "1000"],
    "disk, fsync every publish": ["--history-fsync-ms", "0"],
}


def cpu_seconds(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def run(name, extra, n, size, workdir):
    hist = pathlib.Path(tempfile.mkdtemp(dir=workdir))
    args = [CLARION, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
            "--history-size", "1000", "--workers", "1"]
    if name != "memory":
        args += ["--history-dir", str(hist), *extra]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline()
        api = dict(f.split("=", 1) for f in line.split()[2:])["api"]
        host, port = api.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        body = b"x" * size
        lat = []
        for _ in range(200):  # warm-up, not counted
            conn.request("POST", "/publish/t", body)
            conn.getresponse().read()
        cpu0 = cpu_seconds(p.pid)
        for i in range(n):
            t = time.perf_counter()
            conn.request("POST", f"/publish/t{i % 100}", body)
            r = conn.getresponse()
            r.read()
            lat.append(time.perf_counter() - t)
            assert r.status == 200, r.status
        cpu = cpu_seconds(p.pid) - cpu0
        disk = sum(f.stat().st_size for f in hist.glob("*.seg"))
        lat.sort()
        return {
            "cpu_us": cpu / n * 1e6,
            "p50_us": lat[len(lat) // 2] * 1e6,
            "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
            # 100 topics x 1000 held: every message of the run is still held on disk.
            "disk_b": disk / (n + 200) if name != "memory" else 0,
        }
    finally:
        p.terminate()
        p.wait()
        shutil.rmtree(hist, ignore_errors=True)


def recovery(size, topics=1000, total=200_000):
    """Seconds from exec to the ready line for a restart on a full history directory."""
    import json
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="clarion-durable-recovery-"))
    hist = workdir / "h"
    args = [CLARION, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
            "--history-dir", str(hist), "--history-size", "1000"]

    def start():
        t = time.perf_counter()
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        return p, time.perf_counter() - t, dict(f.split("=", 1) for f in line.split()[2:])["api"]

    try:
        p, t0, api = start()
        host, port = api.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        data = "x" * size
        for b in range(total // 100):
            msgs = [{"topic": f"t{(b * 100 + i) % topics}", "data": data} for i in range(100)]
            conn.request("POST", "/publish", json.dumps({"messages": msgs}).encode(),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            assert r.status == 200
        conn.close()
        p.terminate()
        p.wait()
        disk = sum(f.stat().st_size for f in hist.glob("*.seg"))
        times = []
        for _ in range(3):
            p, t, _ = start()
            times.append(t)
            p.terminate()
            _, err = p.communicate()
        held = [l for l in err.splitlines() if "messages recovered" in l]
        print(f"empty start {t0 * 1000:.0f} ms; {total} published of {size} B; on disk "
              f"{disk / 2**20:.1f} MiB; restarts {', '.join(f'{x * 1000:.0f}' for x in times)} ms")
        print(held[-1] if held else err)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--recovery", action="store_true", help="time a restart on full history")
    a = ap.parse_args()
    if a.recovery:
        recovery(a.size)
        return
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="clarion-durable-bench-"))
    results = {v: [] for v in VARIANTS}
    try:
        for r in range(a.repeats):
            for name, extra in VARIANTS.items():
                results[name].append(run(name, extra, a.messages, a.size, workdir))
                print(f"[{r + 1}/{a.repeats}] {name}: {results[name][-1]}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    med = {v: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for v, rs in results.items()}
    base = med["memory"]
    print(f"\n{a.messages} publishes of {a.size} bytes, one at a time, no subscriber; medians of "
          f"{a.repeats} (ratio to memory-only history)\n")
    print("| history | server CPU µs / publish | publish p50 µs | publish p99 µs | disk B / message |")
    print("|---|---|---|---|---|")
    for v, m in med.items():
        def cell(k):
            return f"{m[k]:.1f}" if v == "memory" else f"{m[k]:.1f} ({m[k] / base[k]:.2f}×)"
        disk = "–" if v == "memory" else f"{m['disk_b']:.0f}"
        print(f"| {v} | {cell('cpu_us')} | {cell('p50_us')} | {cell('p99_us')} | {disk} |")


if __name__ == "__main__":
    main()
