#!/usr/bin/env bash
# Tests the packages as users install them (.ci/run calls this after the release build):
#  1. builds the wheel and the npm tarballs (packaging/build.sh);
#  2. Python: a fresh virtualenv, `pip install` of the wheel file (and of the clarion-client
#     wheel it depends on), then `clarion --help`, `python -m clarion`, and python/tests (the
#     pytest plugin's fixture starts servers; the sync and async clients publish; `websockets`
#     receives; every API error is mapped); then the clarion-client wheel alone in another
#     fresh virtualenv: no server comes with it, its Subscriber gets what its Client publishes;
#  3. Node: a fresh directory, `npm install --ignore-scripts` of the two tarballs, then
#     `npx clarion --help` and node/test (the helper starts servers; the client publishes; `ws`
#     receives); and an install without optional dependencies, whose launcher must fail with
#     the message naming @clarion/linux-x64; and @clarion/client alone in another fresh
#     directory (with `ws`, as Node 20 needs): no server comes with it, it receives over the
#     WebSocket and over SSE;
#  4. the sizes docs/packaging.md states as bounds.
#
#   packaging/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
version=$(packaging/version.sh)
packaging/build.sh
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
  "overrides": { "@clarion/linux-x64": "file:$dist/clarion-linux-x64-$version.tgz" }
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
echo "packages OK: $(basename "$wheel") $(du -k "$wheel" | cut -f1) KiB"
