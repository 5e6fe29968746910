"""The container image (packaging/container/): built twice from the same static binary it is
the same bytes; unpacked, it holds the binary, the CA bundle and nothing else; its root,
entered with chroot as the image's user with the image's own entrypoint and arguments,
serves a WebSocket, an SSE stream and /healthz.

Needs the static musl binary (packaging/container/build.sh builds it, several minutes): set
CLARION_IMAGE_BIN, or it is taken from target/x86_64-unknown-linux-musl/release/clarion.
Skipped without it, and without root (chroot); not part of .ci/run's default steps."""

import io
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tarfile
import time

import pytest
import websockets.sync.client

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "packaging" / "container" / "oci_image.py"


def musl_binary():
    path = os.environ.get("CLARION_IMAGE_BIN") or str(
        pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
        / "x86_64-unknown-linux-musl" / "release" / "clarion"
    )
    if not os.path.isfile(path):
        pytest.skip(f"no static binary at {path} (packaging/container/build.sh builds it)")
    return path


def build(out, binary):
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--version", "0.0.0-test",
         "--revision", "test", "--binary", f"amd64={binary}"],
        check=True, capture_output=True, env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"},
    )
    return out.read_bytes()


def blob(layout, digest):
    return layout.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}").read()


def unpack(archive, dest):
    """The image's config and its root file system, as a runtime would lay it out."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as layout:
        index = json.loads(layout.extractfile("index.json").read())
        (desc,) = index["manifests"]
        assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
        manifest = json.loads(blob(layout, desc["digest"]))
        config = json.loads(blob(layout, manifest["config"]["digest"]))
        names = []
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(blob(layout, layer["digest"]))) as t:
                names += [(m.name, m.isdir(), m.mtime, m.uid) for m in t.getmembers()]
                t.extractall(dest, filter="fully_trusted")
    return config, names


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    d = tmp_path_factory.mktemp("image")
    # As build.sh does: without symbols (48 MB to 7 MB).
    binary = str(d / "clarion")
    subprocess.run(["strip", "-o", binary, musl_binary()], check=True)
    first = build(d / "a.oci.tar", binary)
    second = build(d / "b.oci.tar", binary)
    root = d / "root"
    root.mkdir()
    config, names = unpack(first, root)
    return first, second, config, names, root


def test_two_builds_of_the_same_inputs_are_the_same_bytes(image):
    first, second, _, _, _ = image
    assert first == second


def test_the_image_holds_the_binary_the_ca_bundle_and_nothing_else(image):
    _, _, config, names, _ = image
    files = sorted(n for n, is_dir, _, _ in names if not is_dir)
    assert files == ["clarion", "etc/ssl/certs/ca-certificates.crt"]
    assert {(m, u) for _, _, m, u in names} == {(1700000000, 0)}, "fixed time, owned by root"
    c = config["config"]
    assert c["User"] == "65532:65532"
    assert c["Entrypoint"] == ["/clarion", "serve"]
    labels = c["Labels"]
    for key in ("source", "version", "licenses", "revision", "created"):
        assert labels[f"org.opencontainers.image.{key}"], key
    assert config["created"] == "2023-11-14T22:13:20Z"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_unpacked_root_serves_websocket_sse_and_healthz_under_chroot(image):
    if os.geteuid() != 0 or not shutil.which("chroot"):
        pytest.skip("chroot needs root")
    _, _, config, _, root = image
    c = config["config"]
    client, api = free_port(), free_port()
    # The image's own command, with its listeners moved to free loopback ports (the test's
    # traffic stays on 127.0.0.1); a runtime gives the container a /proc, so does the test.
    args = [a for a in c["Cmd"] if not a.startswith(("--listen", "--api-listen"))]
    args += [f"--listen=127.0.0.1:{client}", f"--api-listen=127.0.0.1:{api}"]
    env = dict(e.split("=", 1) for e in c["Env"])
    (root / "proc").mkdir(exist_ok=True)
    cmd = ["unshare", "--mount", "sh", "-c",
           f'mount -t proc proc "{root}/proc" && exec chroot --userspec={c["User"]} "{root}" "$@"',
           "-", *c["Entrypoint"], *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("clarion ready"), (line, proc.stderr.read() if proc.poll() else "")
        with socket.create_connection(("127.0.0.1", api), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        sse = socket.create_connection(("127.0.0.1", client), timeout=5)
        sse.sendall(b"GET /sse?topic=t HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        assert sse.recv(4096).startswith(b"HTTP/1.1 200")
        with websockets.sync.client.connect(f"ws://127.0.0.1:{client}/ws?topic=t") as ws:
            time.sleep(0.2)
            with socket.create_connection(("127.0.0.1", api), timeout=5) as s:
                s.sendall(b"POST /publish/t HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
                          b"Connection: close\r\n\r\nhello")
                assert s.recv(4096).startswith(b"HTTP/1.1 200")
            assert "hello" in str(ws.recv(timeout=5))
        got = b""
        deadline = time.monotonic() + 5
        while b"hello" not in got and time.monotonic() < deadline:
            got += sse.recv(4096)
        assert b"data: hello" in got
        sse.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
