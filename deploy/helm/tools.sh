#!/usr/bin/env bash
# What deploy/helm/test.sh needs, built from the Go module proxy into target/go/ (bin/helm,
# and the strict checker's compiled dependencies in the build cache): .ci/run runs this in
# the background at nice 19 while the suites wait on servers, then runs test.sh with
#   HELM=target/go/bin/helm GOCACHE=target/go/cache GOMODCACHE=target/go/mod deploy/helm/test.sh
# Pinned: helm v3.16.4 (its go.sum is checked by the module proxy's checksum database), the
# checker's dependencies by check/go.sum. A second run finds both built and takes seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
go_dir="${CARGO_TARGET_DIR:-$PWD/target}/go"
export GOBIN="$go_dir/bin" GOCACHE="$go_dir/cache" GOMODCACHE="$go_dir/mod" GOFLAGS=-modcacherw
mkdir -p "$GOBIN"
command -v go >/dev/null || { echo "no go toolchain on PATH" >&2; exit 1; }
t0=$(date +%s)
# `go install` leaves helm's own version string at its minor ("v3.16"): a stamp says which
# release was built.
helm_version=v3.16.4
if [ ! -x "$GOBIN/helm" ] || [ "$(cat "$GOBIN/helm.version" 2>/dev/null)" != "$helm_version" ]; then
  go install "helm.sh/helm/v3/cmd/helm@$helm_version"
  echo "$helm_version" >"$GOBIN/helm.version"
fi
t1=$(date +%s)
# The checker and its test compiled once (k8s.io/api is most of it); test.sh then runs them.
(cd deploy/helm/check && go build -o /dev/null . && go test -count=1 -run '^$' ./... >/dev/null)
t2=$(date +%s)
echo "helm $helm_version: $((t1 - t0)) s; checker compiled: $((t2 - t1)) s"
