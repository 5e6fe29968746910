#!/usr/bin/env python3
"""What authentication costs an idle connection: RSS per idle WebSocket holding a token,
against an anonymous one on the same server (auth configured, public topics), as the marginal
cost between two connection counts so one-off costs (code pages, allocator pools touched by the
first verification) cancel out.

    /work/venv/bin/python bench/auth_memory.py target/release/clarion [--low 4000 --high 16000 --repeats 2]

Needs PyJWT (tests/python/requirements.txt) and an open-files limit above --high.
"""

import argparse
import socket
import subprocess
import time

import jwt

SECRET = "measure-secret-measure-secret-000"


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    return 0


def run(binary, n, token):
    args = [binary, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
            "--workers", "1", "--max-connections-per-address", "0",
            "--auth-secret", SECRET, "--auth-public-topics", "t*"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline()
        host, port = dict(x.split("=", 1) for x in line.split()[2:])["clients"].rsplit(":", 1)
        time.sleep(0.3)
        base = rss(p.pid)
        socks = []
        for i in range(n):
            s = socket.create_connection((host, int(port)))
            q = f"/ws?topic=t{i % 50}" + (f"&token={token}" if token else "")
            s.sendall((f"GET {q} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                       "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 101")
            socks.append(s)
        time.sleep(1.5)
        total = rss(p.pid) - base
        for s in socks:
            s.close()
        return total
    finally:
        p.kill()
        p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--low", type=int, default=4000)
    ap.add_argument("--high", type=int, default=16000)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    tok = jwt.encode({"sub": "u", "exp": int(time.time()) + 3600, "clarion": {"subscribe": ["t*"]}},
                     SECRET, algorithm="HS256")
    span = a.high - a.low
    for rep in range(a.repeats):
        anon = (run(a.binary, a.high, None) - run(a.binary, a.low, None)) / span
        auth = (run(a.binary, a.high, tok) - run(a.binary, a.low, tok)) / span
        print(f"run {rep + 1}: marginal RSS per idle WebSocket: anonymous {anon:.1f} B, "
              f"with a token {auth:.1f} B, difference {auth - anon:+.1f} B")


if __name__ == "__main__":
    main()
