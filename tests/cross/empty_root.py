"""The static musl binary in an empty root: `chroot` into a directory that holds only the
binary, a CA bundle and a certificate with its key, then subscribe over WebSocket, plain and
TLS, and receive a publish on each. Proves the binary needs no shared library, no loader, no
/proc, /dev or /etc of the distribution to serve (docs/packaging.md, "The static binary").

    python tests/cross/empty_root.py BINARY   (as root: chroot needs it)

Prints `empty-root: 2 passed, 0 failed` or fails with the server's log.
"""

import json
import os
import pathlib
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.request

from websockets.sync.client import connect

CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def make_root(binary: str, root: pathlib.Path) -> pathlib.Path:
    """The root: /clarion, /etc/ssl/certs/ca-certificates.crt, /tls/{cert,key}.pem; returns
    the dev CA (kept outside, for the client)."""
    shutil.copy2(binary, root / "clarion")
    bundle = next((b for b in CA_BUNDLES if os.path.exists(b)), None)
    if bundle is None:
        sys.exit("no CA bundle on this machine (ca-certificates)")
    (root / "etc/ssl/certs").mkdir(parents=True)
    shutil.copy2(bundle, root / "etc/ssl/certs/ca-certificates.crt")
    certs = root.parent / "dev-tls"
    subprocess.run([binary, "cert", "--dev", "--dir", str(certs)], check=True, capture_output=True)
    (root / "tls").mkdir()
    for name in ("cert.pem", "key.pem"):
        shutil.copy2(certs / name, root / "tls" / name)
    return certs / "ca.pem"


def main() -> int:
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="clarion-empty-root-") as tmp:
        root = pathlib.Path(tmp) / "root"
        root.mkdir()
        ca = make_root(binary, root)
        held = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        print("root holds:", " ".join(held))
        env = {"PATH": "/"}  # nothing the server could find there
        proc = subprocess.Popen(
            [shutil.which("chroot") or "/usr/sbin/chroot", str(root), "/clarion", "serve", "--listen", "127.0.0.1:0",
             "--api-listen", "127.0.0.1:0", "--tls-listen", "127.0.0.1:0",
             "--tls-cert", "/tls/cert.pem", "--tls-key", "/tls/key.pem"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        try:
            line = proc.stdout.readline()
            if not line.startswith("clarion ready"):
                proc.kill()
                print(f"FAILED: no ready line: {line!r}\n{proc.stderr.read()}")
                return 1
            fields = dict(part.split("=", 1) for part in line.split()[2:])
            tls = ssl.create_default_context(cafile=str(ca))
            passed = failed = 0
            for name, url, ctx in (
                ("ws", f"ws://{fields['clients']}/ws?topic=t", None),
                ("wss", f"wss://localhost:{fields['tls'].rsplit(':', 1)[1]}/ws?topic=t", tls),
            ):
                with connect(url, ssl=ctx, open_timeout=20) as ws:
                    body = f"hello over {name}".encode()
                    req = urllib.request.Request(
                        f"http://{fields['api']}/publish/t", data=body, method="POST")
                    with urllib.request.urlopen(req, timeout=10) as r:
                        json.load(r)
                    got = ws.recv(timeout=10)
                    ok = got == body.decode()
                    print(f"{name}: {'ok' if ok else 'FAILED, got ' + repr(got)}")
                    passed, failed = passed + ok, failed + (not ok)
        finally:
            proc.terminate()
            try:
                _, err = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
        if failed:
            print(err)
        print(f"empty-root: {passed} passed, {failed} failed")
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
