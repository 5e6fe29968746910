#!/usr/bin/env python3
"""Writes Clarion's container image as an OCI image layout archive, byte for byte the same for
the same inputs (no daemon, no builder state, no clock): one layer holding the static binary
and a CA bundle, the image config, a manifest per architecture and an index over them.

    oci_image.py --out clarion.oci.tar --version 0.1.0 --revision GITSHA \
        --binary amd64=target/x86_64-unknown-linux-musl/release/clarion \
        [--binary arm64=target/aarch64-unknown-linux-musl/release/clarion] \
        [--ca-bundle /etc/ssl/certs/ca-certificates.crt]

Every timestamp is SOURCE_DATE_EPOCH (the commit's time when build.sh calls it); files are
owned by root and read-only, entries sorted, the gzip header carries no name and no time.
`podman load -i clarion.oci.tar` or `skopeo copy oci-archive:clarion.oci.tar docker://...`
take the archive; docs/deploy.md#container-image explains the choices.
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import tarfile

# The user the server runs as: no name needed in a scratch image (no /etc/passwd); the
# value distroless images use for "nonroot".
UID = GID = 65532
CLIENT_PORT, API_PORT, TLS_PORT = 8080, 8081, 8443
SOURCE = "https://github.com/clarion-rs/clarion"


def tar_bytes(entries, mtime):
    """A tar of `entries` (path, mode, bytes or None for a directory), sorted, fixed owner
    and time, PAX format without per-file extended times."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for path, mode, data in sorted(entries, key=lambda e: e[0]):
            info = tarfile.TarInfo(path)
            info.mode, info.mtime = mode, mtime
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def gz(data):
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as f:
        f.write(data)
    return out.getvalue()


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Blobs:
    def __init__(self):
        self.blobs = {}

    def add(self, data, media_type):
        d = digest(data)
        self.blobs[d] = data
        return {"mediaType": media_type, "digest": d, "size": len(data)}


def image(blobs, arch, binary, ca, args, created, epoch):
    layer_tar = tar_bytes(
        [
            ("clarion", 0o555, binary),
            ("etc", 0o755, None),
            ("etc/ssl", 0o755, None),
            ("etc/ssl/certs", 0o755, None),
            ("etc/ssl/certs/ca-certificates.crt", 0o444, ca),
            # An empty, sticky /tmp: the hand-over socket's directory (TMPDIR) and a mount
            # point for a writable volume when the root file system is read-only.
            ("tmp", 0o1777, None),
        ],
        epoch,
    )
    layer = blobs.add(gz(layer_tar), "application/vnd.oci.image.layer.v1.tar+gzip")
    labels = {
        "org.opencontainers.image.title": "clarion",
        "org.opencontainers.image.description": "Clarion realtime push server",
        "org.opencontainers.image.source": SOURCE,
        "org.opencontainers.image.url": SOURCE,
        "org.opencontainers.image.version": args.version,
        "org.opencontainers.image.revision": args.revision,
        "org.opencontainers.image.licenses": args.licenses,
        "org.opencontainers.image.created": created,
    }
    config = {
        "created": created,
        "architecture": arch,
        "os": "linux",
        "config": {
            "User": f"{UID}:{GID}",
            "Entrypoint": ["/clarion", "serve"],
            # A container's clients and publishers come from outside its network namespace:
            # both listeners on every interface (the API's loopback default would be
            # unreachable). Protect the API with api_key and the network
            # (docs/deploy.md#the-api-in-a-container). Arguments, not CLARION_* variables:
            # a variable would override the configuration file; arguments given to the
            # container (a chart's `--config`) replace these.
            "Cmd": [f"--listen=0.0.0.0:{CLIENT_PORT}", f"--api-listen=0.0.0.0:{API_PORT}"],
            "Env": [
                "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
                "TMPDIR=/tmp",
            ],
            "ExposedPorts": {f"{p}/tcp": {} for p in (CLIENT_PORT, API_PORT, TLS_PORT)},
            "StopSignal": "SIGTERM",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [digest(layer_tar)]},
        "history": [{"created": created, "created_by": "packaging/container/oci_image.py"}],
    }
    cfg = blobs.add(
        json.dumps(config, sort_keys=True, separators=(",", ":")).encode(),
        "application/vnd.oci.image.config.v1+json",
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": cfg,
        "layers": [layer],
        "annotations": labels,
    }
    desc = blobs.add(
        json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode(),
        "application/vnd.oci.image.manifest.v1+json",
    )
    desc["platform"] = {"architecture": arch, "os": "linux"}
    return desc, labels


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--binary", action="append", required=True, help="ARCH=PATH (amd64, arm64)")
    p.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    p.add_argument("--version", required=True)
    p.add_argument("--revision", default="unknown")
    p.add_argument("--licenses", default="MIT OR Apache-2.0")
    p.add_argument("--tag", default=None, help="the reference name in index.json")
    args = p.parse_args()
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    with open(args.ca_bundle, "rb") as f:
        ca = f.read()
    blobs, manifests, labels = Blobs(), [], {}
    for spec in sorted(args.binary):
        arch, path = spec.split("=", 1)
        if arch not in ("amd64", "arm64"):
            p.error(f"unknown architecture {arch}")
        with open(path, "rb") as f:
            desc, labels = image(blobs, arch, f.read(), ca, args, created, epoch)
        manifests.append(desc)
    tag = args.tag or args.version
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {**m, "annotations": {"org.opencontainers.image.ref.name": tag}} for m in manifests
        ],
        "annotations": labels,
    }
    files = [
        ("oci-layout", 0o444, b'{"imageLayoutVersion":"1.0.0"}'),
        ("index.json", 0o444, json.dumps(index, sort_keys=True, separators=(",", ":")).encode()),
        ("blobs", 0o755, None),
        ("blobs/sha256", 0o755, None),
    ]
    files += [(f"blobs/sha256/{d[7:]}", 0o444, b) for d, b in blobs.blobs.items()]
    archive = tar_bytes(files, epoch)
    with open(args.out, "wb") as f:
        f.write(archive)
    print(f"{args.out}: {digest(archive)} ({len(archive)} bytes), "
          + ", ".join(f"{m['platform']['architecture']} {m['digest']}" for m in manifests))


if __name__ == "__main__":
    main()
