#!/usr/bin/env bash
# Builds the packages into target/packages/:
#   clarion-VERSION-py3-none-manylinux_*_x86_64.whl   (maturin, bindings = "bin": the stripped
#                                                       binary + the test helper; depends on
#                                                       clarion-client)
#   clarion_client-VERSION-py3-none-any.whl           (flit: the Python clients, pure Python)
#   clarion-VERSION.tgz, clarion-linux-x64-VERSION.tgz (npm pack of node/clarion and of the
#                                                       platform package, holding the same binary)
#   clarion-client-VERSION.tgz                         (npm pack of node/client: @clarion/client)
#
# Reusing the release build: maturin runs `cargo rustc --profile release --bin clarion --
# -C strip=symbols`, so every dependency compiled by `cargo build --release -p clarion` is reused
# and only the clarion crate is compiled and linked again, stripped (about a minute on 2 cores;
# nothing when the stripped build is already there). The npm platform package takes the binary
# out of the wheel, so both ecosystems ship the same bytes.
#
#   packaging/build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
out="$root/target/packages"
version=$(packaging/version.sh)
rm -rf "$out/dist" "$out/npm"
mkdir -p "$out/dist" "$out/npm"

venv="$out/.venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r packaging/requirements.txt

# The wheel. maturin checks manylinux compliance (the binary needs only libc and libgcc_s, so
# there is nothing to graft and no patchelf needed) and tags the wheel with the oldest glibc
# its symbols allow on this machine.
(cd python && "$venv/bin/maturin" build --release --locked --out "$out/dist" --quiet)
wheel=$(ls "$out"/dist/clarion-"$version"-py3-none-manylinux_*_x86_64.whl)
# The clients' wheel, pure Python: flit_core from the same pinned virtualenv, no isolation, so
# nothing is fetched at build time.
"$venv/bin/pip" wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
  -w "$out/dist" python/client

# The npm packages: copies of node/ with the binary put into the platform package.
cp -r node/clarion node/platforms/linux-x64 "$out/npm/"
mkdir -p "$out/npm/linux-x64/bin"
"$venv/bin/python" - "$wheel" "$out/npm/linux-x64/bin/clarion" "$version" <<'PY'
import sys, zipfile, os
wheel, dest, version = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, open(dest, "wb") as f:
    f.write(z.read(f"clarion-{version}.data/scripts/clarion"))
os.chmod(dest, 0o755)
PY
(cd "$out/dist" && npm pack --silent "$out/npm/clarion" "$out/npm/linux-x64" "$root/node/client" >/dev/null)
ls -l "$out"/dist/*.whl "$out"/dist/*.tgz | awk '{print $5, $9}'
