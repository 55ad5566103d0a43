#!/bin/bash
# Chaos soak (issue 18 item 5): N `conveyor serve` processes on loopback serve one synthetic
# dataset to M `conveyor fetch` consumers of one job (consumer i of M, every server listed,
# rotated by i so they spread). While they read a fixed number of whole epochs, paced so the run
# lasts about --minutes, the soak SIGKILLs a random server at random times and restarts it on the
# SAME port after a short delay, stalls one consumer for a long while (fetch --stall-after /
# --stall-seconds) and, during that stall, SIGKILLs the server the stalled consumer streams from.
# Every second it samples each server's RSS, fd count and thread count from /proc.
#
# At the end (bench/soak/soak_check.py) it checks, printing PASS/FAIL lines with figures:
#  (a) every consumer's lines (--ids --digest) equal `conveyor batches` for its slice, exactly;
#  (b) every sample id (episode/step) exactly once per epoch across all consumers;
#  (c) every server's RSS within its memory budget (--max-streams x --stream-memory-bytes + the
#      buffer pool's cap of one stream budget + 160 MiB, docs/serving.md "Ceilings"), and fds and
#      threads flat: each server process still alive at the end, idle again after the consumers
#      finished, back within a small slack of its own counts when it first became ready, after
#      all the streams it served;
#  (d) kills, restarts, and the consumers' reconnects (fetch --stats).
# The figures go to --json (default bench/out/soak.json) and a markdown table to stdout.
# Exit status: 0 all checks passed, 1 a check failed, 2 the soak could not run.
#
# Usage: bench/soak/soak.sh [--servers 4] [--consumers 8] [--minutes 10] [--seed S]
#          [--work DIR] [--kills K] [--stall-seconds S] [--step-seconds 0.1] [--json FILE]
#          [--keep]
# Env: CONVEYOR_CLI (default build/tools/conveyor). The binary is copied into the work dir first,
# so a rebuild during the soak cannot change what restarts run.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=/usr/bin/python3
NSERV=4
NCONS=8
MINUTES=10
SEED=""
WORK=""
KILLS=""
STALL=""
STEP_SECONDS=0.1
JSON=$ROOT/bench/out/soak.json
KEEP=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --servers) NSERV=$2; shift 2 ;;
    --consumers) NCONS=$2; shift 2 ;;
    --minutes) MINUTES=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --kills) KILLS=$2; shift 2 ;;
    --stall-seconds) STALL=$2; shift 2 ;;
    --step-seconds) STEP_SECONDS=$2; shift 2 ;;
    --json) JSON=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "soak: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $NSERV -ge 2 && $NCONS -ge 1 ]] || { echo "soak: need --servers >= 2 and --consumers >= 1" >&2; exit 2; }
[[ -n $SEED ]] || SEED=$(( ($(date +%s%N) / 1000) % 1000000007 ))
RANDOM=$SEED  # bash's RANDOM is a seeded generator: same seed, same schedule of events
SECS=$(awk -v m="$MINUTES" 'BEGIN { printf "%d", m * 60 + 0.5 }')
[[ -n $STALL ]] || STALL=$(awk -v s="$SECS" 'BEGIN { x = s / 4; if (x > 150) x = 150; printf "%d", x }')
[[ -n $KILLS ]] || KILLS=$(awk -v m="$MINUTES" 'BEGIN { k = int(2 * m + 0.5); if (k < 2) k = 2; print k }')
CLI_SRC=${CONVEYOR_CLI:-$ROOT/build/tools/conveyor}
[[ -x $CLI_SRC ]] || { echo "soak: no conveyor binary at $CLI_SRC (set CONVEYOR_CLI)" >&2; exit 2; }
if [[ -z $WORK ]]; then WORK=$(mktemp -d /tmp/conveyor-soak.XXXXXX); else mkdir -p "$WORK"; fi
WORK=$(cd "$WORK" && pwd)
echo "soak: seed $SEED; $NSERV servers, $NCONS consumers, ~$SECS s, $KILLS random kills + 1 during the stall, stall $STALL s; work dir $WORK"

