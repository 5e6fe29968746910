#!/usr/bin/env bash
# One command for the million-connection run (issue 18; docs/benchmarks.md, "Million").
#
#   bench/million.sh                      # 1,000,000 WebSockets held 10 minutes
#   bench/million.sh -n 200000 --hold 120 # the same path, quickly
#   bench/million.sh --tls -n 500000      # the same over TLS 1.3 (`clarion cert --dev`)
#
# It raises the kernel limits it needs (printing each change; nothing is restored silently:
# the end of the run prints the commands that put the old values back), starts a private
# redis-server (no persistence) and `clarion serve --processes P --broker redis://...` with P
# chosen so no process holds more than --per-process connections (the open-files limit is
# 20,000 per process here), then `clarion bench --scenario million`, which starts its own
# worker processes (each under the same limit, each from its own 127.0.0.x source address).
# Everything it started is stopped on exit, on failure and on Ctrl-C.
#
# Options: -n N, --hold SECONDS (600), --interval SECONDS (60: pings, broadcast and room
# messages once per interval), --pings-only (nothing published: the Raspberry Pi seed's "a
# million sockets pinged every 16 s" is `--pings-only --interval 16`),
# --rate CONNECTIONS_PER_SECOND (5000), --rooms N (10000),
# --per-process N (18500), --tls (clients connect over TLS 1.3 to a `--tls-listen` port, with a
# development certificate made for the run), --tag NAME (results file names), --bin PATH
# (target/release/clarion), --port PORT (28080; the API is PORT+1, TLS PORT+2, Redis PORT-1701).
set -euo pipefail

N=1000000 HOLD=600 INTERVAL=60 RATE=5000 ROOMS=10000 PER_PROC=18500 TAG="" PORT=28080 TLS=0
PINGS_ONLY=()
BIN=${CLARION_BIN:-target/release/clarion}
while [ $# -gt 0 ]; do
  case "$1" in
    -n) N=$2; shift 2 ;;
    --hold) HOLD=$2; shift 2 ;;
    --interval) INTERVAL=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --rooms) ROOMS=$2; shift 2 ;;
    --per-process) PER_PROC=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --tls) TLS=1; shift ;;
    --pings-only) PINGS_ONLY=(--pings-only); shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "million.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
API=$((PORT + 1)) REDIS_PORT=$((PORT - 1701))
TAG=${TAG:-${N}$([ "$TLS" = 1 ] && echo -tls)-$(date -u +%Y%m%d-%H%M)}
OUT=bench/results
mkdir -p "$OUT"
RUN=$(mktemp -d /tmp/clarion-million.XXXXXX)
[ -x "$BIN" ] || { echo "million.sh: $BIN not found: cargo build --release -p clarion" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "million.sh: redis-server is needed" >&2; exit 2; }

