"""The table of bench/compare.py: each run's figures, read from `clarion bench --json`, and
their medians per server side by side, with ratios to Clarion. Apart from compare.py so that
tests read it without starting a server (tests/python/test_bench_compare.py)."""

import statistics


def client_cpu_per_million(b):
    """The load client's CPU over the publishing window (every worker process), per million
    messages it received."""
    received = b["verdict"].get("in_order")
    cpu = b.get("bench_publish_cpu_seconds")
    return cpu / received * 1e6 if cpu is not None and received else None


def p50_floor_ms(server_cpu, client_cpu, subscribers, cores, threads=None):
    """The least median latency a ticker's round can have at the CPU it was measured to cost
    (CPU-s per million deliveries, server and client), in ms. Half of a round's deliveries are
    in only once their sends and reads are done, and the machine's cores do the round's work
    at best all at once; a server that names its threads (`@N`) does its part on N of them at
    most. On loopback both sides share the cores, so this is the floor the p50 sits on when the
    machine is busy for the whole round (docs/benchmarks.md, "What sets the ticker's p50")."""
    if server_cpu is None or client_cpu is None or not subscribers or not cores:
        return None
    server_ms = server_cpu * subscribers / 1e3  # CPU-s per million x deliveries = CPU-ms
    everything = (server_ms + client_cpu * subscribers / 1e3) / cores
    return max(everything, server_ms / threads if threads else 0.0) / 2


def metrics(b, planned=(), threads=None, cores=None):
    v = b["verdict"]
    client_cpu = client_cpu_per_million(b)
    m = {
        "bytes_per_conn": b.get("server_bytes_per_connection"),
        "kernel_per_conn": b.get("kernel_bytes_per_connection"),
        "connect_rate": b.get("connect_rate"),
        "cpu_per_million": b.get("server_cpu_per_million"),
        # The load client's own CPU over the same window (every worker process), per million
        # messages it received: a client that costs as much as the server competes with it
        # for the cores.
        "client_cpu_per_million": client_cpu,
        # Times the client's workers were woken over the same window, per thousand messages.
        "client_wakeups_per_k": (b["bench_wakeups"] / v["in_order"] * 1e3)
        if b.get("bench_wakeups") is not None and v.get("in_order") else None,
        "deliveries_per_s": b.get("deliveries_per_second"),
        "p50_ms": b["latency"]["p50"] / 1000,
        "p99_ms": b["latency"]["p99"] / 1000,
        # Where the CPU measured puts the p50 of a ticker's round at best (p50_floor_ms).
        "p50_floor_ms": p50_floor_ms(b.get("server_cpu_per_million"), client_cpu,
                                     b.get("connections"), cores, threads),
        # The worst-treated 1% of subscribers: their mean latency over the run.
        "conn_mean_p99_ms": (b.get("connection_means") or {}).get("p99", 0) / 1000 or None,
        "opened": b.get("opened"),
        "lost": v["missing"], "dup": v["duplicated"], "reordered": v["reordered"],
    }
    # Steps are named by the connections asked for (a peer that refuses some opens fewer).
    for target, s in zip(planned, b.get("steps") or []):
        m[f"bytes_per_conn@{target}"] = s.get("server_bytes_per_connection")
    c = b.get("churn")
    if c:
        m["fds_left"] = (c["fds_after"] - c["fds_baseline"]) if c.get("fds_after") is not None \
            and c.get("fds_baseline") is not None else None
        m["rss_left_mib"] = ((c["rss_after"] - c["rss_baseline"]) / 2**20) \
            if c.get("rss_after") is not None and c.get("rss_baseline") is not None else None
    return m


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, digits=0):
    if x is None:
        return "—"
    if abs(x) >= 100 or digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


# The figures whose ratio to the base is also given by pairs under each table.
PAIRED = (("cpu_per_million", "server CPU per delivery"), ("p50_ms", "p50"), ("p99_ms", "p99"))


def paired_metrics(runs, base_runs):
    """Each repeat's figures (`metrics`) beside the base's of the same repeat (the servers take
    turns within it, so machine noise that lasts a repeat hits both), where both ran."""
    return [(metrics(r["bench"]), metrics(b["bench"]))
            for r, b in zip(runs, base_runs) if "bench" in r and "bench" in b]


def pair_ratios(pairs, key):
    """Each pair's ratio in figure `key`, where both have the figure."""
    return [x / y for x, y in ((m.get(key), n.get(key)) for m, n in pairs)
            if x is not None and y]


