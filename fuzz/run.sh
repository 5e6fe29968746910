#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (default 15 s each, FUZZ_SECONDS to change), starting
# from the committed seeds. A crash fails the run and leaves its input in fuzz/artifacts/<target>;
# turn it into a regression test before fixing it. Installs a nightly toolchain and cargo-fuzz
# when missing.
#
# libFuzzer runs on one core, so targets run FUZZ_JOBS at a time (default: one per core); each
# still gets its full FUZZ_SECONDS.
#
#   fuzz/run.sh                 # all targets
#   fuzz/run.sh ws_receiver     # one target
#   fuzz/run.sh --build         # only install and build (.ci/run does it in the background)
set -euo pipefail
cd "$(dirname "$0")"
build_only=0
[ "${1:-}" = --build ] && { build_only=1; shift; }
seconds="${FUZZ_SECONDS:-15}"
jobs="${FUZZ_JOBS:-$(nproc)}"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --quiet
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(sed -n 's/^name = "\(.*\)"/\1/p' Cargo.toml | grep -v clarion-fuzz)
cargo +nightly fuzz build -O >/dev/null
[ $build_only = 0 ] || exit 0
bin_dir="target/$(rustc -vV | sed -n 's/^host: //p')/release"

# One target: its own corpus (seeded), its artifacts directory, its log; 0 or the crash status.
fuzz_one() {
  local t=$1 corpus="corpus/$1"
  mkdir -p "$corpus" "artifacts/$t"
  cp -n seeds/"$t"/* "$corpus"/ 2>/dev/null || true
  "$bin_dir/$t" -artifact_prefix="artifacts/$t/" -max_total_time="$seconds" -max_len=65536 \
    "$corpus" >"corpus/$t.log" 2>&1
}

report() { # target, status
  if [ "$2" -ne 0 ]; then
    printf '%-24s CRASH\n' "$1"
    tail -40 "corpus/$1.log"
    return 1
  fi
  printf '%-24s %s\n' "$1" "$(grep -Eo 'Done [0-9]+ runs' "corpus/$1.log" | tail -1)"
}

declare -A running=() # pid -> target
failed=0
for t in "${targets[@]}"; do
  while [ ${#running[@]} -ge "$jobs" ]; do
    status=0
    wait -n -p done_pid "${!running[@]}" || status=$?
    report "${running[$done_pid]}" "$status" || failed=1
    unset "running[$done_pid]"
  done
  [ $failed -eq 0 ] || break
  fuzz_one "$t" &
  running[$!]=$t
done
for pid in "${!running[@]}"; do
  status=0
  wait "$pid" || status=$?
  report "${running[$pid]}" "$status" || failed=1
done
exit $failed