SUP="" REDIS="" BENCH="" RESTORE=()
stop_all() {
  local rc=$?
  trap - EXIT INT TERM
  [ -n "$BENCH" ] && kill "$BENCH" 2>/dev/null || true
  if [ -n "$SUP" ] && kill -0 "$SUP" 2>/dev/null; then
    echo "stopping the server group (pid $SUP)"
    kill -TERM "$SUP" 2>/dev/null || true
    # shutdown_timeout (10 s) + the supervisor's own 5 s, then a second signal kills.
    for _ in $(seq 1 300); do kill -0 "$SUP" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$SUP" 2>/dev/null && { kill -TERM "$SUP" 2>/dev/null || true; sleep 1; }
    kill -0 "$SUP" 2>/dev/null && kill -KILL "$SUP" 2>/dev/null || true
  fi
  if [ -n "$REDIS" ]; then kill -TERM "$REDIS" 2>/dev/null || true; wait "$REDIS" 2>/dev/null || true; fi
  if [ ${#RESTORE[@]} -gt 0 ]; then
    echo "kernel settings changed by this run (left as they are; to put them back):"
    printf '  %s\n' "${RESTORE[@]}"
  fi
  rm -rf "$RUN"
  exit $rc
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# --- kernel limits -------------------------------------------------------------------------
# raise KEY VALUE: set KEY to VALUE when its current value is lower (first field compared).
raise() {
  local key=$1 want=$2 cur
  cur=$(sysctl -n "$key" | tr -s '\t ' ' ')
  if [ "${cur%% *}" -lt "${want%% *}" ]; then
    echo "sysctl $key: $cur -> $want"
    sysctl -q -w "$key=$want"
    RESTORE+=("sysctl -w $key='$cur'")
  else
    echo "sysctl $key: $cur (enough)"
  fi
}
WORKERS=$(( (N + 18999) / 19000 ))
PER_WORKER=$(( (N + WORKERS - 1) / WORKERS ))
read -r LO HI < <(sysctl -n net.ipv4.ip_local_port_range)
if [ $((HI - LO)) -lt $((PER_WORKER + 2000)) ]; then
  echo "sysctl net.ipv4.ip_local_port_range: $LO $HI -> 32768 65000 (each source address holds $PER_WORKER)"
  sysctl -q -w net.ipv4.ip_local_port_range="32768 65000"
  RESTORE+=("sysctl -w net.ipv4.ip_local_port_range='$LO $HI'")
fi
raise net.core.somaxconn 4096
raise fs.nr_open 1048576
# Two descriptors per loopback connection (client and server) plus the rest of the machine.
raise fs.file-max $((2 * N + 500000))
raise net.ipv4.tcp_max_orphans "$N"
# TCP buffer pages (min pressure max): idle sockets hold none, but a broadcast queues one
# message on every socket at once.
read -r M0 M1 M2 < <(sysctl -n net.ipv4.tcp_mem)
if [ "$M2" -lt "$N" ]; then
  echo "sysctl net.ipv4.tcp_mem: $M0 $M1 $M2 -> $((N / 2)) $((N * 3 / 4)) $N (pages)"
  sysctl -q -w net.ipv4.tcp_mem="$((N / 2)) $((N * 3 / 4)) $N"
  RESTORE+=("sysctl -w net.ipv4.tcp_mem='$M0 $M1 $M2'")
fi
if [ -r /proc/sys/net/netfilter/nf_conntrack_count ] && [ "$(cat /proc/sys/net/netfilter/nf_conntrack_count)" -gt 0 ]; then
  raise net.netfilter.nf_conntrack_max $((N + 100000))
fi
ulimit -n "$(ulimit -Hn)"
echo "open files per process: $(ulimit -n)"
AVAIL_KB=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
# ~10.3 KB of kernel memory per loopback pair and ~1.5 KB of user space; over TLS the server
# keeps ~1.5 KB more and the bench's rustls clients ~6 KB.
NEED_KB=$(( N * (TLS ? 20 : 12) ))
echo "memory: $((AVAIL_KB / 1024)) MiB available, about $((NEED_KB / 1024)) MiB needed"
[ "$AVAIL_KB" -gt "$NEED_KB" ] || { echo "million.sh: not enough memory for $N connections" >&2; exit 1; }
echo "load: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

# --- redis and the server group ------------------------------------------------------------
for p in "$PORT" "$API" "$((PORT + 2))" "$REDIS_PORT"; do
  if ss -Hltn "sport = :$p" | grep -q .; then echo "million.sh: port $p is in use (--port)" >&2; exit 1; fi
done
nice -n -5 redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --loglevel warning --logfile "$RUN/redis.log" &
REDIS=$!
for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$REDIS_PORT" ping >/dev/null || { echo "million.sh: redis-server did not start" >&2; exit 1; }

PROCS=$(( (N + PER_PROC - 1) / PER_PROC )); [ "$PROCS" -ge 2 ] || PROCS=2
echo "starting clarion serve --processes $PROCS (at most ~$PER_PROC connections each)"
# Over TLS the clients use the TLS port (PORT+2); the clear-text one stays open and unused.
TLS_SERVE=() TLS_BENCH=() TARGET_PORT=$PORT
if [ "$TLS" = 1 ]; then
  "$BIN" cert --dev --dir "$RUN/tls" >/dev/null
  TARGET_PORT=$((PORT + 2))
  TLS_SERVE=(--tls-listen "127.0.0.1:$TARGET_PORT" --tls-cert "$RUN/tls/cert.pem" --tls-key "$RUN/tls/key.pem")
  TLS_BENCH=(--tls-ca "$RUN/tls/ca.pem" --tls-name localhost)
fi
CLARION_LOG=warn "$BIN" serve --processes "$PROCS" --broker "redis://127.0.0.1:$REDIS_PORT" \
  --listen "127.0.0.1:$PORT" --api-listen "127.0.0.1:$API" "${TLS_SERVE[@]}" \
  --max-connections-per-address 0 >"$RUN/server.out" 2>"$OUT/million-$TAG.server.log" &
SUP=$!
for _ in $(seq 1 1200); do grep -q "clarion ready" "$RUN/server.out" 2>/dev/null && break; kill -0 "$SUP" || break; sleep 0.1; done
grep -q "clarion ready" "$RUN/server.out" || { echo "million.sh: the server group did not start" >&2; cat "$OUT/million-$TAG.server.log" >&2; exit 1; }
CHILDREN=$(pgrep -P "$SUP" -d, || true)
[ "$(echo "$CHILDREN" | tr ',' '\n' | grep -c .)" -eq "$PROCS" ] || { echo "million.sh: expected $PROCS server processes, found $CHILDREN" >&2; exit 1; }

# --- the run ---------------------------------------------------------------------------------
set +e
"$BIN" bench --scenario million -n "$N" --target "127.0.0.1:$TARGET_PORT" --api "127.0.0.1:$API" \
  "${TLS_BENCH[@]}" \
  --server-pid "$SUP,$CHILDREN" --broker-pid "$REDIS" --hold "$HOLD" \
  --interval-ms $((INTERVAL * 1000)) --connect-rate "$RATE" --topics "$ROOMS" --drain 60 \
  "${PINGS_ONLY[@]}" \
  --json "$OUT/million-$TAG.json" --report "$OUT/million-$TAG.html" \
  > >(tee "$OUT/million-$TAG.txt") &
BENCH=$!
wait "$BENCH"; RC=$?
BENCH=""
set -e
{
  echo "redis: $(redis-cli -p "$REDIS_PORT" info memory | grep -E '^used_memory(_rss)?_human' | tr -d '\r' | tr '\n' ' ')"
  echo "redis: $(redis-cli -p "$REDIS_PORT" info cpu | grep -E '^used_cpu_(sys|user):' | tr -d '\r' | tr '\n' ' ')"
  echo "redis: $(redis-cli -p "$REDIS_PORT" info stats | grep -E '^total_commands_processed' | tr -d "\r" | tr "\n" " ")"
  echo "server processes restarted during the run: $(grep -c 'starting it again' "$OUT/million-$TAG.server.log" || true)"
} | tee -a "$OUT/million-$TAG.txt"
echo "report: $OUT/million-$TAG.html, $OUT/million-$TAG.json, $OUT/million-$TAG.txt"
exit "$RC"
