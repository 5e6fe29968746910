#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (default 15 s each, FUZZ_SECONDS to change), starting
# from the committed seeds. A crash fails the run and leaves its input in fuzz/artifacts/<target>;
# turn it into a regression test before fixing it. Installs a nightly toolchain and cargo-fuzz
# when missing.
#
#   fuzz/run.sh                 # all targets
#   fuzz/run.sh ws_receiver     # one target
set -euo pipefail
cd "$(dirname "$0")"
seconds="${FUZZ_SECONDS:-15}"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --quiet
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(sed -n 's/^name = "\(.*\)"/\1/p' Cargo.toml | grep -v clarion-fuzz)
cargo +nightly fuzz build -O >/dev/null
for t in "${targets[@]}"; do
  corpus="corpus/$t"
  mkdir -p "$corpus"
  cp -n seeds/"$t"/* "$corpus"/ 2>/dev/null || true
  printf '%-14s ' "$t"
  if ! cargo +nightly fuzz run -O "$t" "$corpus" -- -max_total_time="$seconds" -max_len=65536 \
      >"corpus/$t.log" 2>&1; then
    echo "CRASH"
    tail -40 "corpus/$t.log"
    exit 1
  fi
  grep -Eo 'Done [0-9]+ runs' "corpus/$t.log" | tail -1
done
