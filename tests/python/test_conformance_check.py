"""The conformance checker must fail on regressions; a gate that cannot fail is no gate."""

import json
import pathlib
import subprocess
import sys

CHECK = pathlib.Path(__file__).resolve().parents[1] / "conformance" / "check.py"


def check(tmp_path, got, expected):
    index = {"agent": {c: {"behavior": b, "behaviorClose": bc} for c, (b, bc) in got.items()}}
    (tmp_path / "index.json").write_text(json.dumps(index))
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    return subprocess.run(
        [sys.executable, str(CHECK), str(tmp_path / "index.json"), str(tmp_path / "expected.json")],
        capture_output=True, text=True,
    )


BASE = {"1.1.1": ["OK", "OK"], "3.4": ["OK", "OK"], "7.1.6": ["INFORMATIONAL", "INFORMATIONAL"]}


def test_identical_passes(tmp_path):
    assert check(tmp_path, BASE, BASE).returncode == 0


def test_failures_and_regressions_fail(tmp_path):
    for case, verdict in [
        ("1.1.1", ["FAILED", "OK"]),
        ("1.1.1", ["OK", "UNCLEAN"]),
        ("1.1.1", ["OK", "WRONG CODE"]),
        ("1.1.1", ["UNIMPLEMENTED", "OK"]),
        ("1.1.1", ["NON-STRICT", "OK"]),
    ]:
        out = check(tmp_path, {**BASE, case: verdict}, BASE)
        assert out.returncode != 0, (case, verdict)
        assert "REGRESSION" in out.stdout


def test_missing_case_fails(tmp_path):
    got = dict(BASE)
    del got["1.1.1"]
    assert check(tmp_path, got, BASE).returncode != 0


def test_timing_sensitive_and_improvements_pass(tmp_path):
    assert check(tmp_path, {**BASE, "3.4": ["NON-STRICT", "OK"]}, BASE).returncode == 0
    improved = check(tmp_path, BASE, {**BASE, "1.1.1": ["NON-STRICT", "OK"]})
    assert improved.returncode == 0 and "improved" in improved.stdout
