#!/usr/bin/env python3
"""Whether two `clarion bench` runs of the same scenario have the same output shape: the same
JSON key paths with the same value types, the same text lines and the same HTML once every
number is masked (and a plot's points, whose count follows the run's length). A refactor of the
bench or of the server must leave all three alike; the numbers themselves are compared with
bench/compare.py.

    clarion-before bench ... --json a.json --report a.html > a.txt
    clarion bench        ... --json b.json --report b.html > b.txt
    python3 bench/output_shape.py a b          # reads a.json a.txt a.html, b.json b.txt b.html

Exits 1 and prints the differences when the shapes differ. Warning lines depend on what was
measured (too few CPU ticks, a server whose RSS was already grown): run each side against a
freshly started server with enough load that neither warns, or compare the warnings by eye.
"""

import difflib
import json
import re
import sys


def paths(value, path=""):
    """Every key path of a JSON value, with its type (the first element stands for a list's)."""
    if isinstance(value, dict):
        out = {path + "/": "object"}
        for k, v in value.items():
            out.update(paths(v, f"{path}/{k}"))
        return out
    if isinstance(value, list):
        out = {path + "[]": "array"}
        for v in value[:1]:
            out.update(paths(v, path + "[]"))
        return out
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return {path: type(value).__name__}
    return {path: "number"}


def masked(text):
    text = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", text)
    return re.sub(r'points="[#, ]*"', 'points="…"', text)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    a, b = sys.argv[1], sys.argv[2]
    same = True
    pa = paths(json.load(open(f"{a}.json")))
    pb = paths(json.load(open(f"{b}.json")))
    if pa == pb:
        print(f"JSON: {len(pa)} key paths, identical")
    else:
        same = False
        print("JSON differs:")
        for k in sorted(set(pa) | set(pb)):
            if pa.get(k) != pb.get(k):
                print(f"  {k}: {pa.get(k)} -> {pb.get(k)}")
    for ext in ("txt", "html"):
        ta = masked(open(f"{a}.{ext}").read()).splitlines()
        tb = masked(open(f"{b}.{ext}").read()).splitlines()
        if ta == tb:
            print(f"{ext}: {len(ta)} lines, identical with numbers masked")
        else:
            same = False
            print(f"{ext} differs:")
            for line in difflib.unified_diff(ta, tb, lineterm="", n=0):
                print("  " + line[:300])
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
