#!/usr/bin/env bash
# Tests the packages as users install them (.ci/run calls this after the release build):
#  1. builds the wheels and the npm tarballs (packaging/build.sh) of linux-x64 and of the
#     platforms in PLATFORMS (or all four with --all);
#  2. Python: a fresh virtualenv, `pip install` of the wheel file (and of the clarion-client
#     wheel it depends on), then `clarion --help`, `python -m clarion`, and python/tests (the
#     pytest plugin's fixture starts servers; the sync and async clients publish; `websockets`
#     receives; every API error is mapped); then the clarion-client wheel alone in another
#     fresh virtualenv: no server comes with it, its Subscriber gets what its Client publishes;
#  3. Node: a fresh directory, `npm install --ignore-scripts` of the tarballs, then
#     `npx clarion --help` and node/test (the helper starts servers; the client publishes; `ws`
#     receives); and an install without optional dependencies, whose launcher must fail with
#     the message naming @clarion/linux-x64; and @clarion/client alone in another fresh
#     directory (with `ws`, as Node 20 needs): no server comes with it, it receives over the
#     WebSocket and over SSE;
#  4. each other platform under its arch (aarch64 under qemu-aarch64 through binfmt_misc, which
#     tests/cross/run.sh install registers; the static x86_64 musl binary natively): `file`
#     shows its arch and linkage; pip installs its wheel for that platform (`--platform`) and the
#     installed `clarion --version` runs; the clarion-client tests run against that installed
#     server; npm installs the tarballs as that platform (`--cpu`/`--libc`), which must fetch
#     exactly its platform package, and the binary the launcher's choice names for that machine
#     (locateBinary, the function the launcher calls) runs; on this x86_64 glibc machine the
#     launcher itself runs the static x86_64 musl binary when it is the only one installed;
#  5. the sizes docs/packaging.md states as bounds (cross platforms: when built in `release`).
#
#   packaging/test.sh                         linux-x64
#   packaging/test.sh --all                   the four platforms (release builds: slow)
#   PLATFORMS="linux-arm64 linux-x64-musl linux-arm64-musl" CROSS_PROFILE=cross-ci packaging/test.sh
#                                             what .ci/run runs: the cross binaries
#                                             tests/cross/run.sh --ci built, packaged and tested
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
version=$(packaging/version.sh)
all_platforms="linux-x64 linux-arm64 linux-x64-musl linux-arm64-musl"
[ "${1:-}" = --all ] && PLATFORMS=$all_platforms
# linux-x64 always: the host's, which the full Python and Node suites run.
cross=$(for p in ${PLATFORMS:-}; do [ "$p" = linux-x64 ] || echo "$p"; done | xargs)
PLATFORMS="linux-x64 $cross" packaging/build.sh
dist="$root/target/packages/dist"
wheel=$(ls "$dist"/clarion-"$version"-py3-none-manylinux_*_x86_64.whl)
client_wheel="$dist/clarion_client-$version-py3-none-any.whl"
client_tgz="$dist/clarion-client-$version.tgz"
work=$(mktemp -d "${TMPDIR:-/tmp}/clarion-packages.XXXXXX")
# CLARION_KEEP_INSTALLS=1 keeps the installs for packaging/measure.py (the path is printed).
if [ -n "${CLARION_KEEP_INSTALLS:-}" ]; then echo "installs in $work"; else trap 'rm -rf "$work"' EXIT; fi
export CLARION_EXPECTED_VERSION="$version"
# The installed packages must find their own binary, not one given to the integration tests.
unset CLARION_BIN CLARION_BINARY_PATH

echo "--- Python: pip install $(basename "$wheel") into a fresh virtualenv"
python3 -m venv "$work/venv"
# The server wheel depends on clarion-client, not on PyPI before a release: both files are given
# (after a release, `pip install clarion` fetches it).
"$work/venv/bin/pip" install -q --disable-pip-version-check "$wheel" "$client_wheel" -r python/tests/requirements.txt
(
  export PATH="$work/venv/bin:$PATH"
  cd "$work"
  clarion --help >/dev/null
  python -m clarion --version
  # Run from a copy so that nothing under python/src can shadow the installed package.
  cp -r "$root/python/tests" "$work/pytests"
  python -m pytest -q -p no:cacheprovider --timeout 120 pytests
  # The hints as users see them: py.typed shipped, the API type-checks strictly.
  (cd pytests && mypy --strict --no-incremental typecheck_consumer.py)
)

echo "--- Python: pip install $(basename "$client_wheel") alone into a fresh virtualenv"
python3 -m venv "$work/venv-client"
"$work/venv-client/bin/pip" install -q --disable-pip-version-check "$client_wheel" pytest==9.2.0 pytest-timeout==2.4.0
(
  cd "$work"
  cp -r "$root/python/client/tests" "$work/client-pytests"
  # The server binary the other packages ship; not part of this install, nor on its PATH.
  CLARION_TEST_SERVER="$root/target/packages/npm/linux-x64/bin/clarion" PATH="$work/venv-client/bin:/usr/bin:/bin" \
    python -m pytest -q -p no:cacheprovider --timeout 60 client-pytests
)

