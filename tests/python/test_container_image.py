"""The container image (packaging/container/): built twice from the same static binary it is
the same bytes; unpacked, it holds the binary, the CA bundle and nothing else; its root,
entered with chroot as the image's user with the image's own entrypoint and arguments,
serves a WebSocket, an SSE stream and /healthz. With the aarch64 binary too, the archive is
a multi-arch index (linux/amd64 and linux/arm64), and the arm64 root serves the same way
under qemu-aarch64 (binfmt_misc, or qemu-aarch64-static given to chroot).

Needs the static musl binaries (packaging/container/build.sh builds them; .ci/run's cross
build makes both, profile cross-ci, and runs this file after it): CLARION_IMAGE_BIN and
CLARION_IMAGE_BIN_ARM64, else target/{x86_64,aarch64}-unknown-linux-musl/{release,cross-ci}/clarion.
Skipped without them, without root (chroot) or without qemu-aarch64; under CI=true each of these
fails instead (cluster_util.missing_service)."""

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
from cluster_util import free_port, missing_service

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "packaging" / "container" / "oci_image.py"


def musl_binary(arch="amd64"):
    variable, triple = {
        "amd64": ("CLARION_IMAGE_BIN", "x86_64-unknown-linux-musl"),
        "arm64": ("CLARION_IMAGE_BIN_ARM64", "aarch64-unknown-linux-musl"),
    }[arch]
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / triple
    candidates = [os.environ.get(variable)] if os.environ.get(variable) else [
        str(target / profile / "clarion") for profile in ("release", "cross-ci")
    ]
    for path in candidates:
        if os.path.isfile(path):
            return path
    missing_service(f"the static {arch} binary ({candidates}; packaging/container/build.sh)")


def stripped(binary, out, arch):
    """As build.sh does: without symbols (48 MB to 7 MB)."""
    tool = "strip" if arch == "amd64" else shutil.which("aarch64-linux-gnu-strip")
    if not tool:
        shutil.copy(binary, out)
    else:
        subprocess.run([tool, "-o", str(out), binary], check=True)
    return str(out)


def build(out, *binaries):
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--version", "0.0.0-test",
         "--revision", "test", *[a for b in binaries for a in ("--binary", b)]],
        check=True, capture_output=True, env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"},
    )
    return out.read_bytes()


def blob(layout, digest):
    return layout.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}").read()


