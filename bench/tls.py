#!/usr/bin/env python3
"""TLS against clear text on the same Clarion process: CPU per million deliveries, connect
(handshake) rate, latency and losses, then the Raspberry Pi ticker over TLS.

One server runs with both listeners (certificate from `clarion cert --dev`). For each repeat,
`clarion bench` runs the same broadcast burst against the clear-text port and the TLS port,
one after the other; the table shows medians and the TLS / clear-text ratio. Then every TLS
subscriber gets one message every 2 s for `--ticker-seconds` (no drops, no clumps).

    python3 bench/tls.py                               # 10,000 subscribers, 3 repeats, 120 s ticker
    python3 bench/tls.py -n 2000 --repeats 1 --ticker-seconds 10   # quick look

Idle memory per TLS connection (against µWebSockets with OpenSSL) is
`bench/idle_memory.py --tls --plain --peer socketify`. Results: docs/benchmarks.md.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
BINARY = os.environ.get("CLARION_BIN", str(ROOT / "target" / "release" / "clarion"))


def bench(server, target, extra, out):
    args = [BINARY, "bench", "--target", target, "--api", server["api"],
            "--server-pid", str(server["pid"]), "--json", out, *extra]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return json.loads(pathlib.Path(out).read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--connections", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ticker-seconds", type=int, default=120)
    ap.add_argument("--ticker-connections", type=int, default=15000)
    ap.add_argument("--json", help="write all results here")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="clarion-tls-bench-")
    subprocess.run([BINARY, "cert", "--dev", "--dir", tmp], check=True, capture_output=True)
    proc = subprocess.Popen(
        [BINARY, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
         "--tls-listen", "127.0.0.1:0", "--tls-cert", f"{tmp}/cert.pem",
         "--tls-key", f"{tmp}/key.pem", "--max-connections-per-address", "0"],
        stdout=subprocess.PIPE, text=True,
    )
    fields = dict(p.split("=", 1) for p in proc.stdout.readline().split()[2:])
    server = {"pid": proc.pid, "api": fields["api"]}
    targets = {"clear": (fields["clients"], []), "tls": (fields["tls"], ["--tls-ca", f"{tmp}/ca.pem"])}
    results = {"clear": [], "tls": []}
    try:
        for r in range(args.repeats):
            for mode, (target, extra) in targets.items():
                res = bench(server, target, ["--scenario", "burst", "-n", str(args.connections), *extra],
                            f"{tmp}/{mode}-{r}.json")
                results[mode].append(res)
                v = res["verdict"]
                print(f"[{r + 1}/{args.repeats}] {mode:5}: {res['connect_rate']:.0f} connects/s, "
                      f"{res['server_cpu_per_million']:.2f} server CPU-s per million, "
                      f"p99 {res['latency']['p99'] / 1000:.1f} ms, "
                      f"lost {v['missing']} dup {v['duplicated']} reordered {v['reordered']}",
                      flush=True)

        def med(mode, f):
            return statistics.median(f(x) for x in results[mode])

        rows = [
            ("connects/s (handshakes)", lambda x: x["connect_rate"], "{:.0f}"),
            ("server CPU-s per million deliveries", lambda x: x["server_cpu_per_million"], "{:.2f}"),
            ("deliveries/s", lambda x: x["deliveries_per_second"], "{:.0f}"),
            ("latency p50 ms", lambda x: x["latency"]["p50"] / 1000, "{:.1f}"),
            ("latency p99 ms", lambda x: x["latency"]["p99"] / 1000, "{:.1f}"),
            ("server bytes per connection", lambda x: x["server_bytes_per_connection"] or 0, "{:.0f}"),
            ("lost + duplicated + reordered",
             lambda x: x["verdict"]["missing"] + x["verdict"]["duplicated"] + x["verdict"]["reordered"],
             "{:.0f}"),
        ]
        print(f"\nmedians over {args.repeats} runs, burst of 100 messages to {args.connections} subscribers:")
        print(f"{'':38} {'clear':>10} {'tls':>10} {'tls/clear':>10}")
        for name, f, fmt in rows:
            c, t = med("clear", f), med("tls", f)
            ratio = f"{t / c:.2f}" if c else "-"
            print(f"{name:38} {fmt.format(c):>10} {fmt.format(t):>10} {ratio:>10}")

        if args.ticker_seconds > 0:
            ticker = bench(server, targets["tls"][0],
                           ["--scenario", "ticker", "-n", str(args.ticker_connections),
                            "--messages", str(max(1, args.ticker_seconds // 2)), *targets["tls"][1]],
                           f"{tmp}/ticker.json")
            results["ticker"] = ticker
            v = ticker["verdict"]
            print(f"\nticker over TLS: {ticker['opened']} subscribers, one message every 2 s for "
                  f"{args.ticker_seconds} s: {v['received'] if 'received' in v else ticker['expected']} "
                  f"expected deliveries, lost {v['missing']}, duplicated {v['duplicated']}, "
                  f"reordered {v['reordered']}, clumped {ticker['clumped']}, "
                  f"p99 {ticker['latency']['p99'] / 1000:.1f} ms, "
                  f"{ticker['server_bytes_per_connection'] or 0:.0f} server B/conn")
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(results, indent=1))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
