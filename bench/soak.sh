#!/usr/bin/env bash
# The chaos soak (issue 34; docs/benchmarks.md, "Chaos soak"): one command.
#
#   bench/soak.sh --minutes 60                  # the hour: 20,000 clients, 1,000 msgs/s
#   bench/soak.sh --minutes 4 --clients 4000    # the CI version (.ci/run)
#
# It starts a private redis-server with AOF on (appendfsync everysec) and
# `clarion serve --processes 3 --broker redis://...`, then `clarion bench --scenario soak`:
# --clients logical clients spread over 1,000 topics and over several bench processes (each
# from its own 127.0.0.x): --browser-share percent of them (40) connect as browsers and
# Clarion's own clients do, in turn a permessage-deflate WebSocket that subscribes in-band with
# a compressed message, an HTTP/2 connection (h2c) with 6 SSE streams, and the same two over
# TLS 1.3 (the group also listens for TLS on PORT+2, with a `clarion cert --dev` certificate);
# the others are WebSocket clarion.v1 and HTTP/1.1 SSE, half each. Each connection living a
# random ~--life seconds before its client closes it and reconnects with its last id; --rate
# messages a second over the topics for --minutes. Meanwhile, on a schedule:
#   - kill -9 of one server process (soak-0, soak-1, soak-2 in turn) every 5 minutes (short runs:
#     at 20% and 80% of the run);
#   - one Redis restart (SHUTDOWN, which writes the AOF, then the same command again);
#   - one rolling upgrade: SIGUSR1 to the supervisor (`rolling_upgrade` below);
#   - the group's RSS and open files (summed over the supervisor and its processes) at each
#     mark (every 5 minutes; every minute on short runs), the per-process connection and
#     resume counters from /metrics every 2 s.
# Everything is bounded in time and stopped on exit, failure or Ctrl-C. The results directory
# (--out, default bench/results) gets soak-TAG.json and soak-TAG.md (the report), the bench's
# JSON, and the raw samples, events and logs. The exit status is 0 only when nothing was lost
# outside announced gaps, nothing duplicated, nothing reordered, and no connection of any kind
# dropped during the rolling upgrade (SIGUSR1 to 2 s after it is done).
#
# Options: --minutes M (60), --clients N (20000), --rate MSGS_PER_S (1000), --topics N (1000),
# --life SECONDS (60), --procs N (bench processes; default one per 5,000 clients),
# --port PORT (29080; API PORT+1, TLS PORT+2, Redis PORT-1700), --tag NAME, --out DIR, --bin PATH
# (target/release/clarion), --drain-period S (5: the rolling restart's spreading),
# --browser-share PCT (40; 0: only WebSocket and SSE over clear HTTP/1.1), --no-tls (the
# browser-like kinds in clear text only), --bench-bin PATH (the load
# generator, default --bin: an older server under test with today's clients).
set -euo pipefail

MINUTES=60 CLIENTS=20000 RATE=1000 TOPICS=1000 LIFE=60 PROCS="" PORT=29080 TAG="" OUT=bench/results
DRAIN_PERIOD=5 BROWSER_SHARE=40 BENCH_BIN="" TLS=1
BIN=${CLARION_BIN:-target/release/clarion}
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES=$2; shift 2 ;;
    --clients|-n) CLIENTS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --topics) TOPICS=$2; shift 2 ;;
    --life) LIFE=$2; shift 2 ;;
    --procs) PROCS=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --drain-period) DRAIN_PERIOD=$2; shift 2 ;;
    --browser-share) BROWSER_SHARE=$2; shift 2 ;;
    --bench-bin) BENCH_BIN=$2; shift 2 ;;
    --no-tls) TLS=0; shift ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
