#!/usr/bin/env bash
# Builds Clarion's container image, reproducibly, into target/container/clarion-VERSION.oci.tar
# (an OCI image layout archive: `podman load -i FILE`, `skopeo copy oci-archive:FILE
# docker://REGISTRY/clarion:VERSION`). FROM scratch: the static musl binary, a CA bundle, no
# shell, no package manager, uid 65532. Same commit, same bytes: every timestamp is the
# commit's (SOURCE_DATE_EPOCH), the layer is written by oci_image.py, not by a builder.
#
#   packaging/container/build.sh                      # builds the amd64 musl binary first
#   packaging/container/build.sh --binary amd64=PATH [--binary arm64=PATH]
#
# The arm64 image needs the aarch64 musl binary (target/aarch64-unknown-linux-musl/PROFILE/
# clarion, the cross build of packaging/build.sh or tests/cross/run.sh): it is included when
# that file exists, and the archive's index then lists linux/amd64 and linux/arm64.
# CROSS_PROFILE=cross-ci takes both binaries from the test profile tests/cross/run.sh builds
# (an image for testing, never for a release; the default is `release`).
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
out="$target_dir/container"
mkdir -p "$out"
version=$(packaging/version.sh)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"

binaries=()
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binaries+=(--binary "$2"); shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ ${#binaries[@]} -eq 0 ]; then
  # The static x86_64 binary: musl's C compiler for ring, the rest is Rust.
  rustup target list --installed | grep -q '^x86_64-unknown-linux-musl$' \
    || rustup target add x86_64-unknown-linux-musl
  command -v musl-gcc >/dev/null || { echo "musl-gcc missing: apt-get install musl-tools" >&2; exit 1; }
  profile="${CROSS_PROFILE:-release}"
  CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo build --profile "$profile" --locked --target x86_64-unknown-linux-musl -p clarion
  binaries+=(--binary "amd64=$target_dir/x86_64-unknown-linux-musl/$profile/clarion")
  arm="$target_dir/aarch64-unknown-linux-musl/$profile/clarion"
  if [ -f "$arm" ]; then
    binaries+=(--binary "arm64=$arm")
  else
    echo "no $arm: the image is amd64 only (the aarch64 musl build makes it)" >&2
  fi
fi
# Without symbols (the release profile keeps line tables for backtraces): 7 MB instead of 48.
# strip is deterministic, so the image stays reproducible.
stripped=()
for ((i = 1; i < ${#binaries[@]}; i += 2)); do
  arch="${binaries[$i]%%=*}" path="${binaries[$i]#*=}"
  tool=strip
  [ "$arch" = arm64 ] && tool=$(command -v aarch64-linux-gnu-strip || command -v llvm-strip || echo none)
  if [ "$tool" = none ]; then
    echo "no strip for $arch (binutils-aarch64-linux-gnu): its binary goes in with symbols" >&2
    stripped+=(--binary "$arch=$path")
  else
    "$tool" -o "$out/clarion-$arch" "$path"
    stripped+=(--binary "$arch=$out/clarion-$arch")
  fi
done
binaries=("${stripped[@]}")
python3 packaging/container/oci_image.py --out "$out/clarion-$version.oci.tar" \
  --version "$version" --revision "$revision" "${binaries[@]}"
