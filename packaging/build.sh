#!/usr/bin/env bash
# Builds the packages into target/packages/, for each platform asked for (PLATFORMS):
#   clarion-VERSION-py3-none-TAG.whl          (maturin, bindings = "bin": the stripped binary +
#                                              the test helper; depends on clarion-client)
#   clarion_client-VERSION-py3-none-any.whl   (flit: the Python clients, pure Python)
#   clarion-VERSION.tgz                       (npm pack of node/clarion: the launcher)
#   clarion-PLATFORM-VERSION.tgz              (npm pack of node/platforms/PLATFORM, holding the
#                                              binary taken out of that platform's wheel)
#   clarion-client-VERSION.tgz                (npm pack of node/client: @clarion/client)
#
#   platform          Rust target                  wheel tag                     npm package
#   linux-x64         (the host's)                 manylinux_2_X_x86_64          @clarion/linux-x64
#   linux-arm64       aarch64-unknown-linux-gnu    manylinux_2_X_aarch64         @clarion/linux-arm64
#   linux-x64-musl    x86_64-unknown-linux-musl    musllinux_1_2_x86_64 (static) @clarion/linux-x64-musl
#   linux-arm64-musl  aarch64-unknown-linux-musl   musllinux_1_2_aarch64 (static)@clarion/linux-arm64-musl
#
# Reusing the builds: maturin runs `cargo rustc --profile P [--target T] --bin clarion --
# -C strip=symbols`, so every dependency already compiled with that profile for that target is
# reused and only the clarion crate (86 lines) is compiled and linked again, stripped. For the
# host that is `cargo build --release -p clarion`'s (about a minute on 2 cores). A cross
# platform built for the first time in `release` compiles every dependency for its target:
# several minutes each on 2 idle cores (docs/packaging.md gives the times).
# CROSS_PROFILE=cross-ci builds the cross platforms with the test profile instead, reusing what
# tests/cross/run.sh built (what CI does: those wheels are for testing the packaging, never for
# a release, which uses `release`, the default).
#
#   packaging/build.sh                     linux-x64 only
#   packaging/build.sh --all               the four platforms
#   PLATFORMS="linux-x64 linux-arm64" packaging/build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
all_platforms="linux-x64 linux-arm64 linux-x64-musl linux-arm64-musl"
[ "${1:-}" = --all ] && PLATFORMS=$all_platforms
platforms=${PLATFORMS:-linux-x64}
cross_profile=${CROSS_PROFILE:-release}
out="$root/target/packages"
version=$(packaging/version.sh)
# The Rust target and the wheel's file name pattern of a platform.
rust_target() {
  case $1 in
    linux-x64) echo "" ;;
    linux-arm64) echo aarch64-unknown-linux-gnu ;;
    linux-x64-musl) echo x86_64-unknown-linux-musl ;;
    linux-arm64-musl) echo aarch64-unknown-linux-musl ;;
    *) echo "unknown platform $1 (known: $all_platforms)" >&2; return 1 ;;
  esac
}
wheel_tag() {
  case $1 in
    linux-x64) echo "manylinux_*_x86_64" ;;
    linux-arm64) echo "manylinux_*_aarch64" ;;
    linux-x64-musl) echo "musllinux_1_2_x86_64" ;;
    linux-arm64-musl) echo "musllinux_1_2_aarch64" ;;
  esac
}
for p in $platforms; do rust_target "$p" >/dev/null; done
rm -rf "$out/dist" "$out/npm"
mkdir -p "$out/dist" "$out/npm"

venv="$out/.venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r packaging/requirements.txt

npm_dirs=("$out/npm/clarion")
cp -r node/clarion "$out/npm/"
for p in $platforms; do
  target=$(rust_target "$p")
  started=$(date +%s)
  # The wheels. maturin checks the platform tag's compliance: the glibc binaries need only libc
  # and libgcc_s (nothing to graft, no patchelf), and are tagged with the oldest glibc their
  # symbols allow; the musl ones are static (Rust's musl targets link musl 1.2 in), so
  # musllinux_1_2 holds for any musl, and they run on glibc systems too.
  args=(--release)
  tag=manylinux
  if [ -n "$target" ]; then
    [ "$cross_profile" = release ] || args=(--profile "$cross_profile")
    args+=(--target "$target")
    case $target in *-musl) args+=(--compatibility musllinux_1_2) ;; esac
  fi
  (cd python && "$venv/bin/maturin" build "${args[@]}" --locked --out "$out/dist" --quiet)
  wheel=$(ls "$out"/dist/clarion-"$version"-py3-none-$(wheel_tag "$p").whl)
  # The npm platform package: a copy of node/platforms/$p with the wheel's binary, so that both
  # ecosystems ship the same bytes.
  cp -r "node/platforms/$p" "$out/npm/"
  mkdir -p "$out/npm/$p/bin"
  "$venv/bin/python" - "$wheel" "$out/npm/$p/bin/clarion" "$version" <<'PY'
import sys, zipfile, os
wheel, dest, version = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, open(dest, "wb") as f:
    f.write(z.read(f"clarion-{version}.data/scripts/clarion"))
os.chmod(dest, 0o755)
PY
  npm_dirs+=("$out/npm/$p")
  echo "built $p (${target:-host}, $([ -n "$target" ] && echo "$cross_profile" || echo release)): $(basename "$wheel") in $(($(date +%s) - started)) s"
done
# The clients' wheel, pure Python: flit_core from the same pinned virtualenv, no isolation, so
# nothing is fetched at build time.
"$venv/bin/pip" wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
  -w "$out/dist" python/client
(cd "$out/dist" && npm pack --silent "${npm_dirs[@]}" "$root/node/client" >/dev/null)
ls -l "$out"/dist/*.whl "$out"/dist/*.tgz | awk '{print $5, $9}'
