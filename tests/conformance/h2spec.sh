#!/usr/bin/env bash
# Runs h2spec (the HTTP/2 conformance suite: RFC 9113, RFC 7541 and generic server cases)
# against both client listeners: h2c with prior knowledge on the clear one, and HTTP/2 chosen by
# ALPN on the TLS one (a `clarion cert --dev` certificate). Every case must pass; the server
# must then stop cleanly.
#
#   tests/conformance/h2spec.sh
#
# Installs h2spec with `go install` when it is not on PATH (Go from Debian's golang-go when
# missing). Needs a built binary ($CLARION_BIN or target/release/clarion). Reports (JUnit XML)
# go to reports/h2spec/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${CLARION_BIN:-$root/target/release/clarion}"
out="$root/reports/h2spec"
rm -rf "$out" && mkdir -p "$out"

h2spec="$(command -v h2spec || true)"
if [ -z "$h2spec" ]; then
  if ! command -v go >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq golang-go >/dev/null
  fi
  GOBIN="$root/.ci/bin" go install github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible
  h2spec="$root/.ci/bin/h2spec"
fi

"$bin" cert --dev --dir "$out/cert" >/dev/null
log="$out/server.log"
"$bin" serve --listen 127.0.0.1:0 --api-listen 127.0.0.1:0 --tls-listen 127.0.0.1:0 \
  --tls-cert "$out/cert/cert.pem" --tls-key "$out/cert/key.pem" >"$out/ready" 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  [ -s "$out/ready" ] && break
  sleep 0.05
done
addr="$(sed -n 's/.*clients=\([^ ]*\).*/\1/p' "$out/ready")"
tls_addr="$(sed -n 's/.* tls=\([^ ]*\).*/\1/p' "$out/ready")"
[ -n "$addr" ] && [ -n "$tls_addr" ] || { echo "server did not start:"; cat "$log"; exit 1; }

status=0
run() {
  local name="$1" hostport="$2"
  shift 2
  "$h2spec" -h "${hostport%:*}" -p "${hostport##*:}" -o 5 -j "$out/$name.xml" "$@" >"$out/$name.log" 2>&1 || true
  local summary
  summary="$(grep -E '^[0-9]+ tests, ' "$out/$name.log" | tail -1)"
  printf '%-5s %s\n' "$name" "${summary:-no summary}"
  if ! [[ "$summary" =~ ^([0-9]+)\ tests,\ ([0-9]+)\ passed,\ 0\ skipped,\ 0\ failed$ ]] \
      || [ "${BASH_REMATCH[1]}" != "${BASH_REMATCH[2]}" ]; then
    sed -n '/^Failures:/,$p' "$out/$name.log" | head -60
    status=1
  fi
}
run h2c "$addr"
run tls "$tls_addr" -t -k

kill -TERM "$pid"
wait "$pid" || { echo "server did not exit cleanly:"; tail -20 "$log"; exit 1; }
trap - EXIT
exit $status
