"""Durable history (`history_dir`): a restart, graceful or `kill -9`, resumes clients exactly;
damaged files are reported and announced as a gap, never replayed; disk stays bounded; without
`history_dir` a restart is a new epoch as before."""

import json
import os
import pathlib
import signal
import socket
import struct

import pytest

MARK = 0xC7


def poll_all(server, since, topic="t"):
    """Every message after `since` by long-poll (following the cursor), and the gaps reported."""
    host, port = server.clients.rsplit(":", 1)
    messages, gaps, cursor = [], [], since
    for _ in range(100):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(
                f"GET /poll?topic={topic}&since={cursor}&timeout=0 HTTP/1.1\r\nHost: x\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        body = json.loads(body)
        gaps += body.get("gaps", [])
        if not body["messages"]:
            return messages, gaps
        messages += body["messages"]
        cursor = body["cursor"]
    raise AssertionError("the poll chain did not end")


def publish_many(server, n, topic="t", prefix="m"):
    return [server.publish(topic, f"{prefix}{i}")["id"] for i in range(1, n + 1)]


def start_durable(start_server, d, *extra, **kw):
    return start_server("--history-dir", d, "--history-size", "5000", *extra, **kw)


def segments(d):
    return sorted(pathlib.Path(d).glob("*.seg"))


def records(path):
    """(offset, length, id or None) of each record of a segment (the file must be intact)."""
    data = path.read_bytes()
    out, at = [], 0
    while at < len(data):
        assert data[at] == MARK
        (length,) = struct.unpack_from("<I", data, at + 1)
        body = data[at + 9 : at + 9 + length]
        rid = struct.unpack_from("<Q", body, 1)[0] if body[0] == 2 else None
        out.append((at, 9 + length, rid))
        at += 9 + length
    return out


def check_exact_resume(server, ids, bodies):
    got, gaps = poll_all(server, ids[499])
    assert gaps == []
    assert [m["id"] for m in got] == ids[500:]
    assert [m["data"] for m in got] == bodies[500:]


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "kill9"])
def test_a_restart_resumes_from_id_500_with_exactly_501_to_1000(start_server, tmp_path, how):
    d = tmp_path / "hist"
    a = start_durable(start_server, d)
    ids = publish_many(a, 1000)
    bodies = [f"m{i}" for i in range(1, 1001)]
    _, err = a.stop(how)
    b = start_durable(start_server, d)
    check_exact_resume(b, ids, bodies)
    # The next id continues the sequence in the same epoch: nothing is reused.
    nxt = b.publish("t", "after")["id"]
    epoch, _, n = ids[-1].partition("-")
    assert nxt == f"{epoch}-{int(n) + 1}"
    # And a second restart still holds all of it.
    b.stop(how)
    c = start_durable(start_server, d)
    got, gaps = poll_all(c, ids[499])
    assert gaps == [] and [m["data"] for m in got] == bodies[500:] + ["after"]


