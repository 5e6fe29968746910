#!/usr/bin/env python3
"""How many copies of a handed-over TLS 1.3 connection's traffic secrets a core dump of the new
process holds (docs/security.md, "traffic secrets left in memory after a hand-over").

Opens N TLS 1.3 connections (Python's ssl, with SSLKEYLOGFILE, so the test knows each
connection's CLIENT/SERVER_TRAFFIC_SECRET_0), exchanges a message on each, upgrades the server
(--upgrade-from), exchanges another message (the new process's record layer is in use), then
dumps the new process with gcore and counts each secret's bytes in the dump. A secret lives on
in the record layer's own state (it derives the next keys from it); every other copy is a stale
buffer.

    python3 bench/secrets_in_core.py --bin target/release/clarion [-n 20]

Needs gdb's gcore. Prints one line per connection and the totals; not part of CI (a core dump
of a server is heavy).
"""

import argparse
import os
import pathlib
import socket
import ssl
import subprocess
import sys
import tempfile
import time


def ready(proc):
    line = proc.stdout.readline()
    if not line.startswith("clarion ready"):
        sys.exit(f"server did not start: {line!r}")
    return dict(p.split("=", 1) for p in line.split()[2:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/clarion")
    ap.add_argument("-n", type=int, default=20, help="connections")
    args = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="clarion-core-"))
    subprocess.run([args.bin, "cert", "--dev", "--dir", str(work / "tls")], check=True,
                   capture_output=True)
    common = ["--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", "--tls-listen",
              "127.0.0.1:0", "--tls-cert", str(work / "tls/cert.pem"), "--tls-key",
              str(work / "tls/key.pem")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    old = subprocess.Popen([args.bin, "serve", *common], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, env=env)
    tls = ready(old)["tls"]
    host, port = tls.rsplit(":", 1)
    keylog = work / "keys.log"
    os.environ["SSLKEYLOGFILE"] = str(keylog)
    ctx = ssl.create_default_context(cafile=str(work / "tls/ca.pem"))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.keylog_filename = str(keylog)
    socks = []
    for _ in range(args.n):
        s = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10),
                            server_hostname="localhost")
        s.sendall(b"GET /sse?topic=t HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n")
        s.settimeout(5)
        s.recv(65536)
        socks.append(s)
    new = subprocess.Popen([args.bin, "serve", *common, "--upgrade-from", str(old.pid)],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    api = ready(new)["api"]
    old.wait(timeout=30)
    # A message through the new process's record layer on every connection.
    subprocess.run(["curl", "-s", "-d", "after", f"http://{api}/publish/t"], check=True,
                   capture_output=True)
    for s in socks:
        s.recv(65536)
    time.sleep(0.5)
    core = work / "core"
    subprocess.run(["gcore", "-o", str(core), str(new.pid)], check=True, capture_output=True)
    dump = pathlib.Path(f"{core}.{new.pid}").read_bytes()
    secrets = {}
    for line in keylog.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0"):
            secrets.setdefault(parts[1], {})[parts[0]] = bytes.fromhex(parts[2])
    counts = []
    for random, pair in secrets.items():
        for label, secret in sorted(pair.items()):
            counts.append(dump.count(secret))
            print(f"{random[:12]} {label}: {counts[-1]} copies")
    new.terminate()
    new.wait(timeout=30)
    print(f"{len(counts)} secrets, copies per secret: min {min(counts)}, max {max(counts)}, "
          f"total {sum(counts)}")


if __name__ == "__main__":
    main()
