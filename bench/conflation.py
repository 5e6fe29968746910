#!/usr/bin/env python3
"""Conflation benchmark (issue 51): N slow SSE subscribers reading at a tenth of a ticker.

Starts one server with `conflate_topics` (or without, `--no-conflate`), opens N SSE
subscribers of topic `px` with a 4 KB receive buffer, and publishes a ticker of `--rate`
messages a second over `--keys` keys (each message `{"k":..,"t":publish time,"pad":..}`,
batches every 50 ms) for `--seconds`. One selector loop reads every subscriber at `--slow` of the
ticker's byte rate (a token bucket per socket). Reports:

- closes as slow consumers (`clarion_closes_total{reason="slow_consumer"}`) and EOFs seen;
- server memory per slow subscriber: (RSS at the end of the ticker - RSS before the
  subscribers) / N, against `keys x message size`;
- skipped (`clarion_conflated_skipped_total`) and delivered messages;
- the age of each message when it reached a subscriber (receive time - publish time),
  p50/p99, during the ticker;
- after the ticker stops (everyone then reads at full speed): the time until every subscriber
  has the latest value of every key.

    python3 bench/conflation.py --bin target/release/clarion -n 200 --seconds 20
    python3 bench/conflation.py --bin target/release/clarion -n 200 --seconds 20 --no-conflate

All traffic is on 127.0.0.1; the loops are bounded by `--seconds` and a 60 s drain.
"""

import argparse
import json
import os
import selectors
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request