def test_damaged_files_are_reported_and_resume_gets_the_valid_messages_and_a_gap(
    start_server, tmp_path
):
    d = tmp_path / "hist"
    a = start_durable(start_server, d, "--history-segment-bytes", "8192")
    ids = publish_many(a, 1000)
    a.stop()
    segs = segments(d)
    assert len(segs) >= 3, segs
    # Flip a byte in the middle of a message record of a middle segment.
    mid = segs[len(segs) // 2]
    recs = [r for r in records(mid) if r[2] is not None]
    flip_off, flip_len, flipped_id = recs[len(recs) // 2]
    data = bytearray(mid.read_bytes())
    data[flip_off + flip_len // 2 + 4] ^= 0xFF
    mid.write_bytes(bytes(data))
    # Cut the last segment in the middle of a record.
    last = segs[-1]
    recs = [r for r in records(last) if r[2] is not None]
    cut_off, cut_len, first_cut_id = recs[len(recs) // 2]
    last.write_bytes(last.read_bytes()[: cut_off + cut_len // 2])
    assert 500 < flipped_id < first_cut_id <= 1000

    b = start_durable(start_server, d)
    got, gaps = poll_all(b, ids[499])
    _, err = b.stop()
    # What is valid: everything after 500 but the flipped record and the cut tail.
    valid = [i for i in range(501, first_cut_id) if i != flipped_id]
    assert [m["data"] for m in got] == [f"m{i}" for i in valid]
    assert [m["id"] for m in got] == [ids[i - 1] for i in valid]
    # The first answer announces the gap; a poll continuing from a cursor below the lost tail
    # is told again.
    assert gaps[0] == {"type": "gap", "topic": "t", "since": ids[499], "reason": "trimmed"}
    assert all(g["reason"] == "trimmed" for g in gaps)
    # Both files are named in the log, with what was wrong.
    assert mid.name in err and "checksum" in err, err
    assert last.name in err and "ends inside a record" in err, err
    # A third start announces the same gap (the damage floor is kept), without the bad files.
    c = start_durable(start_server, d)
    got2, gaps2 = poll_all(c, ids[499])
    assert got2 == got and gaps2 == gaps


def test_more_messages_than_history_size_keep_the_disk_bounded(start_server, tmp_path):
    d = tmp_path / "hist"
    a = start_server(
        "--history-dir", d, "--history-size", "50", "--history-segment-bytes", "8192"
    )
    payload = "x" * 200
    sizes = []
    for round_ in range(4):
        for _ in range(500):
            a.publish("t", payload)
        sizes.append(sum(p.stat().st_size for p in segments(d)))
    # 2,000 messages of ~230 bytes on disk would be ~460 KB; 50 held are ~12 KB.
    assert max(sizes) < 2 * 50 * 400 + 3 * 8192 + 8192, sizes
    a.stop()
    b = start_server("--history-dir", d, "--history-size", "50")
    got, gaps = poll_all(b, "zzzz-1")
    assert len(got) == 50


def test_without_history_dir_a_restart_is_a_new_epoch(start_server):
    a = start_server()
    ids = publish_many(a, 10)
    a.stop()
    b = start_server()
    got, gaps = poll_all(b, ids[4])
    assert got == [] and len(gaps) == 1 and gaps[0]["reason"] == "epoch"


def test_a_history_dir_that_cannot_be_written_stops_the_start(tmp_path):
    from conftest import Server

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(RuntimeError) as e:
        Server(["--history-dir", str(blocker / "hist")])
    assert "history_dir" in str(e.value) and str(blocker) in str(e.value)


def test_history_dir_with_a_broker_is_refused(tmp_path):
    from conftest import Server

    with pytest.raises(RuntimeError) as e:
        Server(["--history-dir", str(tmp_path), "--broker", "redis://127.0.0.1:1"])
    assert "history_dir is for a server without a broker" in str(e.value)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "kill9"])
def test_one_process_per_history_dir(start_server, tmp_path, how):
    """A second server on a directory in use is refused with the holder's pid and writes
    nothing there; once the holder has gone (even by `kill -9`) the directory is free."""
    from conftest import Server

    d = tmp_path / "hist"
    a = start_durable(start_server, d)
    ids = publish_many(a, 20)
    before = {p.name: p.read_bytes() for p in segments(d)}
    with pytest.raises(RuntimeError) as e:
        Server(["--history-dir", str(d), "--history-size", "5000"])
    assert f"in use by process {a.proc.pid}" in str(e.value), e.value
    assert {p.name: p.read_bytes() for p in segments(d)} == before
    a.publish("t", "m21")
    a.stop(how)
    b = start_durable(start_server, d)
    got, gaps = poll_all(b, ids[9])
    assert gaps == [] and [m["data"] for m in got] == [f"m{i}" for i in range(11, 22)]


# --- Private files (issue 55, item 4): 0700 directory, 0600 files, no link followed, a
# directory of another user or writable by others refused.


def mode(p):
    return os.lstat(p).st_mode & 0o7777


def test_history_dir_is_0700_and_its_files_0600_even_with_umask_0(start_server, tmp_path):
    d = tmp_path / "a" / "hist"
    a = start_durable(start_server, d, preexec_fn=lambda: os.umask(0))
    publish_many(a, 5)
    a.stop()
    assert mode(d) == 0o700
    names = sorted(p.name for p in d.iterdir())
    assert "lock" in names and "clean" in names and any(n.endswith(".seg") for n in names)
    assert {n: mode(d / n) for n in names} == {n: 0o600 for n in names}


def test_a_history_dir_left_0755_by_an_older_version_is_tightened(start_server, tmp_path):
    d = tmp_path / "hist"
    a = start_durable(start_server, d)
    ids = publish_many(a, 5)
    a.stop()
    os.chmod(d, 0o755)
    for p in d.iterdir():
        os.chmod(p, 0o644)
    b = start_durable(start_server, d)
    got, gaps = poll_all(b, ids[1])
    _, err = b.stop()
    assert [m["id"] for m in got] == ids[2:] and gaps == []
    assert "mode 0755 tightened to 0700" in err, err
    assert mode(d) == 0o700
    assert {p.name: mode(p) for p in d.iterdir()} == {p.name: 0o600 for p in d.iterdir()}


def test_a_symlinked_lock_is_refused_and_its_target_left_alone(tmp_path):
    """The attack of the issue: a directory prepared with `lock -> a file of someone else's`
    made the server write its pid into that file."""
    from conftest import Server

    d = tmp_path / "hist"
    d.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (d / "lock").symlink_to(victim)
    with pytest.raises(RuntimeError) as e:
        Server(["--history-dir", str(d)])
    assert f"{d / 'lock'} is a symbolic link" in str(e.value), e.value
    assert victim.read_text() == "precious\n"


def test_a_symlinked_history_dir_is_refused(tmp_path):
    from conftest import Server

    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "hist"
    link.symlink_to(real)
    with pytest.raises(RuntimeError) as e:
        Server(["--history-dir", str(link)])
    assert str(link) in str(e.value) and "is a symbolic link" in str(e.value), e.value
    assert list(real.iterdir()) == []


def test_a_history_dir_owned_by_another_user_is_refused(tmp_path):
    """A directory another user made beforehand (in /tmp, say) is theirs: they could read the
    history or replace its files. Needs root to give a directory away (CI runs as root)."""
    from conftest import Server

    if os.geteuid() != 0:
        pytest.skip("needs root to chown a directory to nobody")
    d = tmp_path / "hist"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(RuntimeError) as e:
        Server(["--history-dir", str(d)])
    assert str(d) in str(e.value) and "is owned by uid 65534, not by uid 0" in str(e.value)
    assert list(d.iterdir()) == []


@pytest.mark.parametrize("m", [0o770, 0o707, 0o1777])
def test_a_history_dir_writable_by_group_or_others_is_refused(tmp_path, m):
    from conftest import Server

    d = tmp_path / "hist"
    d.mkdir()
    os.chmod(d, m)
    with pytest.raises(RuntimeError) as e:
        Server(["--history-dir", str(d)])
    assert str(d) in str(e.value) and "is writable by" in str(e.value), e.value
    assert "chmod 700" in str(e.value)
    assert mode(d) == m and list(d.iterdir()) == []


# --- RLIMIT_FSIZE (issue 55, item 10): a write past the file size limit is a refused publish
# (503 with the reason, counted, logged once), not a SIGXFSZ that kills the server.


def test_the_file_size_limit_refuses_the_publish_with_503_and_the_server_lives(
    start_server, tmp_path
):
    import resource
    import urllib.error
    import urllib.request

    limit = 64 * 1024

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    d = tmp_path / "hist"
    a = start_durable(start_server, d, preexec_fn=small_files)
    refused = []
    for i in range(200):
        req = urllib.request.Request(
            f"http://{a.api}/publish/t", data=b"x" * 2000, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200
        except urllib.error.HTTPError as e:
            refused.append((e.code, e.read().decode()))
            if len(refused) == 3:
                break
    assert a.proc.poll() is None, "the server died (SIGXFSZ)"
    assert len(refused) == 3, "the limit was never reached"
    for code, body in refused:
        assert code == 503 and "RLIMIT_FSIZE" in body, body
    m = a.metrics()
    assert m['clarion_history_write_errors_total{reason="file_too_large"}'] == 3
    assert m['clarion_history_write_errors_total{reason="disk_full"}'] == 0
    # Still serving: history reads and other requests are answered.
    got, _ = poll_all(a, "zzzz-1")
    assert len(got) == i - 2
    code, err = a.stop()
    assert code == 0, err
    # One warning per refused publish (there were two).
    lines = [l for l in err.splitlines() if "history could not be written" in l]
    assert len(lines) == 3, err


# --- Reading at start (issue 55, item 12): a segment is read piece by piece, and no more of
# it than a segment can be; a 1 GiB sparse file cost 1.05 GB of memory.


def peak_rss_bytes(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_huge_sparse_segment_is_read_in_bounded_memory_and_reported(start_server, tmp_path):
    d = tmp_path / "hist"
    a = start_durable(start_server, d)
    ids = publish_many(a, 20)
    a.stop()
    last = segments(d)[-1]
    huge = d / f"{int(last.stem) + 1:020}.seg"
    with open(huge, "wb") as f:
        f.truncate(1 << 30)  # sparse: no disk used
    os.chmod(huge, 0o600)
    b = start_durable(start_server, d)
    peak = peak_rss_bytes(b.proc.pid)
    print(f"peak RSS after start: {peak / 1e6:.1f} MB")
    got, _ = poll_all(b, "zzzz-1")
    _, err = b.stop()
    assert peak < 100 * 1024 * 1024, f"peak RSS {peak / 1e6:.0f} MB"
    assert [m["id"] for m in got] == ids, "the intact records are kept"
    assert f"{huge.name} is {1 << 30} bytes, more than a segment can be" in err, err
    assert "only its first" in err
    assert not huge.exists(), "replaced by the fresh segment, as damaged files are"
