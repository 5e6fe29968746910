#!/usr/bin/env python3
"""The chaos soak's report (bench/soak.sh): reads the run's raw files and writes PREFIX.json
and PREFIX.md.

    soak_report.py RAW_DIR PREFIX --command "bench/soak.sh ..." --bench-status RC

RAW_DIR holds bench.json (`clarion bench --scenario soak --json`), events.jsonl (what the
script did and when), samples.csv (the group's RSS and open files at each mark) and
metrics.log (per-process `clarion_connections` and `clarion_resumes_total` every 2 s).
"""

import argparse
import collections
import csv
import json
import os
import re
import sys

# Marks before this share of the run are warm-up: clients still settling into their lives.
WARMUP_MARKS = 2
# RSS and open files may grow this much after warm-up and still count as flat.
FLAT = 0.05
# A drop this many seconds after "rolling upgrade done" still counts as the upgrade's.
UPGRADE_GRACE_S = 2


def load(raw):
    with open(os.path.join(raw, "bench.json")) as f:
        bench = json.load(f)
    with open(os.path.join(raw, "events.jsonl")) as f:
        events = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(raw, "samples.csv")) as f:
        samples = list(csv.DictReader(f))
    metrics = collections.defaultdict(list)  # (family, node) -> [(t, value)]
    line_re = re.compile(r'^(\S+) (clarion_\w+)\{node="([^"]+)"[^}]*\} (\S+)$')
    path = os.path.join(raw, "metrics.log")
    if os.path.exists(path):
        per = collections.defaultdict(float)
        with open(path) as f:
            for line in f:
                m = line_re.match(line.strip())
                if not m:
                    continue
                t, family, node, v = float(m[1]), m[2], m[3], float(m[4])
                per[(t, family, node)] += v  # connections: summed over transports
        for (t, family, node), v in sorted(per.items()):
            metrics[(family, node)].append((t, v))
    return bench, events, samples, metrics


def peak_rate(series, start, end):
    """Largest per-second increase of a counter over [start, end], a reset counting from 0."""
    pts = [(t, v) for t, v in series if start - 2 <= t <= end]
    best = 0.0
    for (t1, v1), (t2, v2) in zip(pts, pts[1:]):
        if t2 <= t1:
            continue
        base = v1 if v2 >= v1 else 0.0
        best = max(best, (v2 - base) / (t2 - t1))
    return best