SERVER_PIDS=()   # current pid per server (empty while down)
CONSUMER_PIDS=()
cleanup() {
  local rc=$? pid
  for pid in "${CONSUMER_PIDS[@]}" "${SERVER_PIDS[@]}"; do
    [[ -n $pid ]] && kill -KILL "$pid" 2> /dev/null
  done
  for pid in "${CONSUMER_PIDS[@]}" "${SERVER_PIDS[@]}"; do
    [[ -n $pid ]] && wait "$pid" 2> /dev/null
  done
  if [[ $KEEP == 1 || $rc -ne 0 ]]; then echo "soak: files kept in $WORK"; else rm -rf "$WORK"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 2' INT TERM
die() { echo "soak: $*" >&2; exit 2; }

mkdir -p "$WORK/bin" "$WORK/out" "$WORK/ref" "$WORK/log"
cp "$CLI_SRC" "$WORK/bin/conveyor" || die "cannot copy $CLI_SRC"
CLI=$WORK/bin/conveyor
EVENTS=$WORK/events.tsv   # t_ms  event  server  incarnation  pid  note
SAMPLES=$WORK/samples.tsv # t_ms  server  incarnation  pid  rss_kb  fds  threads  phase
: > "$EVENTS"
: > "$SAMPLES"
T0=${EPOCHREALTIME/./}
now_ms() { local t=${EPOCHREALTIME/./}; echo $(( (t - T0) / 1000 )); }
event() { echo -e "$(now_ms)\t$*" >> "$EVENTS"; }

# The dataset: 6 episodes of exactly 4 s, one 64x64 H.264 camera, no audio: 1200 samples per
# epoch with the action as anchor (50 Hz), so a global batch of 24 divides it exactly and every
# sample is in every epoch.
"$CLI" synth --out "$WORK/ds" --episodes 6 --episode-seconds 4 --cameras 1 --size 64x64 \
  --audio-codec none --seed 3 --threads 1 --quiet || die "synth failed"
GBS=24
(( GBS % NCONS == 0 )) || GBS=$(( NCONS * ((24 + NCONS - 1) / NCONS) ))
SAMPLES_PER_EPOCH=1200
STEPS_PER_EPOCH=$(( SAMPLES_PER_EPOCH / GBS ))
# Epochs so that an unstalled consumer, sleeping --step-seconds per batch, ends about a stall
# before the deadline; the stalled one then ends near it.
EPOCHS=$(awk -v s="$SECS" -v st="$STALL" -v n="$STEPS_PER_EPOCH" -v p="$STEP_SECONDS" \
  'BEGIN { e = int((s - st) / (n * p) + 0.5); if (e < 2) e = 2; print e }')
TOTAL_STEPS=$(( EPOCHS * STEPS_PER_EPOCH ))
cat > "$WORK/soak.yaml" << EOF
anchor: action
streams:
  cam0:
    delta_timestamps: [0.0]
  observation.state:
    delta_timestamps: [0.0]
  action:
    delta_timestamps: {start: 0.0, step: 0.1, count: 4}
pipeline:
  global_batch_size: $GBS
  seed: 11
  max_epochs: $EPOCHS
EOF

# The memory budget each server is given (docs/serving.md "Ceilings").
STREAM_MEM=$(( 32 << 20 ))
QUEUE_BYTES=$(( 16 << 20 ))
MAX_STREAMS=$NCONS
BUDGET=$(( MAX_STREAMS * STREAM_MEM + STREAM_MEM + (160 << 20) ))

# Fixed ports, picked once, below the ephemeral range so that no client's outgoing connection
# can take a port while its server is down.
mapfile -t PORTS < <("$PY" - "$NSERV" << 'EOF'
import random, socket, sys
n = int(sys.argv[1]); out = []
r = random.SystemRandom()
while len(out) < n:
    p = r.randrange(20000, 32000)
    if p in out: continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); out.append(p)
    except OSError:
        pass
    finally:
        s.close()
print("\n".join(map(str, out)))
EOF
)
[[ ${#PORTS[@]} -eq $NSERV ]] || die "could not pick $NSERV free ports"
ADDRS=()
for p in "${PORTS[@]}"; do ADDRS+=("127.0.0.1:$p"); done

INC=()        # incarnation per server
READY_AT=()   # 1 once the current incarnation wrote its ready file
RESTART_AT=() # ms at which a down server restarts (-1: not scheduled)
start_server() {
  local k=$1 inc=$2
  rm -f "$WORK/log/ready.$k"
  "$CLI" serve "$WORK/ds" --config "$WORK/soak.yaml" --listen "${ADDRS[$k]}" --threads 1 \
    --stream-memory-bytes $STREAM_MEM --queue-bytes $QUEUE_BYTES --max-streams $MAX_STREAMS \
    --ready-file "$WORK/log/ready.$k" >> "$WORK/log/serve.$k.$inc.log" 2>&1 &
  SERVER_PIDS[k]=$!
  INC[k]=$inc
  READY_AT[k]=0
  RESTART_AT[k]=-1
  event "start\t$k\t$inc\t${SERVER_PIDS[k]}\t${ADDRS[$k]}"
}
sample_server() {  # no forks: builtins only
  local k=$1 phase=$2 pid=${SERVER_PIDS[$1]} rss="" thr="" key val rest
  [[ -n $pid && -d /proc/$pid ]] || return
  while read -r key val rest; do
    case $key in VmRSS:) rss=$val ;; Threads:) thr=$val ;; esac
  done < "/proc/$pid/status" 2> /dev/null
  local fds=(/proc/"$pid"/fd/*)
  [[ -n $rss && -n $thr ]] || return
  echo -e "$(now_ms)\t$k\t${INC[$k]}\t$pid\t$rss\t${#fds[@]}\t$thr\t$phase" >> "$SAMPLES"
}
check_ready() {
  local k=$1
  [[ ${READY_AT[$k]} == 1 || -z ${SERVER_PIDS[$k]} ]] && return
  if [[ -s $WORK/log/ready.$k ]]; then
    READY_AT[k]=1
    event "ready\t$k\t${INC[$k]}\t${SERVER_PIDS[$k]}\t"
    sample_server "$k" ready
  elif ! kill -0 "${SERVER_PIDS[$k]}" 2> /dev/null; then
    wait "${SERVER_PIDS[$k]}" 2> /dev/null
    event "start_failed\t$k\t${INC[$k]}\t${SERVER_PIDS[$k]}\texit $?"
    SERVER_PIDS[k]=""
    RESTART_AT[k]=$(( $(now_ms) + 500 ))
  fi
}
kill_server() {  # kill_server K WHY
  local k=$1 pid=${SERVER_PIDS[$1]}
  [[ -n $pid ]] || return 1
  kill -KILL "$pid" 2> /dev/null
  wait "$pid" 2> /dev/null
  event "kill\t$k\t${INC[$k]}\t$pid\t$2"
  SERVER_PIDS[k]=""
  RESTART_AT[k]=$(( $(now_ms) + 500 + RANDOM % 3500 ))  # back after 0.5..4 s
  echo "soak: t=$(( $(now_ms) / 1000 ))s SIGKILL server $k (${ADDRS[$k]}, pid $pid, $2)"
}
# server_of PID: the live server PID streams from, or -1. A client keeps its channels to servers
# it streamed from before, and gRPC reconnects them to a restarted server: idle connections that
# received a few hundred bytes of handshake, more recently than a stalled consumer's stream. Of
# its connections to live servers, the one that received the most bytes (ss -i: bytes_received)
# carries the stream (the connections to killed incarnations are gone).
server_of() {
  local received peer k
  while read -r received peer; do
    for k in "${!ADDRS[@]}"; do
      [[ ${peer##*:} == "${PORTS[$k]}" && -n ${SERVER_PIDS[$k]} ]] && { echo "$k"; return; }
    done
  done < <(ss -Htnpi state established 2> /dev/null | awk -v pid="pid=$1," '
    index($0, pid) { peer = $4; want = 1; next }
    want { want = 0; r = 0; if (match($0, /bytes_received:[0-9]+/)) r = substr($0, RSTART + 15, RLENGTH - 15); print r, peer }
  ' | sort -rn)
  echo -1
}
servers_up() { local k n=0; for k in "${!ADDRS[@]}"; do [[ -n ${SERVER_PIDS[$k]} ]] && n=$((n + 1)); done; echo $n; }

for k in "${!ADDRS[@]}"; do start_server "$k" 0; done
for _ in $(seq 300); do
  all=1
  for k in "${!ADDRS[@]}"; do check_ready "$k"; [[ ${READY_AT[$k]} == 1 ]] || all=0; done
  [[ $all == 1 ]] && break
  sleep 0.05
done
[[ $all == 1 ]] || die "servers not ready: $(tail -n 3 "$WORK"/log/serve.*.log)"

# The schedule, from the seed: kill times in [10%, 85%] of the run, the stalled consumer and the
# batch after which it stalls (in the first third of its steps).
KILL_AT=()
for ((j = 0; j < KILLS; j++)); do
  KILL_AT+=($(( SECS * 100 + (RANDOM * 32768 + RANDOM) % (SECS * 750 + 1) )))
done
mapfile -t KILL_AT < <(printf '%s\n' "${KILL_AT[@]}" | sort -n)
STALLED=$(( RANDOM % NCONS ))
STALL_AFTER=$(( TOTAL_STEPS / 10 + RANDOM % (TOTAL_STEPS / 4 + 1) ))
echo "soak: $EPOCHS epochs x $STEPS_PER_EPOCH steps (global batch $GBS) per consumer; consumer $STALLED stalls $STALL s after batch $STALL_AFTER; kills at ms ${KILL_AT[*]}"

for ((i = 0; i < NCONS; i++)); do
  list=""
  for ((j = 0; j < NSERV; j++)); do list+="${list:+,}${ADDRS[$(( (i + j) % NSERV ))]}"; done
  extra=()
  [[ $i == "$STALLED" ]] && extra=(--stall-after "$STALL_AFTER" --stall-seconds "$STALL")
  "$CLI" fetch --servers "$list" --job soak --consumer "$i" --consumers "$NCONS" --steps 0 \
    --config "$WORK/soak.yaml" --ids --digest --stats --step-seconds "$STEP_SECONDS" "${extra[@]}" \
    > "$WORK/out/consumer.$i.txt" 2> "$WORK/log/fetch.$i.log" &
  CONSUMER_PIDS[i]=$!
  event "consumer\t-\t-\t${CONSUMER_PIDS[i]}\tconsumer $i of $NCONS: $list ${extra[*]}"
done

# The loop: one tick a second (sampling), events in between at 100 ms resolution.
declare -A CONS_RC=()
next_kill=0
stall_kill_at=-1
stall_kill_done=0
stall_begin=0
next_sample=0
HARD_LIMIT=$(( (SECS * 2 + STALL + 300) * 1000 ))
while :; do
  t=$(now_ms)
  for ((i = 0; i < NCONS; i++)); do
    [[ -n ${CONS_RC[$i]:-} ]] && continue
    if ! kill -0 "${CONSUMER_PIDS[$i]}" 2> /dev/null; then
      wait "${CONSUMER_PIDS[$i]}"
      CONS_RC[$i]=$?
      event "consumer_exit\t-\t-\t${CONSUMER_PIDS[$i]}\tconsumer $i rc ${CONS_RC[$i]}"
      echo "soak: t=$(( t / 1000 ))s consumer $i exited with status ${CONS_RC[$i]}"
    fi
  done
  if [[ ${#CONS_RC[@]} -eq $NCONS ]]; then
    # Done once every killed server is back and ready (so every kill's restart is measured).
    pending=0
    for k in "${!ADDRS[@]}"; do
      [[ -z ${SERVER_PIDS[$k]} || ${READY_AT[$k]} != 1 ]] && pending=1
    done
    [[ $pending == 0 ]] && break
  fi
  (( t > HARD_LIMIT )) && { event "hard_limit\t-\t-\t-\t"; echo "soak: consumers still running after $(( t / 1000 )) s"; break; }
  for k in "${!ADDRS[@]}"; do
    if [[ -z ${SERVER_PIDS[$k]} && ${RESTART_AT[$k]} -ge 0 && $t -ge ${RESTART_AT[$k]} ]]; then
      start_server "$k" $(( ${INC[$k]} + 1 ))
      echo "soak: t=$(( t / 1000 ))s restart server $k on ${ADDRS[$k]} (pid ${SERVER_PIDS[$k]})"
    fi
    check_ready "$k"
  done
  if (( next_kill < KILLS )) && (( t >= KILL_AT[next_kill] )); then
    if (( $(servers_up) >= 2 )); then
      # The server of a random running consumer (consumers pile onto the servers that stay up,
      # so a random server would often be one nobody streams from); else a random live one.
      # A server that has sent a consumer's whole stream (the client's transport window holds
      # megabytes) keeps the idle connection: skip those, known by the server's "ended" line.
      running=()
      for ((i = 0; i < NCONS; i++)); do [[ -z ${CONS_RC[$i]:-} ]] && running+=("$i"); done
      target=-1
      for ((j = ${#running[@]}; j > 0; j--)); do
        r=$(( RANDOM % j ))
        c=${running[$r]}
        running[r]=${running[$(( j - 1 ))]}
        k=$(server_of "${CONSUMER_PIDS[$c]}")
        (( k >= 0 )) || continue
        grep -q "consumer=$c/$NCONS .* ended: " "$WORK/log/serve.$k.${INC[$k]}.log" 2> /dev/null && continue
        target=$k
        break
      done
      if (( target >= 0 )); then
        note="random: server of consumer $c"
        if (( stall_begin > 0 && t < stall_begin + STALL * 1000 )) &&
          [[ $c == "$STALLED" || $(server_of "${CONSUMER_PIDS[$STALLED]}") == "$target" ]]; then
          note="random: server of consumer $c and of the stalled consumer $STALLED"
          stall_kill_done=1
        fi
        kill_server "$target" "$note"
      else
        up=()
        for k in "${!ADDRS[@]}"; do [[ -n ${SERVER_PIDS[$k]} ]] && up+=("$k"); done
        kill_server "${up[$(( RANDOM % ${#up[@]} ))]}" "random server"
      fi
    else
      event "kill_skipped\t-\t-\t-\tonly one server up"
    fi
    next_kill=$(( next_kill + 1 ))
  fi
  # The stalled consumer: once it says it stalls, kill the server it streams from at a random
  # moment in the first half of the stall (its receive thread is blocked on a full prefetch queue).
  if (( stall_kill_at < 0 && stall_kill_done == 0 )) && grep -q "stalling for" "$WORK/log/fetch.$STALLED.log" 2> /dev/null; then
    stall_begin=$t
    stall_kill_at=$(( t + 1000 + RANDOM % (STALL * 500 + 1) ))
    event "stall_begin\t-\t-\t${CONSUMER_PIDS[$STALLED]}\tconsumer $STALLED"
    echo "soak: t=$(( t / 1000 ))s consumer $STALLED stalls for $STALL s"
  fi
  if (( stall_kill_at >= 0 && t >= stall_kill_at && stall_kill_done == 0 )); then
    stall_kill_done=1
    target=$(server_of "${CONSUMER_PIDS[$STALLED]}")
    if (( target >= 0 )) && grep -q "consumer=$STALLED/$NCONS .* ended: " "$WORK/log/serve.$target.${INC[$target]}.log" 2> /dev/null; then
      target=-1
    fi
    if (( target >= 0 )); then
      kill_server "$target" "server of the stalled consumer $STALLED"
    elif (( t < stall_begin + STALL * 1000 - 1000 )); then
      stall_kill_done=0  # its server is down or it is reconnecting: try again in a second
      stall_kill_at=$(( t + 1000 ))
    else
      event "stall_kill_skipped\t-\t-\t-\tno connection to a live server"
    fi
  fi
  if (( t >= next_sample )); then
    for k in "${!ADDRS[@]}"; do
      [[ ${READY_AT[$k]} == 1 ]] && sample_server "$k" run
    done
    next_sample=$(( next_sample + 1000 ))
  fi
  sleep 0.1
done
RUN_MS=$(now_ms)

# Idle again: the live servers, 2 s after the last consumer ended (their streams closed).
sleep 2
for k in "${!ADDRS[@]}"; do
  [[ ${READY_AT[$k]} == 1 ]] && sample_server "$k" idle_end
done
for k in "${!ADDRS[@]}"; do
  pid=${SERVER_PIDS[$k]}
  [[ -n $pid ]] || continue
  kill -TERM "$pid" 2> /dev/null
  wait "$pid" 2> /dev/null
  event "stop\t$k\t${INC[$k]}\t$pid\t"
  SERVER_PIDS[k]=""
done

# The reference: `conveyor batches` for each consumer's slice, two at a time.
echo "soak: run took $(( RUN_MS / 1000 )) s; computing the reference with conveyor batches"
REF_T0=$(now_ms)
for ((i = 0; i < NCONS; i++)); do
  "$CLI" batches "$WORK/ds" --config "$WORK/soak.yaml" --consumer "$i" --consumers "$NCONS" \
    --steps "$TOTAL_STEPS" --threads 1 --ids --digest > "$WORK/ref/consumer.$i.txt" \
    2> "$WORK/log/batches.$i.log" &
  CONSUMER_PIDS[i]=$!
  if (( i % 2 == 1 || i == NCONS - 1 )); then
    for ((j = i - (i % 2); j <= i; j++)); do
      wait "${CONSUMER_PIDS[$j]}" || echo "soak: conveyor batches for consumer $j failed" >&2
    done
  fi
done
CONSUMER_PIDS=()
REF_MS=$(( $(now_ms) - REF_T0 ))

mkdir -p "$(dirname "$JSON")"
{
  echo "seed=$SEED"
  echo "servers=$NSERV"
  echo "consumers=$NCONS"
  echo "minutes=$MINUTES"
  echo "planned_seconds=$SECS"
  echo "run_ms=$RUN_MS"
  echo "reference_ms=$REF_MS"
  echo "epochs=$EPOCHS"
  echo "steps_per_epoch=$STEPS_PER_EPOCH"
  echo "global_batch_size=$GBS"
  echo "samples_per_epoch=$SAMPLES_PER_EPOCH"
  echo "total_steps=$TOTAL_STEPS"
  echo "step_seconds=$STEP_SECONDS"
  echo "stalled_consumer=$STALLED"
  echo "stall_after=$STALL_AFTER"
  echo "stall_seconds=$STALL"
  echo "planned_kills=$KILLS"
  echo "stream_memory_bytes=$STREAM_MEM"
  echo "queue_bytes=$QUEUE_BYTES"
  echo "max_streams=$MAX_STREAMS"
  echo "budget_bytes=$BUDGET"
  echo "ports=${PORTS[*]}"
  for ((i = 0; i < NCONS; i++)); do echo "consumer_rc.$i=${CONS_RC[$i]:-none}"; done
} > "$WORK/params.txt"
"$PY" "$ROOT/bench/soak/soak_check.py" "$WORK" "$JSON"
