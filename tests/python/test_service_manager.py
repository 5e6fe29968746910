"""systemd `Type=notify`: the server tells a service manager listening on `$NOTIFY_SOCKET` that
it serves (READY=1), that an upgrade (SIGUSR1) begins (RELOADING=1 with MONOTONIC_USEC=), which
process serves after the upgrade (MAINPID=, sent by the process handing over so a manager with
`NotifyAccess=main` accepts it, before the new process says READY=1), and that it stops
(STOPPING=1). The test plays the manager: it binds the datagram socket and learns each
sender's pid from the kernel (SCM_CREDENTIALS), as systemd does."""

import os
import signal
import socket
import struct
import time
import uuid

from cluster_util import Redis
from conftest import Server


class FakeManager:
    """A notification socket with the sender's credentials on every datagram."""

    def __init__(self, address):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(address)
        self.address = address if isinstance(address, str) else "@" + address[1:].decode()

    def next(self, timeout=10.0):
        """(sender pid, {key: value}) of the next datagram."""
        self.sock.settimeout(timeout)
        data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
        pid = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid, _, _ = struct.unpack("iii", payload[:12])
        fields = dict(line.split("=", 1) for line in data.decode().splitlines() if line)
        return pid, fields

    def until(self, key, timeout=15.0):
        """Every datagram up to and including the first that sets `key`."""
        seen, deadline = [], time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {key} within {timeout} s; got {seen}")
            try:
                seen.append(self.next(left))
            except TimeoutError:
                raise AssertionError(f"no {key} within {timeout} s; got {seen}") from None
            if key in seen[-1][1]:
                return seen

    def close(self):
        self.sock.close()


def main_only(main, messages):
    """What a manager with NotifyAccess=main makes of `messages`: the main pid it ends up
    watching and the messages it read (from the main process of the moment; MAINPID= from it
    moves the main process before the rest of its message is read)."""
    read = []
    for pid, fields in messages:
        if pid != main:
            continue
        if "MAINPID" in fields:
            main = int(fields["MAINPID"])
        read.append((pid, fields))
    return main, read


def test_notify_ready_reloading_mainpid_of_the_successor_then_stopping(start_server, tmp_path):
    manager = FakeManager(str(tmp_path / "notify"))
    try:
        old = start_server(env={"NOTIFY_SOCKET": manager.address})
        pid, ready = manager.until("READY")[-1]
        assert pid == old.proc.pid and ready["READY"] == "1"
        assert ready["MAINPID"] == str(old.proc.pid)
        assert ready["STATUS"].startswith("serving: clients on ")

        began = time.monotonic_ns() // 1000
        old.proc.send_signal(signal.SIGUSR1)
        line = old.proc.stdout.readline()
        assert line.startswith("clarion ready"), line
        upgrade = manager.until("READY")
        ended = time.monotonic_ns() // 1000

        pid, reloading = upgrade[0]
        assert pid == old.proc.pid and reloading["RELOADING"] == "1", upgrade
        assert began <= int(reloading["MONOTONIC_USEC"]) <= ended, "CLOCK_MONOTONIC, in µs"
        named = [(p, f) for p, f in upgrade if "MAINPID" in f and p == old.proc.pid]
        assert named, f"the old process names its successor: {upgrade}"
        successor = int(named[0][1]["MAINPID"])
        assert successor != old.proc.pid
        last_pid, last = upgrade[-1]
        assert last_pid == successor and last["READY"] == "1", upgrade

        # Under NotifyAccess=main the manager reads the successor's READY=1: MAINPID came first.
        main, read = main_only(old.proc.pid, upgrade)
        assert main == successor
        assert read[-1] == (successor, last), read

        assert old.proc.wait(timeout=30) == 0
        # The old process's own restart after the hand-over is not the service stopping.
        try:
            while True:
                pid, fields = manager.next(0.5)
                assert "STOPPING" not in fields, (pid, fields)
        except TimeoutError:
            pass

        status, _, _ = old.request("GET", "/healthz")
        assert status == 200
        os.kill(successor, signal.SIGTERM)
        pid, stopping = manager.until("STOPPING")[-1]
        assert pid == successor and stopping["STOPPING"] == "1"
        assert "1001" in stopping["STATUS"]
        for _ in range(100):
            if not os.path.exists(f"/proc/{successor}"):
                break
            time.sleep(0.1)
    finally:
        manager.close()


def test_notify_reaches_an_abstract_socket_and_a_restart_says_stopping(start_server):
    manager = FakeManager(b"\0clarion-test-" + uuid.uuid4().hex.encode())
    try:
        server = start_server(env={"NOTIFY_SOCKET": manager.address})
        pid, fields = manager.until("READY")[-1]
        assert pid == server.proc.pid
        server.proc.send_signal(signal.SIGUSR2)
        pid, fields = manager.until("STOPPING")[-1]
        assert pid == server.proc.pid and "1012" in fields["STATUS"]
        assert server.proc.wait(timeout=30) == 0
    finally:
        manager.close()


def test_a_group_s_supervisor_speaks_for_the_service_and_its_members_never_do(tmp_path):
    """A `--processes` group's members share the environment but not the right to speak for
    the service: the supervisor is the service's main process, for the group's whole life."""
    manager = FakeManager(str(tmp_path / "notify"))
    redis = Redis(tmp_path)
    try:
        server = Server(
            ["--processes", "2", "--broker", redis.url], env={"NOTIFY_SOCKET": manager.address}
        )
        try:
            got = manager.until("READY")
            assert got[-1][0] == server.proc.pid, got
            assert "group of 2 processes" in got[-1][1]["STATUS"]
            server.proc.send_signal(signal.SIGTERM)
            got += manager.until("STOPPING")
            assert got[-1][0] == server.proc.pid, got
            assert server.proc.wait(timeout=30) == 0
            members = [p for p, _ in got if p != server.proc.pid]
            assert not members, got
        finally:
            server.stop()
    finally:
        redis.kill()
        manager.close()
