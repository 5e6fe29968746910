#!/usr/bin/env bash
# The cross builds, tested (issue 48): from this x86_64 machine,
#   - builds clarion for aarch64-unknown-linux-gnu, aarch64-unknown-linux-musl and
#     x86_64-unknown-linux-musl (static) with the cheap `cross-ci` profile (Cargo.toml says why),
#     and checks with `file` that each is the arch and linkage it should be;
#   - runs the proto and server unit tests for aarch64 under qemu-aarch64 (cargo's runner,
#     .cargo/config.toml);
#   - runs an end-to-end subset of tests/python (SUBSET below) and the TLS KeyUpdate test
#     against the aarch64 binary under emulation and against the static x86_64 musl binary;
#   - runs the static binary in an empty root (tests/cross/empty_root.py), and (full run) the
#     container image of both musl binaries (tests/python/test_container_image.py).
# Installs what it uses (rustup targets, Debian's gcc-aarch64-linux-gnu, musl-tools,
# qemu-user-static) and registers qemu-aarch64 with binfmt_misc, so that an aarch64 server can
# start its own successor (`/proc/self/exe`) in the hand-over test. Prints each step's time.
#
#   tests/cross/run.sh            (as root; CLARION_PYTHON: a Python with tests/python's deps)
#   tests/cross/run.sh --ci       what .ci/run runs, to stay inside its time budget: the three
#                                 builds; the aarch64 glibc binary under qemu and the static
#                                 x86_64 musl binary, each with the end-to-end subset; both
#                                 static binaries in an empty root and in the container image
#                                 (amd64 and arm64); the aarch64 unit tests under qemu (about
#                                 5 minutes of CPU to build, 2 to run) are left to the full run
#   tests/cross/run.sh [--ci] install|build|test
#                                 one phase: what to install, the builds and their `file`
#                                 checks, the tests (.ci/run builds in the background while
#                                 other suites run, then tests)
set -euo pipefail
ci=0
[ "${1:-}" = --ci ] && { ci=1; shift; }
phase=${1:-all}
case "$phase" in
  all | install | build | test) ;;
  *) echo "usage: tests/cross/run.sh [--ci] [install|build|test]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
root="$PWD"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
python="${CLARION_PYTHON:-python}"
profile=cross-ci
targets=(aarch64-unknown-linux-gnu aarch64-unknown-linux-musl x86_64-unknown-linux-musl)
started=$(date +%s)
timings=()
timed() {
  local name=$1 t0 rc=0
  shift
  t0=$(date +%s)
  printf '\n--> %s\n' "$name"
  "$@" || rc=$?
  timings+=("$(printf '%5d s  %s' $(($(date +%s) - t0)) "$name")")
  [ $rc -eq 0 ] || { printf 'FAILED: %s\n' "$name"; exit $rc; }
}

install() {
  local have missing=()
  have=$(rustup target list --installed)
  for t in "${targets[@]}"; do grep -qx "$t" <<<"$have" || missing+=("$t"); done
  [ ${#missing[@]} -eq 0 ] || rustup target add "${missing[@]}"
  missing=()
  command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
  [ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ] || missing+=(libc6-dev-arm64-cross)
  command -v musl-gcc >/dev/null || missing+=(musl-tools)
  command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
  command -v file >/dev/null || missing+=(file)
  if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  # binfmt_misc: an aarch64 executable started by anyone (the tests, a server's upgrade) runs
  # under qemu. The Debian entry has flag F (the interpreter is opened now), so it works in
  # chroots too. Left registered: it changes nothing for x86_64 programs.
  local bm=/proc/sys/fs/binfmt_misc
  [ -e "$bm/register" ] || mount -t binfmt_misc binfmt_misc "$bm"
  [ -e "$bm/qemu-aarch64" ] || cat /usr/lib/binfmt.d/qemu-aarch64.conf >"$bm/register"
}

# One cargo for the three targets: the end of one target's build (the server crate and the
# link, one core each) overlaps with the others' dependencies, so both cores stay busy.
build() {
  local args=()
  for t in "${targets[@]}"; do args+=(--target "$t"); done
  cargo build --locked --profile "$profile" "${args[@]}" -p clarion
}

# Each artifact is what it claims: the arch, and static where it must be.
check_files() {
  local t f out
  for t in "${targets[@]}"; do
    f="$target_dir/$t/$profile/clarion"
    out=$(file -L "$f")
    echo "$out"
    case "$t" in
      aarch64-*) grep -q 'ARM aarch64' <<<"$out" ;;
      x86_64-*) grep -q 'x86-64' <<<"$out" ;;
    esac || { echo "FAILED: $t is the wrong arch"; return 1; }
    case "$t" in
      *-musl) grep -qE 'static-pie linked|statically linked' <<<"$out" ;;
      *-gnu) grep -q 'ld-linux-aarch64.so.1' <<<"$out" ;;
    esac || { echo "FAILED: $t has the wrong linkage"; return 1; }
  done
}