def unpack(archive, dest, arch="amd64"):
    """The image's config and its root file system for `arch`, as a runtime would lay it
    out."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as layout:
        index = json.loads(layout.extractfile("index.json").read())
        (desc,) = [m for m in index["manifests"] if m["platform"]["architecture"] == arch]
        assert desc["platform"] == {"architecture": arch, "os": "linux"}
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
    binary = stripped(musl_binary(), d / "clarion", "amd64")
    first = build(d / "a.oci.tar", f"amd64={binary}")
    second = build(d / "b.oci.tar", f"amd64={binary}")
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


def test_the_unpacked_root_serves_websocket_sse_and_healthz_under_chroot(image):
    _, _, config, _, root = image
    serves_under_chroot(config, root)


def serves_under_chroot(config, root, interpreter=None, timeout=5):
    """Runs the image's entrypoint and command in `root` with chroot as the image's user
    (`interpreter`: a program inside the root that runs the entrypoint, qemu for another
    architecture), then checks /healthz, a WebSocket and an SSE stream receiving a publish."""
    if os.geteuid() != 0 or not shutil.which("chroot"):
        missing_service("chroot (run as root)")
    c = config["config"]
    client, api = free_port(), free_port()
    # The image's own command, with its listeners moved to free loopback ports (the test's
    # traffic stays on 127.0.0.1); a runtime gives the container a /proc, so does the test.
    args = [a for a in c["Cmd"] if not a.startswith(("--listen", "--api-listen"))]
    args += [f"--listen=127.0.0.1:{client}", f"--api-listen=127.0.0.1:{api}"]
    env = dict(e.split("=", 1) for e in c["Env"])
    (root / "proc").mkdir(exist_ok=True)
    program = ([interpreter] if interpreter else []) + c["Entrypoint"]
    cmd = ["unshare", "--mount", "sh", "-c",
           f'mount -t proc proc "{root}/proc" && exec chroot --userspec={c["User"]} "{root}" "$@"',
           "-", *program, *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("clarion ready"), (line, proc.stderr.read() if proc.poll() else "")
        with socket.create_connection(("127.0.0.1", api), timeout=timeout) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        sse = socket.create_connection(("127.0.0.1", client), timeout=timeout)
        sse.sendall(b"GET /sse?topic=t HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        assert sse.recv(4096).startswith(b"HTTP/1.1 200")
        with websockets.sync.client.connect(
            f"ws://127.0.0.1:{client}/ws?topic=t", open_timeout=timeout
        ) as ws:
            time.sleep(0.2)
            with socket.create_connection(("127.0.0.1", api), timeout=timeout) as s:
                s.sendall(b"POST /publish/t HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
                          b"Connection: close\r\n\r\nhello")
                assert s.recv(4096).startswith(b"HTTP/1.1 200")
            assert "hello" in str(ws.recv(timeout=timeout))
        got = b""
        deadline = time.monotonic() + timeout
        while b"hello" not in got and time.monotonic() < deadline:
            got += sse.recv(4096)
        assert b"data: hello" in got
        sse.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


# --------------------------------------------------------------------------------------------
# Both architectures: linux/amd64 and linux/arm64 in one index


@pytest.fixture(scope="module")
def multiarch(tmp_path_factory):
    arm = musl_binary("arm64")
    d = tmp_path_factory.mktemp("multiarch")
    amd = stripped(musl_binary(), d / "clarion-amd64", "amd64")
    arm = stripped(arm, d / "clarion-arm64", "arm64")
    archive = build(d / "multi.oci.tar", f"amd64={amd}", f"arm64={arm}")
    return d, archive


def test_the_archive_is_one_index_over_an_amd64_and_an_arm64_image(multiarch):
    d, archive = multiarch
    with tarfile.open(fileobj=io.BytesIO(archive)) as layout:
        index = json.loads(layout.extractfile("index.json").read())
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert sorted(m["platform"]["architecture"] for m in index["manifests"]) == ["amd64", "arm64"]
    assert {m["platform"]["os"] for m in index["manifests"]} == {"linux"}
    root = d / "arm64-root"
    root.mkdir()
    config, names = unpack(archive, root, "arm64")
    assert config["architecture"] == "arm64"
    files = sorted(n for n, is_dir, _, _ in names if not is_dir)
    assert files == ["clarion", "etc/ssl/certs/ca-certificates.crt"]
    if shutil.which("file"):
        out = subprocess.run(["file", "-b", str(root / "clarion")], capture_output=True, text=True)
        assert "ARM aarch64" in out.stdout and "static" in out.stdout, out.stdout


def qemu_for_chroot(root):
    """How an aarch64 program runs inside `root`: binfmt_misc with the F flag (the kernel
    opened the interpreter when it was registered, so it works in any root), else
    qemu-aarch64-static copied into the test's copy of the root and named by the command."""
    entry = pathlib.Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if entry.exists():
        text = entry.read_text()
        flags = next((l.split(":", 1)[1] for l in text.splitlines() if l.startswith("flags:")), "")
        if text.startswith("enabled") and "F" in flags:
            return None
    qemu = shutil.which("qemu-aarch64-static")
    if not qemu:
        missing_service("qemu-aarch64-static (Debian's qemu-user-static)")
    shutil.copy(qemu, root / "qemu-aarch64-static")
    return "/qemu-aarch64-static"


def test_the_unpacked_arm64_root_serves_websocket_sse_and_healthz_under_qemu(multiarch):
    d, archive = multiarch
    root = d / "arm64-run"
    root.mkdir()
    config, _ = unpack(archive, root, "arm64")
    serves_under_chroot(config, root, qemu_for_chroot(root), timeout=20)
