#!/usr/bin/env python3
"""Presence under a connect storm (docs/presence.md, docs/benchmarks.md "Presence").

N WebSockets, each with a token of its own identity, spread over ROOMS topics, opened at RATE
per second by `clarion bench --scenario idle` against `clarion serve --processes P` on a
private redis-server; held, then closed at once. Two kinds of run, interleaved so that they
share the machine's noise, medians over REPEATS:

  baseline   the same server and storm without presence_topics
  presence   presence_topics = bench*: every connection is a member of its room

Reported per kind: the server's CPU (its processes' utime + stime over the whole run, from
/proc) and Redis's, per connection (a join and a leave each); the server's resident memory
while every connection is held, the median of samples over the hold and the peak (presence
minus baseline, over N, is bytes per member in Clarion's processes); and, for presence, how
long after the last connection was counted by the server every room's membership in Redis was
exact (N members in ROOMS rooms), and how long after the last disconnect every room was empty.

    cargo build --release -p clarion
    python3 bench/presence/storm.py           # N=100000 ROOMS=10000 RATE=5000 PROCESSES=6 REPEATS=3

Environment: N, ROOMS, RATE, PROCESSES, REPEATS, CLARION_BIN, JSON (write the results there).
The run stops by itself: every wait is bounded.
"""