echo "--- Node: npm install --ignore-scripts of the tarballs into a fresh directory"
# The platform package is not on the registry before a release, so an override points the
# optional dependency at its tarball (after a release, `npm install clarion` needs nothing).
# Every platform package the clarion tarball names is pointed at a local tarball, so that npm
# never asks the registry for one (they are not published before a release): the one built, else
# a stub of the same name and platform fields without a binary (npm skips it as for another
# platform; the launcher would report it as installed without bin/clarion).
overrides=""
for p in $all_platforms; do
  tgz="$dist/clarion-$p-$version.tgz"
  if [ ! -e "$tgz" ]; then
    mkdir -p "$work/stubs"
    cp -r "node/platforms/$p" "$work/stubs/"
    tgz="$work/stubs/clarion-$p-$version.tgz"
    (cd "$work/stubs" && npm pack --silent "./$p" >/dev/null)
  fi
  overrides+="${overrides:+, }\"@clarion/$p\": \"file:$tgz\""
done
ws_version=$(node -p "require('$root/tests/node/package-lock.json').packages['node_modules/ws'].version")
mkdir "$work/npm"
cat >"$work/npm/package.json" <<JSON
{
  "name": "clarion-package-test",
  "private": true,
  "type": "module",
  "dependencies": {
    "clarion": "file:$dist/clarion-$version.tgz",
    "ws": "$ws_version"
  },
  "devDependencies": { "typescript": "5.9.3", "@types/node": "20.19.43" },
  "overrides": { $overrides }
}
JSON
cp node/test/*.test.js node/test/types/consumer.ts "$work/npm/"
(
  cd "$work/npm"
  npm install --ignore-scripts --no-audit --no-fund --silent
  npx --no-install clarion --help >/dev/null
  node --test --test-timeout=120000
  # The .d.ts files as users see them: a strict compile of a consumer of every entry point.
  npx --no-install tsc --noEmit --strict --module nodenext --moduleResolution nodenext \
    --target es2022 --types node consumer.ts
)

echo "--- Node: the launcher's error when the platform package is missing (--omit=optional)"
mkdir "$work/npm-noopt"
grep -v devDependencies "$work/npm/package.json" >"$work/npm-noopt/package.json"
(
  cd "$work/npm-noopt"
  npm install --ignore-scripts --omit=optional --no-audit --no-fund --silent
  if out=$(npx --no-install clarion --help 2>&1); then
    echo "clarion ran without its platform package" >&2
    exit 1
  fi
  grep -q "@clarion/linux-x64, which is not installed" <<<"$out" || { echo "unclear error: $out" >&2; exit 1; }
  echo "ok: $(grep "^clarion:" <<<"$out" | cut -c1-150)..."
)
echo "--- Node: npm install of @clarion/client alone into a fresh directory"
mkdir "$work/npm-client"
cat >"$work/npm-client/package.json" <<JSON
{
  "name": "clarion-client-package-test",
  "private": true,
  "type": "module",
  "dependencies": { "@clarion/client": "file:$client_tgz", "ws": "$ws_version" }
}
JSON
cp node/client/test/*.test.js "$work/npm-client/"
(
  cd "$work/npm-client"
  npm install --ignore-scripts --no-audit --no-fund --silent
  CLARION_TEST_SERVER="$root/target/packages/npm/linux-x64/bin/clarion" node --test --test-timeout=60000
)
# Each other platform under its arch. The aarch64 binaries run under qemu-aarch64 through
# binfmt_misc, the glibc one with the cross glibc as its root for libraries.
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
for p in $cross; do
  started=$(date +%s)
  case $p in
    linux-arm64) cpu=arm64 libc=glibc file_says='ARM aarch64.*dynamically linked' ;;
    linux-x64-musl) cpu=x64 libc=musl file_says='x86-64.*(static-pie|statically) linked' ;;
    linux-arm64-musl) cpu=arm64 libc=musl file_says='ARM aarch64.*(static-pie|statically) linked' ;;
  esac
  if [ $cpu = arm64 ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    echo "$p: qemu-aarch64 is not registered with binfmt_misc (run tests/cross/run.sh install as root)" >&2
    exit 1
  fi
  p_wheel=$(ls "$dist"/clarion-"$version"-py3-none-*.whl | grep -E "$([ $libc = musl ] && echo musllinux || echo manylinux)_[0-9_]+_$([ $cpu = x64 ] && echo x86_64 || echo aarch64)")
  echo "--- $p: $(basename "$p_wheel") and @clarion/$p"
  p_bin="$root/target/packages/npm/$p/bin/clarion"
  file -b "$p_bin" | grep -Eq "$file_says" || { echo "$p: file says $(file -b "$p_bin"), not /$file_says/" >&2; exit 1; }
  echo "file: $(file -b "$p_bin" | cut -d, -f1-2,4-6)"
  # pip, as on that machine: the wheel's own platform tag, nothing else allowed.
  tag=$(basename "$p_wheel" .whl); tag=${tag##*-}; tag=${tag%%.*}
  "$work/venv/bin/pip" install -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform "$tag" --target "$work/py-$p" "$p_wheel"
  got=$("$work/py-$p/bin/clarion" --version)
  [ "$got" = "clarion $version" ] || { echo "$p: the wheel's clarion --version says '$got'" >&2; exit 1; }
  # A server from that wheel: the clarion-client tests publish and subscribe through it.
  (
    cd "$work"
    CLARION_TEST_SERVER="$work/py-$p/bin/clarion" PATH="$work/venv-client/bin:/usr/bin:/bin" \
      python -m pytest -q -p no:cacheprovider --timeout 120 client-pytests
  )
  # npm, as on that machine: exactly its platform package arrives; the launcher's choice for
  # that machine names it, and it runs.
  mkdir "$work/npm-$p"
  grep -v devDependencies "$work/npm/package.json" >"$work/npm-$p/package.json"
  (
    cd "$work/npm-$p"
    npm install --ignore-scripts --no-audit --no-fund --silent --os linux --cpu $cpu --libc $libc
    installed=$(ls node_modules/@clarion 2>/dev/null | xargs)
    [ "$installed" = "$p" ] || { echo "$p: npm --cpu $cpu --libc $libc installed @clarion/{$installed}" >&2; exit 1; }
    chosen=$(node --input-type=module -e "
      import { existsSync } from 'node:fs';
      import { locateBinary } from 'clarion/binary';
      const header = '$libc' === 'glibc' ? { glibcVersionRuntime: '2.36' } : {};
      console.log(locateBinary({ platform: 'linux', arch: '$cpu', header, exists: existsSync }));")
    [ "$chosen" = "$PWD/node_modules/@clarion/$p/bin/clarion" ] || { echo "$p: the choice was $chosen" >&2; exit 1; }
    got=$("$chosen" --version)
    [ "$got" = "clarion $version" ] || { echo "$p: $chosen --version says '$got'" >&2; exit 1; }
    if [ $p = linux-x64-musl ]; then
      # This machine is x86_64 glibc: the launcher falls back to the static binary.
      got=$(npx --no-install clarion --version)
      [ "$got" = "clarion $version" ] || { echo "$p: npx clarion --version says '$got'" >&2; exit 1; }
    fi
  )
  echo "ok: $p in $(($(date +%s) - started)) s"
done

# The sizes docs/packaging.md states as bounds, measured here rather than typed there: a build
# that outgrows one fails, and the figures are printed for the release notes.
size_within() { # FILE BOUND_BYTES WHAT
  local n
  n=$(stat -c %s "$1")
  echo "size: $3 $n bytes (bound $2)"
  [ "$n" -le "$2" ] || { echo "$3 is $n bytes, over the $2 docs/packaging.md states" >&2; exit 1; }
}
size_within "$root/target/packages/npm/linux-x64/bin/clarion" $((12 * 1024 * 1024)) "stripped binary"
size_within "$wheel" $((6 * 1024 * 1024)) "wheel"
size_within "$(ls "$dist"/clarion-linux-x64-"$version".tgz)" $((6 * 1024 * 1024)) "@clarion/linux-x64 tarball"
size_within "$(ls "$dist"/clarion-"$version".tgz)" $((100 * 1024)) "clarion tarball"
size_within "$client_wheel" $((100 * 1024)) "clarion-client wheel"
size_within "$client_tgz" $((100 * 1024)) "@clarion/client tarball"
if [ "${CROSS_PROFILE:-release}" = release ]; then
  for p in $cross; do
    size_within "$root/target/packages/npm/$p/bin/clarion" $((12 * 1024 * 1024)) "stripped binary ($p)"
    size_within "$(ls "$dist"/clarion-"$version"-py3-none-*.whl | grep -E "$(case $p in linux-arm64) echo manylinux_.*_aarch64 ;; linux-x64-musl) echo musllinux_1_2_x86_64 ;; linux-arm64-musl) echo musllinux_1_2_aarch64 ;; esac)")" \
      $((6 * 1024 * 1024)) "wheel ($p)"
    size_within "$dist/clarion-$p-$version.tgz" $((6 * 1024 * 1024)) "@clarion/$p tarball"
  done
fi
echo "packages OK: $(basename "$wheel") $(du -k "$wheel" | cut -f1) KiB"
