#!/usr/bin/env bash
# Runs every Autobahn TestSuite case (1.* to 13.*, through `kosoku`) against Clarion's echo
# endpoint and compares the verdicts with expected.json. The 12.* and 13.* cases exercise
# permessage-deflate with every offer shape; the server runs with --compression-threshold 0 so
# every echoed message is compressed (kosoku mishandles uncompressed text inside a compressed
# session, which RFC 7692 allows and Clarion otherwise does for short messages).
#
#   tests/conformance/run.sh [--write]
#   tests/conformance/run.sh --tls [--all]
#
# With --tls the cases run over TLS: the server also listens for TLS (a `clarion cert --dev`
# certificate) and tls_proxy.py relays the runner's clear-text connections to it over TLS, so
# the cases exercise the TLS record layer too. By default a representative subset runs (framing,
# fragmentation, UTF-8, close, messages up to 16 MiB in one frame and in 1-byte fragments,
# limits, deflate basics: about 300 cases, 40 s); --all runs all 517 (about 6 min).
#
# Needs `kosoku` on PATH (the CI virtualenv has it) and a built binary ($CLARION_BIN or
# target/release/clarion). Automatic pings are off: the runner counts an unexpected ping as a
# failure. Reports go to reports/conformance/ (open index.html in a browser).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${CLARION_BIN:-$root/target/release/clarion}"
tls=0 all=0 check_args=()
for a in "$@"; do
  case "$a" in
    --tls) tls=1 ;;
    --all) all=1 ;;
    *) check_args+=("$a") ;;
  esac
done
out="$root/reports/conformance"
[ $tls = 1 ] && out="$root/reports/conformance-tls"
rm -rf "$out" && mkdir -p "$out"

log="$out/server.log"
# The clear run deflates at zlib level 1: the 12.* cases echo 1,000 nearly incompressible
# messages of up to 128 KiB each, and level 6 spends about twice the server CPU on them (about
# 70 s of the run) for no other difference in the protocol. The TLS run keeps the default (6).
server_args=(--compression-level 1)
if [ $tls = 1 ]; then
  "$bin" cert --dev --dir "$out/cert" >/dev/null
  server_args=(--compression-level 6 --tls-listen 127.0.0.1:0 --tls-cert "$out/cert/cert.pem" --tls-key "$out/cert/key.pem")
fi
"$bin" serve --listen 127.0.0.1:0 --api-listen 127.0.0.1:0 --echo-path /echo \
  --ping-interval 0 --idle-timeout 0 --max-message-size 16777216 --compression-threshold 0 \
  "${server_args[@]}" >"$out/ready" 2>"$log" &
pid=$!
proxy=
trap 'kill "$pid" $proxy 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  [ -s "$out/ready" ] && break
  sleep 0.05
done
addr="$(sed -n 's/.*clients=\([^ ]*\).*/\1/p' "$out/ready")"
[ -n "$addr" ] || { echo "server did not start:"; cat "$log"; exit 1; }

cases=()
if [ $tls = 1 ]; then
  tls_addr="$(sed -n 's/.* tls=\([^ ]*\).*/\1/p' "$out/ready")"
  python3 "$here/tls_proxy.py" 0 "$tls_addr" "$out/cert/ca.pem" >"$out/proxy.ready" 2>"$out/proxy.log" &
  proxy=$!
  for _ in $(seq 100); do
    [ -s "$out/proxy.ready" ] && break
    sleep 0.05
  done
  addr="127.0.0.1:$(awk '{print $2}' "$out/proxy.ready")"
  if [ $all = 0 ]; then
    for c in '1.*' '2.*' '3.*' '4.*' '5.*' '6.*' '7.*' '9.1.*' '9.2.*' '9.4.*' '10.*' '12.1.*' '13.1.*'; do
      cases+=(-i "$c")
    done
    check_args+=(--present-only)
  fi
fi

timeout 1200 kosoku "ws://$addr/echo" -o "$out" -p 2 "${cases[@]}" >"$out/kosoku.log" 2>&1 \
  || { echo "kosoku failed:"; tail -20 "$out/kosoku.log"; exit 1; }

kill -TERM "$pid"
wait "$pid" || { echo "server did not exit cleanly:"; tail -20 "$log"; exit 1; }
trap - EXIT
[ -n "$proxy" ] && kill "$proxy" 2>/dev/null
python3 "$here/check.py" "$out/index.json" "$here/expected.json" "${check_args[@]}"