import json
import os
import pathlib
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("CLARION_BIN", str(ROOT / "target/release/clarion"))
N = int(os.environ.get("N", 100_000))
ROOMS = int(os.environ.get("ROOMS", 10_000))
RATE = int(os.environ.get("RATE", 5_000))
PROCESSES = int(os.environ.get("PROCESSES", 6))
REPEATS = int(os.environ.get("REPEATS", 3))
SECRET = "presence-storm-secret-of-32-bytes!!"
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pids):
    total = 0
    for pid in pids:
        try:
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def rss_bytes(pids):
    total = 0
    for pid in pids:
        try:
            total += int(pathlib.Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except OSError:
            continue
    return total


def children(pid):
    out = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


class Redis:
    """A tiny RESP client: enough for EVAL and INFO."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def call(self, *args):
        out = f"*{len(args)}\r\n".encode()
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += f"${len(a)}\r\n".encode() + a + b"\r\n"
        self.sock.sendall(out)
        return self._read()

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _read(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b"-"):
            return rest.decode()
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(65536)
            data, self.buf = self.buf[:n], self.buf[n + 2 :]
            return data
        if kind == b"*":
            return [self._read() for _ in range(int(rest))]
        raise ValueError(line)


COUNT = """
local rooms, members, conns = 0, 0, 0
for _, k in ipairs(redis.call('KEYS', 'clarion:*:pm:*')) do
  rooms = rooms + 1
  members = members + redis.call('HLEN', k)
end
for _, k in ipairs(redis.call('KEYS', 'clarion:*:pc:*')) do
  for _, n in ipairs(redis.call('HVALS', k)) do conns = conns + tonumber(n) end
end
return {rooms, members, conns}
"""


def group_connections(api):
    import urllib.request

    with urllib.request.urlopen(f"http://{api}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith('clarion_connections{transport="ws"}'):
                return int(float(line.rsplit(" ", 1)[1]))
    return 0


def one_run(kind, workdir):
    rport = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        cwd=workdir,
    )
    client, api = free_port(), free_port()
    args = [
        BIN, "serve", "--processes", str(PROCESSES), "--broker", f"redis://127.0.0.1:{rport}",
        "--listen", f"127.0.0.1:{client}", "--api-listen", f"127.0.0.1:{api}",
        "--auth-secret", SECRET, "--max-connections-per-address", "0",
    ]
    if kind == "presence":
        args += ["--presence-topics", "bench*"]
    time.sleep(0.3)
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        if not line.startswith("clarion ready"):
            raise RuntimeError(f"server did not start: {line!r}")
        pids = children(server.pid)
        r = Redis(rport)
        cpu0, rcpu0 = cpu_seconds(pids), cpu_seconds([redis.pid])
        marks = {"rss_samples": []}
        stop = threading.Event()

        def monitor():
            try:
                watch()
            except Exception as e:  # a broken monitor must say so, not hang the run
                marks["error"] = repr(e)
                print(f"monitor: {e!r}", file=sys.stderr)

        def watch():
            full = exact = None
            while not stop.is_set():
                now = time.monotonic()
                try:
                    conns = group_connections(f"127.0.0.1:{api}")
                except OSError:
                    conns = -1
                # Redis is read only while a count is awaited (it costs Redis CPU).
                awaited = full is not None and (exact is None or "empty" in marks)
                counts = r.call("EVAL", COUNT, 0) if kind == "presence" and awaited else [-1, -1, -1]
                marks["max_conns"] = max(marks.get("max_conns", 0), conns)
                if conns >= N and full is None:
                    full = marks["full"] = now
                if full is not None and conns >= N:
                    marks["rss_samples"].append(rss_bytes(pids))
                if kind == "presence" and full is not None and exact is None:
                    if counts[1] == N and counts[0] == ROOMS and counts[2] == N:
                        exact = marks["exact"] = now
                if full is not None and conns == 0 and "empty" not in marks:
                    marks["empty"] = now
                if "empty" in marks and (kind != "presence" or counts[0] == 0 and counts[2] == 0):
                    marks["settled"] = now
                    return
                time.sleep(0.1)

        mon = threading.Thread(target=monitor, daemon=True)
        mon.start()
        out = workdir / f"{kind}.json"
        bench = subprocess.run(
            [
                BIN, "bench", "--scenario", "idle", "-n", str(N), "--topics", str(ROOMS),
                "--connect-rate", str(RATE), "--jwt-secret", SECRET,
                "--target", f"127.0.0.1:{client}", "--api", f"127.0.0.1:{api}",
                "--json", str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=N / RATE + 300,
        )
        mon.join(timeout=60)
        stop.set()
        cpu, rcpu = cpu_seconds(pids) - cpu0, cpu_seconds([redis.pid]) - rcpu0
        result = json.loads(out.read_text()) if out.exists() else {}
        errors = result.get("errors") or result.get("connect_errors")
        got = {
            "kind": kind,
            "server_cpu_s": cpu,
            "redis_cpu_s": rcpu,
            "server_us_per_conn": cpu / N * 1e6,
            "redis_us_per_conn": rcpu / N * 1e6,
            # Held memory: the median of the samples taken while every connection was held
            # (the peak, also reported, includes what the storm's last moments allocated and
            # freed).
            "rss_held": statistics.median(marks["rss_samples"]) if marks["rss_samples"] else 0,
            "rss_peak": max(marks["rss_samples"], default=0),
            "exact_after_s": marks["exact"] - marks["full"] if "exact" in marks and "full" in marks else None,
            "empty_after_s": marks["settled"] - marks["empty"] if "settled" in marks and "empty" in marks else None,
            "max_conns": marks.get("max_conns"),
            "monitor_error": marks.get("error"),
            "bench_rc": bench.returncode,
            "bench_errors": errors,
        }
        if bench.returncode != 0 or errors:
            got["bench_tail"] = bench.stdout[-2000:]
            raise RuntimeError(f"the storm did not open every connection: {json.dumps(got)}")
        return got
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        redis.kill()
        redis.wait()


def main():
    runs = {"baseline": [], "presence": []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(REPEATS):
            for kind in (["baseline", "presence"] if i % 2 == 0 else ["presence", "baseline"]):
                got = one_run(kind, pathlib.Path(d))
                print(json.dumps(got), flush=True)
                runs[kind].append(got)

    def med(kind, key):
        vals = [r[key] for r in runs[kind] if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    b_cpu, p_cpu = med("baseline", "server_cpu_s"), med("presence", "server_cpu_s")
    b_rss, p_rss = med("baseline", "rss_held"), med("presence", "rss_held")
    summary = {
        "n": N, "rooms": ROOMS, "rate": RATE, "processes": PROCESSES, "repeats": REPEATS,
        "server_us_per_conn": {k: med(k, "server_us_per_conn") for k in runs},
        "redis_us_per_conn": {k: med(k, "redis_us_per_conn") for k in runs},
        "server_cpu_ratio": p_cpu / b_cpu if b_cpu else None,
        "bytes_per_member": (p_rss - b_rss) / N if p_rss and b_rss else None,
        "bytes_per_member_peak": (med("presence", "rss_peak") - med("baseline", "rss_peak")) / N
        if p_rss and b_rss
        else None,
        "exact_after_s": med("presence", "exact_after_s"),
        "empty_after_s": med("presence", "empty_after_s"),
        "runs": runs,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))
    if os.environ.get("JSON"):
        pathlib.Path(os.environ["JSON"]).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
