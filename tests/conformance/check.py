"""Compares an Autobahn `index.json` with the verdicts recorded in `expected.json`.

Fails on any FAILED, UNIMPLEMENTED or ERROR behaviour, on close verdicts FAILED, UNCLEAN or WRONG CODE,
on a case that is missing, and on any case whose verdict differs from the recorded one, except:
a case that improved (NON-STRICT to OK) is reported so the record can be updated, and the few
cases whose strictness depends on packet timing may read OK or NON-STRICT.

    python3 check.py REPORT_DIR/index.json expected.json [--write] [--present-only]

`--write` records the current verdicts as the new expectation (after reviewing them).
`--present-only` checks only the cases the report has (a run of a chosen subset).
"""

import json
import sys

BAD_BEHAVIOR = {"FAILED", "UNIMPLEMENTED", "ERROR"}
BAD_CLOSE = {"FAILED", "UNCLEAN", "WRONG CODE", "FAILED BY CLIENT", "UNIMPLEMENTED"}
# Verdicts the runner derives from how the server's answers were split into TCP segments.
TIMING_SENSITIVE = {"3.4", "4.1.5", "4.2.5", "6.4.1", "6.4.2", "6.4.3", "6.4.4"}
STRICTNESS = {"OK": 0, "NON-STRICT": 1}


def verdicts(index_path):
    with open(index_path) as f:
        index = json.load(f)
    if len(index) != 1:
        sys.exit(f"expected one agent in {index_path}, found {list(index)}")
    (cases,) = index.values()
    return {case: [v["behavior"], v["behaviorClose"]] for case, v in cases.items()}


def case_key(case):
    return [int(p) for p in case.split(".")]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    got = verdicts(args[0])
    if "--write" in sys.argv:
        with open(args[1], "w") as f:
            rows = sorted(got.items(), key=lambda kv: case_key(kv[0]))
            f.write("{\n" + ",\n".join(f' "{c}": {json.dumps(v)}' for c, v in rows) + "\n}\n")
        print(f"recorded {len(got)} verdicts in {args[1]}")
        return
    with open(args[1]) as f:
        expected = json.load(f)

    problems, notes = [], []
    cases = set(got) if "--present-only" in sys.argv else set(expected) | set(got)
    for case in sorted(cases, key=case_key):
        if case not in got:
            problems.append(f"{case}: missing from the report")
            continue
        behavior, close = got[case]
        if behavior in BAD_BEHAVIOR or close in BAD_CLOSE:
            problems.append(f"{case}: {behavior} / close {close}")
            continue
        if case not in expected:
            notes.append(f"{case}: new case, {behavior} / close {close}")
            continue
        want_behavior, want_close = expected[case]
        if close != want_close:
            problems.append(f"{case}: close {close}, expected {want_close}")
        elif behavior != want_behavior:
            rank_got, rank_want = STRICTNESS.get(behavior), STRICTNESS.get(want_behavior)
            if rank_got is not None and rank_want is not None and rank_got < rank_want:
                notes.append(f"{case}: improved to {behavior} (record it with --write)")
            elif case in TIMING_SENSITIVE and rank_got is not None and rank_want is not None:
                notes.append(f"{case}: {behavior} this run (timing-sensitive, expected {want_behavior})")
            else:
                problems.append(f"{case}: {behavior}, expected {want_behavior}")

    counts = {}
    for behavior, _ in got.values():
        counts[behavior] = counts.get(behavior, 0) + 1
    summary = ", ".join(f"{n} {b}" for b, n in sorted(counts.items()))
    for line in notes:
        print(f"note: {line}")
    if problems:
        for line in problems:
            print(f"REGRESSION: {line}")
        sys.exit(f"conformance: {len(problems)} problem(s) in {len(got)} cases ({summary})")
    print(f"conformance: {len(got)} cases as expected ({summary})")


if __name__ == "__main__":
    main()
