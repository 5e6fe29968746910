"""A lone process started without `--node-name` is `host:pid`; the process that takes over its
connections (`--upgrade-from PID`, or SIGUSR1) keeps that name instead of taking its own pid,
so webhook connection ids (`NODE/N`) and the dashboard's node do not change at an upgrade."""

import re
import time


def node_of(server):
    """The node name in the server's startup line (`broker: none (node NAME)`)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        line = server.proc.stderr.readline()
        m = re.search(r"\(node ([^)]+)\)", line)
        if m:
            return m.group(1)
    raise AssertionError("no startup line naming the node")


def test_an_upgraded_lone_process_keeps_its_predecessors_node_name(start_server):
    first = start_server()
    name = node_of(first)
    assert name.endswith(f":{first.proc.pid}"), name
    second = start_server("--upgrade-from", first.proc.pid)
    assert first.proc.wait(30) == 0
    assert node_of(second) == name
    # And the next upgrade keeps it again: the name is carried, not rebuilt from a pid.
    third = start_server("--upgrade-from", second.proc.pid)
    assert second.proc.wait(30) == 0
    assert node_of(third) == name


def test_a_configured_node_name_is_the_successors_own(start_server):
    first = start_server()
    node_of(first)
    second = start_server("--upgrade-from", first.proc.pid, "--node-name", "edge-2")
    assert first.proc.wait(30) == 0
    assert node_of(second) == "edge-2"
