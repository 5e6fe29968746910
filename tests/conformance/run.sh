#!/usr/bin/env bash
# Runs every Autobahn TestSuite case (1.* to 13.*, through `kosoku`) against Clarion's echo
# endpoint and compares the verdicts with expected.json. The 12.* and 13.* cases exercise
# permessage-deflate with every offer shape; the server runs with --compression-threshold 0 so
# every echoed message is compressed (kosoku mishandles uncompressed text inside a compressed
# session, which RFC 7692 allows and Clarion otherwise does for short messages).
#
#   tests/conformance/run.sh [--write]
#
# Needs `kosoku` on PATH (the CI virtualenv has it) and a built binary ($CLARION_BIN or
# target/release/clarion). Automatic pings are off: the runner counts an unexpected ping as a
# failure. Reports go to reports/conformance/ (open index.html in a browser).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${CLARION_BIN:-$root/target/release/clarion}"
out="$root/reports/conformance"
rm -rf "$out" && mkdir -p "$out"

log="$out/server.log"
"$bin" serve --listen 127.0.0.1:0 --api-listen 127.0.0.1:0 --echo-path /echo \
  --ping-interval 0 --idle-timeout 0 --max-message-size 16777216 --compression-threshold 0 \
  >"$out/ready" 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  [ -s "$out/ready" ] && break
  sleep 0.05
done
addr="$(sed -n 's/.*clients=\([^ ]*\).*/\1/p' "$out/ready")"
[ -n "$addr" ] || { echo "server did not start:"; cat "$log"; exit 1; }

timeout 1200 kosoku "ws://$addr/echo" -o "$out" -p 2 >"$out/kosoku.log" 2>&1 \
  || { echo "kosoku failed:"; tail -20 "$out/kosoku.log"; exit 1; }

kill -TERM "$pid"
wait "$pid" || { echo "server did not exit cleanly:"; tail -20 "$log"; exit 1; }
trap - EXIT
python3 "$here/check.py" "$out/index.json" "$here/expected.json" "$@"
