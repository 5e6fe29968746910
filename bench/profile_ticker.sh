#!/bin/bash
# Where a server's time goes during the ticker: 15,000 idle WebSockets, one 32-byte message to
# all of them twice a second. Starts the server given after `--`, opens the connections with
# `clarion bench`, and once they are open (the publishing phase only) runs one of:
#   perf   `perf record -g` on the server's threads (report: OUT.perf.txt)
#   strace `strace -c -f` on the server's threads (syscall counts: OUT.strace.txt)
#   stat   `perf stat`: system calls by kind, context switches (voluntary, preempted)
#          (OUT.stat.txt)
#
#   bash bench/profile_ticker.sh perf OUT -- target/release/clarion serve --listen 127.0.0.1:PORT \
#        --api-listen 127.0.0.1:API --max-connections-per-address 0
#   bash bench/profile_ticker.sh strace OUT -- /path/to/uws_server PORT API 1
#
# PORT and API are read from the server's arguments (the first two numbers after host:), so
# the same bench flags fit every peer; N, ROUNDS and HELLO (a --ws-hello) may be set, and
# CLIENT_PREFIX runs the load client under a command (`chrt -b 0`: its processes do not
# preempt the server when a delivery wakes them, as a client on another machine would not).
set -euo pipefail
mode=$1 out=$2
shift 2
[ "$1" = "--" ] && shift
n=${N:-15000} rounds=${ROUNDS:-30}
here=$(cd "$(dirname "$0")/.." && pwd)
clarion=${CLARION_BIN:-$here/target/release/clarion}
ports=$(printf '%s\n' "$@" | grep -oE '(^|:)[0-9]{4,5}$' | tr -d ':' | head -2 | tr '\n' ' ')
read -r port api <<<"$ports"
ulimit -n 20000
"$@" >"$out.server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$api") 2>/dev/null && break; sleep 0.1; done
hello=()
[ -n "${HELLO:-}" ] && hello=(--ws-hello "$HELLO")
${CLIENT_PREFIX:-} "$clarion" bench --scenario ticker -n "$n" -m "$rounds" --interval-ms 500 --size 32 --hold 2 \
    --target "127.0.0.1:$port" --api "127.0.0.1:$api" --server-pid "$server" "${hello[@]}" \
    --json "$out.bench.json" >"$out.bench.txt" 2>&1 &
bench=$!
for _ in $(seq 600); do grep -q "connections open" "$out.bench.txt" 2>/dev/null && break; sleep 0.1; done
sleep 2  # the hold: connections idle, publishing starts
secs=$((rounds / 2 - 1))
case $mode in
    perf) perf record -g -o "$out.perf.data" -p "$server" -- sleep "$secs" 2>/dev/null
          perf report -i "$out.perf.data" --no-children --sort dso,symbol --stdio 2>/dev/null \
              | head -150 >"$out.perf.txt" || true ;;
    strace) timeout $((secs + 5)) strace -c -f -p "$server" -o "$out.strace.txt" &
            st=$!; sleep "$secs"; kill -INT $st; wait $st || true ;;
    stat) switches() {  # voluntary and involuntary context switches, all threads summed
              cat /proc/"$server"/task/*/status | awk '/^voluntary_ctxt/ {v += $2}
                  /^nonvoluntary_ctxt/ {n += $2} END {print v, n}'; }
          read -r v0 n0 < <(switches)
          perf stat -e task-clock,context-switches,cpu-migrations \
              -e syscalls:sys_enter_sendto,syscalls:sys_enter_writev,syscalls:sys_enter_write \
              -e syscalls:sys_enter_epoll_wait,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom \
              -e syscalls:sys_enter_futex,syscalls:sys_enter_io_uring_enter \
              -p "$server" -o "$out.stat.txt" -- sleep "$secs"
          read -r v1 n1 < <(switches)
          echo "context switches: $((v1 - v0)) voluntary, $((n1 - n0)) involuntary (preempted)" \
              >>"$out.stat.txt" ;;
    *) echo "mode: perf, strace or stat" >&2; exit 2 ;;
esac
wait $bench || true
tail -12 "$out.bench.txt"
