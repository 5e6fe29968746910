"""packaging/systemd/clarion.service: systemd itself reads the unit (`systemd-analyze verify`,
with every warning an error), and the settings the server relies on are in it: `Type=notify`
(the server notifies, test_service_manager.py), a reload that is the upgrade keeping every
connection (SIGUSR1), the file limit, and a system call filter that keeps io_uring."""

import os
import pathlib
import shutil
import subprocess

import pytest
from conftest import _binary

UNIT = pathlib.Path(__file__).resolve().parents[2] / "packaging" / "systemd" / "clarion.service"


def settings():
    out = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def test_the_unit_notifies_reloads_by_upgrade_and_keeps_io_uring():
    s = settings()
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["ExecReload"] == ["/bin/kill -USR1 $MAINPID"]
    assert s["LimitNOFILE"] == ["1048576"]
    assert s["CapabilityBoundingSet"] == [""] and s["NoNewPrivileges"] == ["yes"]
    assert s["ProtectSystem"] == ["strict"]
    assert s["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert s["SystemCallErrorNumber"] == ["EPERM"], "a refused call fails, it does not kill"
    if shutil.which("systemd-analyze"):
        allowed = syscalls("@system-service")
        denied = set()
        for group in s["SystemCallFilter"][1].lstrip("~").split():
            denied |= syscalls(group)
        for call in ("io_uring_setup", "io_uring_enter", "io_uring_register", "sendmsg",
                     "recvmsg", "epoll_wait", "accept4", "setsockopt", "clock_gettime"):
            assert call in allowed and call not in denied, call


def syscalls(group, seen=None):
    """The system calls of a systemd filter group, its nested groups expanded."""
    seen = set() if seen is None else seen
    seen.add(group)
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter", group], capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    calls = set()
    for line in out[1:]:
        word = line.strip()
        if not word or word.startswith("#"):
            continue
        if word.startswith("@"):
            if word not in seen:
                calls |= syscalls(word, seen)
        else:
            calls.add(word)
    return calls


def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(tmp_path):
    if not shutil.which("systemd-analyze"):
        from cluster_util import missing_service

        missing_service("systemd-analyze (Debian's systemd package)")
    unit = tmp_path / "clarion.service"
    # verify checks that ExecStart= names an executable: the binary under test.
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/clarion", _binary()))
    r = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True, text=True, env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"},
    )
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
