"""Start time through each launcher, against the binary run directly (docs/packaging.md).

Medians of N runs of (a) `--help` until exit and (b) `serve` on port 0 until its ready line
(both listeners bound), for: the binary itself, the wheel's `clarion` script, `python -m
clarion`, the npm `.bin/clarion` launcher and `npx clarion`.

    CLARION_KEEP_INSTALLS=1 packaging/test.sh      # prints "installs in DIR"
    python3 packaging/measure.py DIR [RUNS]
"""

import os
import signal
import statistics
import subprocess
import sys
import time


def help_time(cmd, cwd):
    t = time.perf_counter()
    subprocess.run([*cmd, "--help"], cwd=cwd, stdout=subprocess.DEVNULL, check=True, timeout=60)
    return time.perf_counter() - t


def ready_time(cmd, cwd):
    t = time.perf_counter()
    p = subprocess.Popen(
        [*cmd, "serve", "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    line = p.stdout.readline()
    elapsed = time.perf_counter() - t
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=20)
    assert line.startswith(b"clarion ready"), line
    return elapsed


def main():
    work, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 11
    venv, npm = os.path.join(work, "venv", "bin"), os.path.join(work, "npm")
    binary = os.path.join(npm, "node_modules", "@clarion", "linux-x64", "bin", "clarion")
    launchers = {
        "binary directly": [binary],
        "pip: clarion": [os.path.join(venv, "clarion")],
        "pip: python -m clarion": [os.path.join(venv, "python"), "-m", "clarion"],
        "npm: node_modules/.bin/clarion": [os.path.join(npm, "node_modules", ".bin", "clarion")],
        "npm: npx clarion": ["npx", "--no-install", "clarion"],
    }
    print(f"| launcher | `--help` (median of {runs}) | to listening (median of {runs}) |")
    print("|---|---|---|")
    for name, cmd in launchers.items():
        h = statistics.median(help_time(cmd, npm) for _ in range(runs))
        r = statistics.median(ready_time(cmd, npm) for _ in range(runs))
        print(f"| {name} | {h * 1000:.1f} ms | {r * 1000:.1f} ms |")


if __name__ == "__main__":
    main()