BENCH_BIN=${BENCH_BIN:-$BIN}
API=$((PORT + 1)) TLS_PORT=$((PORT + 2)) REDIS_PORT=$((PORT - 1700))
DURATION=$((MINUTES * 60))
TAG=${TAG:-${MINUTES}min-${CLIENTS}-$(date -u +%Y%m%d-%H%M)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RAW="$OUT/soak-$TAG"
mkdir -p "$RAW"
RUN=$(mktemp -d /tmp/clarion-soak.XXXXXX)
[ -x "$BIN" ] || { echo "soak.sh: $BIN not found: cargo build --release -p clarion" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "soak.sh: redis-server is needed" >&2; exit 2; }
command -v redis-cli >/dev/null || { echo "soak.sh: redis-cli is needed" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)

SUP="" REDIS="" BENCH="" SCRAPER=""
stop_all() {
  local rc=$?
  trap - EXIT INT TERM
  [ -n "$SCRAPER" ] && kill "$SCRAPER" 2>/dev/null || true
  [ -n "$BENCH" ] && kill "$BENCH" 2>/dev/null || true
  if [ -n "$SUP" ] && kill -0 "$SUP" 2>/dev/null; then
    kill -TERM "$SUP" 2>/dev/null || true
    # shutdown_timeout (10 s) + drain + the supervisor's own 5 s, then it is killed.
    for _ in $(seq 1 300); do kill -0 "$SUP" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$SUP" 2>/dev/null && kill -KILL "$SUP" 2>/dev/null || true
  fi
  if [ -n "$REDIS" ]; then kill -TERM "$REDIS" 2>/dev/null || true; wait "$REDIS" 2>/dev/null || true; fi
  rm -rf "$RUN"
  exit $rc
}
trap stop_all EXIT
trap 'exit 130' INT TERM

ulimit -n "$(ulimit -Hn)"
for p in "$PORT" "$API" "$TLS_PORT" "$REDIS_PORT"; do
  if ss -Hltn "sport = :$p" | grep -q .; then echo "soak.sh: port $p is in use (--port)" >&2; exit 1; fi
done
now() { date +%s.%N | cut -c1-14; }
EVENTS="$RAW/events.jsonl"
: >"$EVENTS"
event() { # event NAME DETAIL
  printf '{"unix":%s,"event":"%s","detail":"%s"}\n' "$(now)" "$1" "$2" | tee -a "$EVENTS" >&2
}

# --- Redis with AOF --------------------------------------------------------------------------
mkdir -p "$RUN/redis"
start_redis() {
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$RUN/redis" --save "" \
    --appendonly yes --appendfsync everysec --loglevel warning --logfile "$RAW/redis.log" &
  REDIS=$!
  for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "soak.sh: redis-server did not start" >&2
  return 1
}
start_redis

# --- the server group ------------------------------------------------------------------------
# A development certificate for the TLS clients (browsers reach Clarion over TLS, and h2 by ALPN).
SERVE_TLS=() BENCH_TLS=()
if [ "$TLS" = 1 ]; then
  "$BIN" cert --dev --dir "$RUN/tls" >/dev/null
  SERVE_TLS=(--tls-cert "$RUN/tls/cert.pem" --tls-key "$RUN/tls/key.pem" --tls-listen "127.0.0.1:$TLS_PORT")
  BENCH_TLS=(--tls-ca "$RUN/tls/ca.pem" --tls-target "127.0.0.1:$TLS_PORT")
fi
CLARION_LOG=info "$BIN" serve --processes 3 --broker "redis://127.0.0.1:$REDIS_PORT" \
  --node-name soak --listen "127.0.0.1:$PORT" --api-listen "127.0.0.1:$API" \
  "${SERVE_TLS[@]}" --max-connections-per-address 0 --drain-period "$DRAIN_PERIOD" \
  >"$RUN/server.out" 2>"$RAW/server.log" &
SUP=$!
for _ in $(seq 1 300); do grep -q "clarion ready" "$RUN/server.out" 2>/dev/null && break; kill -0 "$SUP" || break; sleep 0.1; done
grep -q "clarion ready" "$RUN/server.out" || { echo "soak.sh: the server group did not start" >&2; tail "$RAW/server.log" >&2; exit 1; }
event start "clarion serve --processes 3 (supervisor $SUP), redis AOF on port $REDIS_PORT"

members() { pgrep -P "$SUP" | sort -n; }

# RSS (kB) and open files summed over the supervisor and its processes.
SAMPLES="$RAW/samples.csv"
echo "unix,elapsed_s,rss_kb,open_files,processes" >"$SAMPLES"
sample() { # sample ELAPSED
  local rss=0 fds=0 n=0 p
  for p in $SUP $(members); do
    [ -r "/proc/$p/status" ] || continue
    rss=$((rss + $(awk '/^VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)))
    fds=$((fds + $(ls "/proc/$p/fd" 2>/dev/null | wc -l)))
    n=$((n + 1))
  done
  echo "$(now),$1,$rss,$fds,$n" >>"$SAMPLES"
}

# Per-process connections and resumes, every 2 s (the reconnect rate each process sees).
(
  while kill -0 "$SUP" 2>/dev/null; do
    t=$(now)
    curl -s -m 2 "http://127.0.0.1:$API/metrics" 2>/dev/null \
      | grep -E '^clarion_(resumes_total|connections)\{node=' | sed "s/^/$t /" || true
    sleep 2
  done
) >"$RAW/metrics.log" 2>/dev/null &
SCRAPER=$!

kill9_member() { # kill -9 of group member soak-(K mod 3): each in turn
  local k=$1 name="soak-$(( $1 % 3 ))" pid
  pid=$(curl -s -m 2 "http://127.0.0.1:$API/healthz" | awk -v n="$name" '$1 == n && $3 == "pid" {print $4}')
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    pid=$(members | head -1)
    name="? (pid $pid)"
  fi
  [ -n "$pid" ] || { event kill9 "no member to kill"; return; }
  kill -9 "$pid"
  event kill9 "pid $pid node $name"
}

restart_redis() { # one Redis restart: SHUTDOWN (the AOF is written), then the same command
  redis-cli -p "$REDIS_PORT" shutdown >/dev/null 2>&1 || true
  wait "$REDIS" 2>/dev/null || true
  event redis_down "redis-server stopped (AOF kept in $RUN/redis)"
  start_redis
  event redis_up "redis-server started again from its AOF"
}

# ---- the rolling upgrade ------------------------------------------------------------------
# Whatever SIGUSR1 does to the group is what the soak tests: the supervisor replaces its
# processes one at a time, each successor taking the process's listeners and live connections
# (with the Redis broker); a process whose hand-over is refused or fails restarts with a drain
# instead (its clients get 1012 over --drain-period and resume elsewhere). The log line says
# how many were handed over and how many connections moved; older builds log "rolling restart
# done", which is matched too.
DONE_RE='rolling (restart|upgrade) done'
rolling_upgrade() {
  local before
  before=$(grep -cE "$DONE_RE" "$RAW/server.log" || true)
  event rolling_upgrade_start "SIGUSR1 to supervisor $SUP"
  kill -USR1 "$SUP"
  for _ in $(seq 1 1200); do
    [ "$(grep -cE "$DONE_RE" "$RAW/server.log" || true)" -gt "$before" ] && break
    sleep 0.1
  done
  event rolling_upgrade_done "$(grep -E "$DONE_RE" "$RAW/server.log" | tail -1 | sed 's/.*rolling/rolling/')"
}

# --- the schedule (seconds after publishing starts) -----------------------------------------
if [ "$MINUTES" -ge 15 ]; then
  MARK=300
  KILLS=$(seq 300 300 $((DURATION - 60)) | tr '\n' ' ')
  REDIS_AT=$(( (DURATION * 45 / 100) / 300 * 300 + 150 ))
  UPGRADE_AT=$(( (DURATION * 70 / 100) / 300 * 300 + 150 ))
else
  MARK=60
  KILLS="$((DURATION * 20 / 100)) $((DURATION * 80 / 100))"
  REDIS_AT=$((DURATION * 40 / 100))
  UPGRADE_AT=$((DURATION * 60 / 100))
fi
event schedule "kill -9 at ${KILLS}s; redis restart at ${REDIS_AT}s; rolling upgrade at ${UPGRADE_AT}s; marks every ${MARK}s"

# --- the run -------------------------------------------------------------------------------
PROCS_ARG=()
[ -n "$PROCS" ] && PROCS_ARG=(--procs "$PROCS")
"$BENCH_BIN" bench --scenario soak -n "$CLIENTS" --target "127.0.0.1:$PORT" --api "127.0.0.1:$API" \
  --duration "$DURATION" --life "$LIFE" --rate "$RATE" --topics "$TOPICS" --drain 90 \
  --connect-rate 2000 "${PROCS_ARG[@]}" --json "$RAW/bench.json" \
  --soak-browser-share "$BROWSER_SHARE" "${BENCH_TLS[@]}" \
  >"$RAW/bench.txt" 2>"$RAW/bench.log" &
BENCH=$!
# Publishing starts once every client has connected.
for _ in $(seq 1 3000); do
  grep -q '^soak: .* publishing' "$RAW/bench.log" 2>/dev/null && break
  kill -0 "$BENCH" 2>/dev/null || break
  sleep 0.1
done
T0=$(date +%s)
event publishing "$(grep '^soak: .* publishing' "$RAW/bench.log" | head -1)"
sample 0
k=0 next_mark=$MARK redis_done=0 upgrade_done=0
declare -A killed=()
while kill -0 "$BENCH" 2>/dev/null; do
  e=$(( $(date +%s) - T0 ))
  if [ "$e" -ge "$next_mark" ] && [ "$e" -le "$DURATION" ]; then
    sample "$next_mark"
    next_mark=$((next_mark + MARK))
  fi
  for at in $KILLS; do
    if [ "$e" -ge "$at" ] && [ -z "${killed[$at]:-}" ]; then
      killed[$at]=1
      kill9_member "$k"; k=$((k + 1))
    fi
  done
  if [ "$e" -ge "$REDIS_AT" ] && [ "$redis_done" = 0 ]; then redis_done=1; restart_redis; fi
  if [ "$e" -ge "$UPGRADE_AT" ] && [ "$upgrade_done" = 0 ]; then upgrade_done=1; rolling_upgrade; fi
  # Bounded: publishing, the drain (90 s) and the workers' report must fit in this.
  if [ "$e" -gt $((DURATION + 300)) ]; then event timeout "the bench ran past its time"; kill "$BENCH"; fi
  sleep 1
done
set +e
wait "$BENCH"; RC=$?
BENCH=""
set -e
sample end
event end "bench exited with status $RC"
cat "$RAW/bench.txt" >&2 || true
grep -E 'killed by signal|starting it again|rolling (restart|upgrade)|hand-over|broker' "$RAW/server.log" >"$RAW/server-events.log" || true
python3 "$HERE/soak_report.py" "$RAW" "$OUT/soak-$TAG" \
  --command "bench/soak.sh --minutes $MINUTES --clients $CLIENTS --rate $RATE --topics $TOPICS --life $LIFE --browser-share $BROWSER_SHARE" \
  --bench-status "$RC"
exit "$RC"