def by_pairs(runs, base_runs):
    """`figure 1.38× (1.20–1.55)` for each of PAIRED: the median of the repeats' ratios and
    their range; None when no repeat pairs up."""
    pairs = paired_metrics(runs, base_runs)
    parts = []
    for key, name in PAIRED:
        rs = pair_ratios(pairs, key)
        if rs:
            parts.append(f"{name} {median(rs):.2f}× ({min(rs):.2f}–{max(rs):.2f})")
    return ", ".join(parts) or None


def table(args, results, notes, planned, split_peer, label):
    cols = [("bytes_per_conn", "user-space B/conn", 0, True),
            ("kernel_per_conn", "kernel B/conn", 0, False),
            ("connect_rate", "connects/s", 0, True),
            ("cpu_per_million", "server CPU-s / 1M deliveries", 1, True),
            ("client_cpu_per_million", "client CPU-s / 1M", 1, False),
            ("client_wakeups_per_k", "client wake-ups / 1k", 1, True),
            ("deliveries_per_s", "deliveries/s", 0, True),
            ("p50_ms", "p50 ms", 1, True), ("p99_ms", "p99 ms", 1, True)]
    if args.scenario == "ticker":
        cols += [("p50_floor_ms", "p50 floor ms", 1, False),
                 ("conn_mean_p99_ms", "p99 of per-subscriber mean ms", 1, True)]
    if args.scenario == "churn":
        cols += [("fds_left", "fds left", 0, False), ("rss_left_mib", "RSS left MiB", 1, False)]
    step_keys = [f"bytes_per_conn@{t}" for t in planned]
    if step_keys:
        # The last step is every connection: its column is the user-space one.
        cols = [c for c in cols if c[0] != "bytes_per_conn"]
    lines = []
    for transport in args.transports:
        keys = [k for k in results if k[1] == transport]
        if not keys:
            continue
        med = {}
        for key in keys:
            ms = [metrics(r["bench"], planned, split_peer(key[0])[1], args.cores)
                  for r in results[key] if "bench" in r]
            med[key] = {c: median([m.get(c) for m in ms]) for c in
                        [c[0] for c in cols] + step_keys + ["lost", "dup", "reordered", "opened"]}
            med[key]["runs"] = len(ms)
        # Plain Clarion first, then Clarion at any thread count, then the GRIP proxy.
        base_name = next((b for b in ("clarion", *[k[0] for k in keys if
                                                  split_peer(k[0])[0] == "clarion"],
                                      "clarion-grip", "clarion-tls")
                         if (b, transport) in med), "clarion")
        base = med.get((base_name, transport), {})
        head = ["server"] + [f"user-space B/conn at {int(k.split('@')[1]):,}" for k in step_keys] \
            + [c[1] for c in cols] + ["opened", "lost / dup / reordered", "runs"]
        lines.append(f"\n**{args.scenario}, {transport.upper()}, -n {args.n}** (medians; "
                     f"ratio to {label(base_name)} in brackets)\n")
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for key in keys:
            m = med[key]
            row = [label(key[0])]
            for c in step_keys + [c[0] for c in cols]:
                digits = next((d for k, _, d, _ in cols if k == c), 0)
                ratio_ok = next((r for k, _, _, r in cols if k == c), True)
                cell = fmt(m.get(c), digits)
                b = base.get(c)
                if key[0] != base_name and ratio_ok and m.get(c) is not None and b:
                    cell += f" ({m[c] / b:.2f}×)"
                row.append(cell)
            losses = f"{fmt(m['lost'])} / {fmt(m['dup'])} / {fmt(m['reordered'])}"
            if any(m.get(k) for k in ("lost", "dup", "reordered")):
                losses = f"**LOSSES {losses}**"
            row += [f"{fmt(m['opened'])} / {args.n:,}", losses, str(m["runs"])]
            lines.append("| " + " | ".join(row) + " |")
        # Ratios by pairs: steadier than the ratio of medians on a machine whose load drifts.
        paired = [(key, by_pairs(results[key], results.get((base_name, transport), [])))
                  for key in keys if key[0] != base_name]
        paired = [(key, text) for key, text in paired if text]
        if paired:
            lines.append(f"\nBy pairs (each repeat's ratio to {label(base_name)}; median and "
                         "range):\n")
            lines += [f"- {label(key[0])}: {text}" for key, text in paired]
    for n in notes:
        lines.append(f"- {n}")
    return "\n".join(lines)