def metrics(api):
    text = urllib.request.urlopen(f"http://{api}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def publish(api, batch):
    body = json.dumps({"messages": batch}).encode()
    req = urllib.request.Request(
        f"http://{api}/publish", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(req, timeout=10).read()


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/clarion")
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--keys", type=int, default=500)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--slow", type=float, default=0.1)
    ap.add_argument("--pad", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--no-conflate", action="store_true")
    a = ap.parse_args()

    conf = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    conf.write("max_backlog = 65536\n")
    if not a.no_conflate:
        conf.write('[[conflate_topics]]\npattern = "px"\nkey = "/k"\nthreshold = 16384\nmax_keys = 1000\n')
    conf.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    proc = subprocess.Popen(
        [a.bin, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", "--config", conf.name],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    try:
        line = proc.stdout.readline()
        fields = dict(p.split("=", 1) for p in line.split()[2:])
        clients, api = fields["clients"], fields["api"]
        host, port = clients.rsplit(":", 1)
        time.sleep(0.3)
        rss0 = rss_kb(proc.pid)
        sel = selectors.DefaultSelector()
        subs = []
        for i in range(a.n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect((host, int(port)))
            s.sendall(b"GET /sse?topic=px HTTP/1.1\r\nHost: x\r\n\r\n")
            s.setblocking(False)
            st = {"sock": s, "buf": b"", "tokens": 0.0, "latest": {}, "eof": False, "head": False}
            subs.append(st)
            sel.register(s, selectors.EVENT_READ, st)
        time.sleep(0.5)
        msg_size = len(json.dumps({"k": "k000", "t": time.time(), "pad": "x" * a.pad})) + 40
        slow_bps = a.rate * msg_size * a.slow
        last = {}
        pub_t = {}
        ages = []
        fresh_ages = []
        stale_by = []
        stop = threading.Event()
        state = {"fast": False}

        def ticker():
            n, t0 = 0, time.monotonic()
            per = max(1, a.rate // 20)
            while time.monotonic() - t0 < a.seconds:
                batch = []
                for _ in range(per):
                    k = f"k{n % a.keys:03d}"
                    n += 1
                    t = time.time()
                    batch.append({"topic": "px", "data": json.dumps({"k": k, "t": t, "n": n, "pad": "x" * a.pad})})
                    pub_t[n] = t
                    last[k] = n
                publish(api, batch)
                time.sleep(max(0.0, t0 + n / a.rate - time.monotonic()))
            stop.set()

        def read_events(st):
            while b"\n\n" in st["buf"]:
                block, st["buf"] = st["buf"].split(b"\n\n", 1)
                if not st["head"]:
                    st["head"] = True
                    block = block.split(b"\r\n\r\n", 1)[-1]
                for ln in block.split(b"\n"):
                    if ln.startswith(b"data: {\"k\""):
                        d = json.loads(ln[6:])
                        st["latest"][d["k"]] = d["n"]
                        if not state["fast"]:
                            now_t = time.time()
                            ages.append(now_t - d["t"])
                            # the next value of its key is n + keys; it superseded this one
                            # if it was published (stamped) before this one arrived
                            nxt = pub_t.get(d["n"] + a.keys)
                            if nxt is None or nxt > now_t:
                                fresh_ages.append(now_t - d["t"])
                            else:
                                stale_by.append(now_t - nxt)

        th = threading.Thread(target=ticker, daemon=True)
        th.start()
        tick = time.monotonic()
        rss_peak = rss0
        done_at = None
        t_stop = None
        while True:
            now = time.monotonic()
            dt, tick = now - tick, now
            if stop.is_set() and t_stop is None:
                t_stop = now
                state["fast"] = True
                rss_peak = max(rss_peak, rss_kb(proc.pid))
            for st in subs:
                st["tokens"] = min(st["tokens"] + dt * slow_bps, 8192)
            for key, _ in sel.select(timeout=0.01):
                st = key.data
                want = 65536 if state["fast"] else int(st["tokens"])
                if want < 512:
                    continue
                try:
                    chunk = st["sock"].recv(want)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    st["eof"] = True
                    sel.unregister(st["sock"])
                    continue
                st["tokens"] -= len(chunk)
                st["buf"] += chunk
                read_events(st)
            if not state["fast"] and int(now) % 2 == 0:
                rss_peak = max(rss_peak, rss_kb(proc.pid))
            if t_stop is not None:
                live = [s for s in subs if not s["eof"]]
                if all(s["latest"] == last for s in live):
                    done_at = now
                    break
                if now - t_stop > 60:
                    break
        m = metrics(api)
        eofs = sum(s["eof"] for s in subs)
        print(json.dumps({
            "conflate": not a.no_conflate,
            "subscribers": a.n,
            "keys": a.keys,
            "rate": a.rate,
            "slow_fraction": a.slow,
            "message_bytes": msg_size,
            "slow_consumer_closes": m.get('clarion_closes_total{reason="slow_consumer"}', 0),
            "eofs": eofs,
            "skipped": m.get("clarion_conflated_skipped_total", 0),
            "rss_per_subscriber_kb": round((rss_peak - rss0) / a.n, 1),
            "keys_x_message_kb": round(a.keys * msg_size / 1024, 1),
            "age_p50_s": round(percentile(ages, 0.5), 3),
            "age_p99_s": round(percentile(ages, 0.99), 3),
            # what the reader achieved: deliveries read per subscriber and second during the
            # ticker (the target is rate x slow), and the reader's own CPU (one Python thread)
            "read_per_sub_per_s": round(len(ages) / a.n / a.seconds, 2),
            "reader_cpu_s": round(sum(os.times()[:2]), 1),
            "fresh_at_arrival": round(len(fresh_ages) / len(ages), 3) if ages else None,
            "fresh_age_p50_s": round(percentile(fresh_ages, 0.5), 3),
            "fresh_age_p99_s": round(percentile(fresh_ages, 0.99), 3),
            "superseded_for_p50_s": round(percentile(stale_by, 0.5), 3),
            "superseded_for_p99_s": round(percentile(stale_by, 0.99), 3),
            "latest_everywhere_after_stop_s": round(done_at - t_stop, 2) if done_at else None,
        }))
    finally:
        proc.terminate()
        proc.wait(10)
        os.unlink(conf.name)


if __name__ == "__main__":
    main()
