#!/usr/bin/env bash
# The packages' version comes from one place: `[workspace.package] version` in Cargo.toml.
# The server wheel gets it from maturin (which reads the crate's `version.workspace = true`); the
# npm packages carry it in their package.json files, the clarion-client wheel in
# python/client/pyproject.toml (and the server wheel's pin on it), which this script checks
# (default: fails on a difference) or stamps (`--write`, run it after bumping the version).
#
#   packaging/version.sh [--write]
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml)
[ -n "$version" ] || { echo "no [workspace.package] version in Cargo.toml" >&2; exit 1; }
if [ "${1:-}" = "--write" ]; then
  node - "$version" <<'JS'
const fs = require('fs');
const v = process.argv[2];
const files = ['node/clarion/package.json', 'node/client/package.json',
  ...fs.readdirSync('node/platforms').sort().map((d) => `node/platforms/${d}/package.json`)];
for (const f of files) {
  const p = JSON.parse(fs.readFileSync(f, 'utf8'));
  p.version = v;
  for (const dep of Object.keys(p.optionalDependencies ?? {})) p.optionalDependencies[dep] = v;
  fs.writeFileSync(f, JSON.stringify(p, null, 2) + '\n');
}
JS
  # The Python clients' wheel, and the server wheel's pin on it.
  sed -i "s/^version = \".*\"/version = \"$version\"/" python/client/pyproject.toml
  sed -i "s/\"clarion-client==[^\"]*\"/\"clarion-client==$version\"/" python/pyproject.toml
  echo "stamped $version"
  exit 0
fi
node - "$version" <<'JS'
const fs = require('fs');
const v = process.argv[2];
let bad = 0;
const files = ['node/clarion/package.json', 'node/client/package.json',
  ...fs.readdirSync('node/platforms').sort().map((d) => `node/platforms/${d}/package.json`)];
for (const f of files) {
  const p = JSON.parse(fs.readFileSync(f, 'utf8'));
  const found = [['version', p.version], ...Object.entries(p.optionalDependencies ?? {})];
  for (const [what, got] of found) {
    if (got !== v) {
      console.error(`${f}: ${what} is ${got}, the workspace version is ${v} (run packaging/version.sh --write)`);
      bad = 1;
    }
  }
}
// The launcher's optional dependencies are exactly the platform packages (node/platforms/*).
const named = Object.keys(JSON.parse(fs.readFileSync('node/clarion/package.json', 'utf8')).optionalDependencies).sort();
const platforms = files.filter((f) => f.startsWith('node/platforms/'))
  .map((f) => JSON.parse(fs.readFileSync(f, 'utf8')).name).sort();
if (named.join() !== platforms.join()) {
  console.error(`node/clarion/package.json: optionalDependencies ${named} differ from node/platforms/*: ${platforms}`);
  bad = 1;
}
process.exit(bad);
JS
grep -q '^dynamic = \["version"\]' python/pyproject.toml \
  || { echo "python/pyproject.toml must take its version from Cargo (dynamic = [\"version\"])" >&2; exit 1; }
grep -q "^version = \"$version\"" python/client/pyproject.toml \
  || { echo "python/client/pyproject.toml: version is not $version (run packaging/version.sh --write)" >&2; exit 1; }
grep -q "\"clarion-client==$version\"" python/pyproject.toml \
  || { echo "python/pyproject.toml must depend on clarion-client==$version (run packaging/version.sh --write)" >&2; exit 1; }
echo "$version"