def value_at(series, t):
    after = [v for s, v in series if s >= t]
    return after[0] if after else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("prefix")
    ap.add_argument("--command", default="")
    ap.add_argument("--bench-status", type=int, default=0)
    args = ap.parse_args()
    bench, events, samples, metrics = load(args.raw)
    t0 = next((e["unix"] for e in events if e["event"] == "publishing"), bench["publishing"][0])
    ms = lambda us: round(us / 1000.0, 1)

    # Reconnects per second around each chaos event, from the clients' side.
    timeline = {s: (rec, drops, fails) for s, rec, drops, fails in bench["timeline"]}

    def window(start, seconds, col):
        return max((timeline.get(s, (0, 0, 0))[col] for s in range(int(start), int(start) + seconds)), default=0)

    chaos = []
    names = sorted({node for (_, node) in metrics})
    for e in events:
        if e["event"] not in ("kill9", "redis_down", "rolling_upgrade_start"):
            continue
        row = {
            "event": e["event"],
            "detail": e["detail"],
            "at_s": round(e["unix"] - t0, 1),
            "clients_dropped_5s": sum(timeline.get(s, (0, 0, 0))[1] for s in range(int(e["unix"]), int(e["unix"]) + 5)),
            "peak_reconnects_per_s_30s": window(e["unix"], 30, 0),
            "publishes_failed": sum(timeline.get(s, (0, 0, 0))[2] for s in range(int(e["unix"]) - 1, int(e["unix"]) + 10)),
        }
        # The reconnect rate the restarted process itself sees (its resumes counter).
        if e["event"] == "kill9":
            m = re.search(r"node (\S+)", e["detail"])
            nodes = [m[1]] if m and m[1] != "?" else []
            end = e["unix"] + 30
        elif e["event"] == "rolling_upgrade_start":
            nodes = names
            done = next((x["unix"] for x in events if x["event"] == "rolling_upgrade_done" and x["unix"] >= e["unix"]), e["unix"] + 60)
            end = done + 30
        else:
            nodes, end = [], e["unix"]
        per_node = {}
        for n in nodes:
            series = metrics.get(("clarion_resumes_total", n), [])
            conns = metrics.get(("clarion_connections", n), [])
            per_node[n] = {
                "peak_resumes_per_s": round(peak_rate(series, e["unix"], end), 1),
                "connections_30s_after": value_at(conns, e["unix"] + 30),
            }
        if per_node:
            row["restarted_processes"] = per_node
        chaos.append(row)

    marks = [s for s in samples if s["elapsed_s"] != "end"]
    for s in marks:
        s["rss_mb"] = round(int(s["rss_kb"]) / 1024, 1)
    growth = {}
    if len(marks) > WARMUP_MARKS:
        base, last = marks[WARMUP_MARKS], marks[-1]
        for key, col in (("rss", "rss_kb"), ("open_files", "open_files")):
            b, l = int(base[col]), int(last[col])
            growth[key] = round((l - b) / b, 4) if b else None
    flat = all(g is not None and g <= FLAT for g in growth.values()) if growth else None

    # By client kind: what was checked, and the connections dropped during the rolling upgrade
    # (from SIGUSR1 to 2 s after "rolling upgrade done"): a hand-over drops none.
    windows = []
    for e in events:
        if e["event"] == "rolling_upgrade_start":
            done = next((x["unix"] for x in events if x["event"] == "rolling_upgrade_done" and x["unix"] >= e["unix"]), e["unix"] + 60)
            windows.append((int(e["unix"]), int(done) + UPGRADE_GRACE_S))
    in_upgrade = lambda sec: any(a <= sec <= b for a, b in windows)
    kinds = []
    for k in bench.get("kinds", []):
        why = collections.Counter()
        for sec, reason, n in k["errors"]:
            if in_upgrade(sec):
                why[reason] += n
        kinds.append({
            "kind": k["kind"],
            "clients": k["clients"],
            "subscriptions": k["subscriptions"],
            "delivered": k["counts"]["delivered"],
            "lost": k["lost"],
            "duplicated": k["counts"]["duplicated"],
            "reordered": k["counts"]["reordered"],
            "gap_notices": k["counts"]["gap_notices"],
            "never_received": k["never_received"],
            "dropped_total": sum(n for _, n in k["drops"]),
            "dropped_by_upgrade": sum(n for sec, n in k["drops"] if in_upgrade(sec)),
            "dropped_by_upgrade_why": dict(why),
        })
    upgrade_drops = sum(k["dropped_by_upgrade"] for k in kinds)

    c = bench["counts"]
    passed = bench["lost"] == 0 and c["duplicated"] == 0 and c["reordered"] == 0 and upgrade_drops == 0
    report = {
        "command": args.command,
        "passed": passed and args.bench_status == 0,
        "bench_status": args.bench_status,
        "clients": bench["clients"],
        "bench_processes": bench["procs"],
        "topics": bench["topics"],
        "duration_s": bench["duration_s"],
        "rate": bench["rate"],
        "life_s": bench["life_s"],
        "published": bench["published"],
        "unconfirmed_publishes": bench["unconfirmed"],
        "publish_errors": bench["publish_errors"],
        "delivered": c["delivered"],
        "lost": bench["lost"],
        "lost_examples": bench["lost_examples"],
        "duplicated": c["duplicated"],
        "reordered": c["reordered"],
        "gap_notices": c["gap_notices"],
        "announced_by_gap_notices": c["announced"],
        "unconfirmed_not_received": bench["unconfirmed_not_received"],
        "never_received": bench["never_received"],
        "not_caught_up": bench["not_caught_up"],
        "reconnect_ms": {
            "planned": {"count": bench["planned_reconnect"]["count"], "p50": ms(bench["planned_reconnect"]["p50"]), "p99": ms(bench["planned_reconnect"]["p99"])},
            "after_drop": {"count": bench["dropped_reconnect"]["count"], "p50": ms(bench["dropped_reconnect"]["p50"]), "p99": ms(bench["dropped_reconnect"]["p99"])},
        },
        "delivery_latency_ms": {"p50": ms(bench["latency"]["p50"]), "p99": ms(bench["latency"]["p99"])},
        "connection_ends": bench["errors"],
        "bench_cpu_seconds": round(bench["bench_cpu_seconds"], 1),
        "odd_arrivals": bench.get("odd", [])[:200],
        "chaos": chaos,
        "kinds": kinds,
        "upgrade_windows": windows,
        "dropped_by_upgrade": upgrade_drops,
        "marks": [{"at_s": s["elapsed_s"], "rss_mb": s["rss_mb"], "open_files": int(s["open_files"]), "processes": int(s["processes"])} for s in marks],
        "growth_after_warmup": growth,
        "flat": flat,
    }
    with open(args.prefix + ".json", "w") as f:
        json.dump(report, f, indent=2)

    md = []
    md.append(f"# Chaos soak: {'PASSED' if report['passed'] else 'FAILED'}\n")
    md.append(f"`{args.command}`: {report['clients']} clients ({report['bench_processes']} bench processes), "
              f"{report['topics']} topics, {report['rate']} messages/s for {report['duration_s']} s, "
              f"connection life ~{report['life_s']} s; `clarion serve --processes 3` with Redis (AOF on).\n")
    md.append("| messages | count |\n|---|---|")
    for k in ("published", "unconfirmed_publishes", "delivered", "lost", "duplicated", "reordered",
              "gap_notices", "announced_by_gap_notices", "unconfirmed_not_received", "never_received", "not_caught_up"):
        md.append(f"| {k.replace('_', ' ')} | {report[k]:,} |")
    md.append("")
    if kinds:
        md.append("By client kind (dropped by the upgrade: connections the server ended or that failed from "
                  f"SIGUSR1 to {UPGRADE_GRACE_S} s after `rolling upgrade done`):\n")
        md.append("| kind | clients | subscriptions | delivered (checked) | lost | duplicated | reordered | gap notices | dropped (whole run) | **dropped by the upgrade** |\n|---|---|---|---|---|---|---|---|---|---|")
        for k in kinds:
            why = "; ".join(f"{r}: {n}" for r, n in sorted(k["dropped_by_upgrade_why"].items()))
            md.append(f"| {k['kind']} | {k['clients']:,} | {k['subscriptions']:,} | {k['delivered']:,} | {k['lost']} | {k['duplicated']} | {k['reordered']} | {k['gap_notices']:,} | {k['dropped_total']:,} | **{k['dropped_by_upgrade']}**{' (' + why + ')' if why else ''} |")
        md.append("")
    r = report["reconnect_ms"]
    md.append(f"Reconnect latency (closed or dropped → subscribed again): at the end of a life "
              f"p50 {r['planned']['p50']} ms, p99 {r['planned']['p99']} ms ({r['planned']['count']:,}); "
              f"after the server dropped the connection (client backoff 0–1 s included) "
              f"p50 {r['after_drop']['p50']} ms, p99 {r['after_drop']['p99']} ms ({r['after_drop']['count']:,}).\n")
    md.append("| at (s) | event | clients dropped (5 s) | peak reconnects/s (30 s) | publishes failed (10 s) | restarted process: peak resumes/s, connections 30 s after |\n|---|---|---|---|---|---|")
    for row in chaos:
        rp = "; ".join(f"{n}: {v['peak_resumes_per_s']}/s, {v['connections_30s_after']}" for n, v in row.get("restarted_processes", {}).items())
        md.append(f"| {row['at_s']} | {row['event']} {row['detail']} | {row['clients_dropped_5s']} | {row['peak_reconnects_per_s_30s']} | {row['publishes_failed']} | {rp} |")
    md.append("")
    md.append("| mark (s) | RSS (MB, group) | open files (group) | processes |\n|---|---|---|---|")
    for s in report["marks"]:
        md.append(f"| {s['at_s']} | {s['rss_mb']} | {s['open_files']} | {s['processes']} |")
    md.append("")
    if growth:
        md.append(f"Growth from mark {WARMUP_MARKS} (after warm-up) to the last: RSS {growth['rss']:+.1%}, "
                  f"open files {growth['open_files']:+.1%} ({'flat' if flat else 'NOT flat'}: limit {FLAT:.0%}).\n")
    odd = [o for o in bench.get("odd", []) if o["kind"] in ("duplicate", "reordered")]
    if odd:
        md.append(f"First duplicated or reordered arrivals ({len(odd)} kept):\n")
        md.append("| at (s) | kind | topic | number | id | transport | previous id | resumed from | connection age (ms) | gap notices before |\n|---|---|---|---|---|---|---|---|---|---|")
        for o in odd[:20]:
            md.append(f"| {round(o['unix_ms'] / 1000 - t0, 1)} | {o['kind']} | {o['topic']} | {o['seq']} | {o['id']} | {o['transport']} | {o['previous_id']} | {o['resumed_from']} | {o['connection_age_ms']} | {o['gap_notices']} |")
        md.append("")
    md.append(f"Connection ends by kind: {json.dumps(report['connection_ends'])}. "
              f"Publish errors: {json.dumps(report['publish_errors'])}.\n")
    with open(args.prefix + ".md", "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
