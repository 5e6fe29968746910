#!/usr/bin/env bash
# The chart's checks: `helm lint` and `helm template` for the default values and each file of
# clarion/ci/ (Sentinel, Cluster, everything on), every rendered object decoded strictly into
# its Kubernetes API type (check/, go run), and the drain arithmetic refused when it is wrong.
#
#   HELM=/path/to/helm deploy/helm/test.sh
#
# helm comes from the Go module proxy, pinned (`go install helm.sh/helm/v3/cmd/helm@v3.16.4`,
# about 15 minutes of compiling on 2 busy cores, once; .ci/run caches it under target/). The
# strict check's dependencies are pinned in check/go.sum.
set -euo pipefail
cd "$(dirname "$0")"
helm="${HELM:-helm}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
kube=1.30.0
"$helm" lint clarion --kube-version "$kube" --strict >/dev/null
"$helm" template t clarion --kube-version "$kube" > "$out/default.yaml"
for f in clarion/ci/*.yaml; do
  "$helm" lint clarion --kube-version "$kube" --strict -f "$f" >/dev/null
  "$helm" template t clarion --kube-version "$kube" -f "$f" > "$out/$(basename "$f")"
done
# A grace period shorter than preStop + drain + shutdown is refused.
if "$helm" template t clarion --kube-version "$kube" \
    --set drain.terminationGracePeriodSeconds=20 >/dev/null 2>&1; then
  echo "a grace period below the drain was accepted" >&2
  exit 1
fi
# The chart ships the dashboard of deploy/grafana/ unchanged.
cmp ../grafana/clarion.json clarion/dashboards/clarion.json
(cd check && go test -count=1 ./... >/dev/null && go run . "$out"/*.yaml)