# The unit tests of the protocol and server crates, compiled for aarch64, run by qemu.
unit_aarch64() {
  cargo test --locked --profile "$profile" --target aarch64-unknown-linux-gnu \
    -p clarion-proto -p clarion-server
}

# One test per area the issue names, chosen for coverage per second under emulation: a test
# that only repeats an area (the same code path again with another parameter) is left to
# the native run. About a minute against the emulated binary.
SUBSET=(
  "tests/python/test_compression.py::test_browser_style_offer_gets_shared_mode_and_compressed_broadcasts"
  "tests/python/test_transports.py::test_sse_resume_with_last_event_id_is_gap_free"
  "tests/python/test_transports.py::test_poll_is_held_until_a_message_arrives"
  "tests/python/test_api.py::test_publish_single_and_batch_in_order"
  "tests/python/test_tls.py::test_websockets_over_wss_get_every_message_in_order[1.3]"
  "tests/python/test_http2.py::test_websocket_over_h2_with_permessage_deflate"
  "tests/python/test_http2.py::test_sse_resume_with_last_event_id_gets_exactly_the_missed[tls]"
  "tests/python/test_cluster.py::test_a_publish_on_one_node_reaches_every_transport_on_the_others"
  "tests/python/test_handover.py::test_an_upgrade_keeps_every_connection_and_delivers_every_message_once[memory]"
)

end_to_end() {
  local bin=$1
  CLARION_BIN="$bin" "$python" -m pytest -q -rs -p no:cacheprovider --timeout 120 "${SUBSET[@]}"
  # TLS 1.3 KeyUpdates (a Rust client: Python's ssl cannot send them); the host test binary,
  # already built by `cargo test --workspace`, against the cross-built server.
  CLARION_BIN="$bin" cargo test --locked -p clarion --test tls_key_update -q
}

if [ "$phase" = all ] || [ "$phase" = install ]; then
  timed "install targets, cross toolchains, qemu" install
fi
if [ "$phase" = all ] || [ "$phase" = build ]; then
  timed "cross build (${targets[*]}, profile $profile)" build
  timed "file: arch and linkage of each artifact" check_files
fi
if [ "$phase" = all ] || [ "$phase" = test ]; then
  [ $ci = 1 ] || timed "unit tests, aarch64 under qemu (clarion-proto, clarion-server)" unit_aarch64
  # The cross glibc for binaries the kernel hands to qemu through binfmt.
  export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
  timed "end-to-end subset, aarch64 glibc binary under qemu" \
    end_to_end "$target_dir/aarch64-unknown-linux-gnu/$profile/clarion"
  timed "end-to-end subset, static x86_64 musl binary" \
    end_to_end "$target_dir/x86_64-unknown-linux-musl/$profile/clarion"
  timed "static x86_64 musl binary in an empty root (WebSocket, TLS)" \
    "$python" tests/cross/empty_root.py "$target_dir/x86_64-unknown-linux-musl/$profile/clarion"
  timed "static aarch64 musl binary in an empty root, under qemu (WebSocket, TLS)" \
    "$python" tests/cross/empty_root.py "$target_dir/aarch64-unknown-linux-musl/$profile/clarion"
  # The container image of both static binaries: two builds the same bytes, one index over
  # linux/amd64 and linux/arm64, each root run with chroot (the arm64 one under qemu).
  timed "container image, amd64 and arm64 (docs/deploy.md#container-image)" \
    env CLARION_IMAGE_BIN="$target_dir/x86_64-unknown-linux-musl/$profile/clarion" \
    CLARION_IMAGE_BIN_ARM64="$target_dir/aarch64-unknown-linux-musl/$profile/clarion" \
    "$python" -m pytest -q -rs -p no:cacheprovider --timeout 120 tests/python/test_container_image.py
fi

printf '\ncross steps (%s):\n' "$phase"
printf '%s\n' "${timings[@]}"
printf '%5d s  all\n' $(($(date +%s) - started))
