#!/usr/bin/env python3
"""Where a delta message's bytes go (issue 51's 0.15x goal, docs/benchmarks.md): reads the
frames `delta_wire.py --cases` captured from a real server and prints, per delivery, each
part's size raw and deflated as the server's shared mode deflates a frame (alone, 15-bit
window, level 6), how much of the order book really changes per update, and what two
envelope and format changes would give (computed here from the same deltas, not sent).

    python3 bench/delta_wire.py --cases target/delta_frames.json 200
    python3 bench/delta_bytes.py target/delta_frames.json
"""

import difflib
import json
import statistics
import sys
import zlib

DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~"
VALUE = {c: i for i, c in enumerate(DIGITS)}


def deflated(b):
    """The permessage-deflate payload of `b` compressed alone (the trailing 4 bytes dropped)."""
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return len(c.compress(b) + c.flush(zlib.Z_SYNC_FLUSH)) - 4


def wire(b):
    """A server frame's size: its deflated payload and a 2- or 4-byte header."""
    n = deflated(b)
    return n + (2 if n <= 125 else 4)


def b64(n):
    s = ""
    while True:
        s, n = DIGITS[n % 64] + s, n // 64
        if not n:
            return s


def commands(delta):
    """(size, [("copy", len, offset) | ("insert", text)], checksum) of a Fossil delta."""
    at = 0

    def num():
        nonlocal at
        v = 0
        while at < len(delta) and delta[at] in VALUE:
            v, at = v * 64 + VALUE[delta[at]], at + 1
        return v

    size = num()
    at += 1
    out = []
    while True:
        n, op = num(), delta[at]
        at += 1
        if op == "@":
            out.append(("copy", n, num()))
            at += 1
        elif op == ":":
            out.append(("insert", delta[at:at + n]))
            at += n
        else:
            return size, out, n


def relative(delta):
    """The same commands with each copy's offset written relative to the previous copy's end."""
    size, cmds, check = commands(delta)
    out, end = [b64(size), "\n"], 0
    for c in cmds:
        if c[0] == "copy":
            gap = c[2] - end
            out.append(f"{b64(c[1])}@{'-' if gap < 0 else ''}{b64(abs(gap))},")
            end = c[2] + c[1]
        else:
            out.append(f"{b64(len(c[1]))}:{c[1]}")
    return "".join(out) + b64(check) + ";"


def varint(n):
    """LEB128: 7 bits a byte, low first."""
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def binary_splice(a, b):
    """A compact binary delta of `b` against `a`, columns apart so deflate sees like with like:
    the run count, each run's skip from the previous run's end, its removed and inserted
    lengths (LEB128), then every inserted byte."""
    runs = [o for o in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if o[0] != "equal"]
    ends = [0] + [i2 for _, _, i2, _, _ in runs]
    return b"".join([
        varint(len(runs)),
        b"".join(varint(i1 - end) for (_, i1, _, _, _), end in zip(runs, ends)),
        b"".join(varint(i2 - i1) for _, i1, i2, _, _ in runs),
        b"".join(varint(j2 - j1) for _, _, _, j1, j2 in runs),
        b"".join(b[j1:j2] for _, _, _, j1, j2 in runs),
    ])


def dictionary_wire(a, b):
    """`b` deflated with `a` as a preset dictionary (what a shared-dictionary scheme sends)."""
    c = zlib.compressobj(6, zlib.DEFLATED, -15, zdict=a)
    n = len(c.compress(b) + c.flush(zlib.Z_SYNC_FLUSH)) - 4
    return n + (2 if n <= 125 else 4)


def main():
    frames = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "target/delta_frames.json"))
    full = [json.loads(f) for f in frames["full"]]
    deltas = [json.loads(f) for f in frames["delta"] if "delta" in json.loads(f)]
    books = [m["data"] for m in full]
    changed, runs = [], []
    for a, b in zip(books, books[1:]):
        ops = [o for o in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if o[0] != "equal"]
        changed.append(sum(j2 - j1 for _, _, _, j1, j2 in ops) / len(b))
        runs.append(len(ops))
    mean = statistics.mean
    print(f"{len(books)} order books of {mean(map(len, books)):.0f} B; per update: "
          f"{statistics.median(changed):.1%} of the bytes new (median), in {mean(runs):.0f} edit runs")
    full_wire = mean(wire(f.encode()) for f in frames["full"][1:])
    rows = [
        ("full message (the peer)", [f.encode() for f in frames["full"][1:]]),
        ("delta message as sent", [json.dumps(m, separators=(",", ":")).encode() for m in deltas]),
        ("  its envelope alone (data \"\")",
         [json.dumps({**m, "data": ""}, separators=(",", ":")).encode() for m in deltas]),
        ("  its data alone (the Fossil delta)", [m["data"].encode() for m in deltas]),
        ("envelope without id, base as a seq step",
         [json.dumps({"type": "message", "topic": m["topic"], "delta": 1, "data": m["data"]},
                     separators=(",", ":")).encode() for m in deltas]),
        ("no envelope, copy offsets relative", [relative(m["data"]).encode() for m in deltas]),
    ]
    print(f"{'per delivery':<42} {'raw B':>7} {'deflated B':>11} {'wire B':>7} {'vs full':>8}")
    for name, items in rows:
        w = mean(map(wire, items))
        print(f"{name:<42} {mean(map(len, items)):>7.0f} {mean(map(deflated, items)):>11.0f} {w:>7.0f} "
              f"{w / full_wire:>8.3f}")
    # Two formats no Fossil decoder reads, to see whether any byte-level delta reaches 0.15x.
    raw = [(a.encode(), b.encode()) for a, b in zip(books, books[1:])]
    splices = [binary_splice(a, b) for a, b in raw]
    w = mean(map(wire, splices))
    print(f"{'no envelope, binary splice (not Fossil)':<42} {mean(map(len, splices)):>7.0f} "
          f"{mean(map(deflated, splices)):>11.0f} {w:>7.0f} {w / full_wire:>8.3f}")
    w = mean(dictionary_wire(a, b) for a, b in raw)
    print(f"{'no envelope, previous as deflate dictionary':<42} {mean(len(b) for _, b in raw):>7.0f} "
          f"{w - 4:>11.0f} {w:>7.0f} {w / full_wire:>8.3f}")
    new = mean(c * len(b) for c, b in zip(changed, books[1:]))
    print(f"entropy floor of the change: {new:.0f} new digits (~{new * 0.415:.0f} B) + positions of "
          f"{mean(runs):.0f} runs in {mean(map(len, books)):.0f} B (~{mean(runs) * 7 / 8:.0f} B)")


if __name__ == "__main__":
    main()
