#!/bin/bash
# `conveyor top` in a real terminal (tmux, a private socket) against a real `conveyor serve` on
# 127.0.0.1 with two consumers of one job: rank 0 takes batches as fast as they come (it waits for
# data most of the time), rank 1 "trains" 200 ms per batch (its prefetch queue hides the server).
# The screen must show the job with samples/s, queue fill, amplification and wait p50/p99/max,
# name rank 0 as the rank that waits most, list both ranks, and refresh (its samples/s changes
# between two captures or its step counts grow). Skipped (77) without tmux.
# Env: CONVEYOR_CLI, KEEP_TMP=1 keeps the files.
set -euo pipefail

CLI=${CONVEYOR_CLI:?CONVEYOR_CLI: the conveyor binary}
if ! command -v tmux > /dev/null; then
  echo "SKIP: tmux not found (Debian: apt-get install tmux)"
  exit 77
fi
T=$(mktemp -d /tmp/conveyor-top-test.XXXXXX)
PIDS=()
TMUX_SOCK=$T/tmux.sock
fail() {
  echo "FAIL: $*"
  [[ ! -e $T/screen.txt ]] || { echo "---- the screen:"; cat "$T/screen.txt"; }
  for f in "$T"/*.log; do
    [[ -e $f ]] || continue
    echo "---- $f"
    tail -n 5 "$f" | cut -c 1-300
  done
  exit 1
}
cleanup() {
  local rc=$? pid
  # tmux's server by its pid (this test's own socket), then ours.
  pid=$(tmux -S "$TMUX_SOCK" display-message -p '#{pid}' 2> /dev/null || true)
  [[ -z $pid ]] || kill -TERM "$pid" 2> /dev/null || true
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2> /dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do
      kill -0 "$pid" 2> /dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
  done
  if [[ ${KEEP_TMP:-0} == 1 || $rc -ne 0 ]]; then echo "test files kept in $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

"$CLI" synth --out "$T/ds" --episodes 2 --episode-seconds 4 --cameras 1 --size 64x64 \
  --audio-codec none --quiet
cat > "$T/cfg.yaml" <<'EOF'
anchor: action
streams:
  cam0:
    delta_timestamps: [0.0]
  observation.state:
    delta_timestamps: [0.0]
  action:
    delta_timestamps: {start: 0.0, step: 0.1, count: 4}
pipeline:
  global_batch_size: 8
  seed: 5
  max_epochs: 0
EOF
"$CLI" serve "$T/ds" --config "$T/cfg.yaml" --listen 127.0.0.1:0 --threads 1 \
  --ready-file "$T/ready" > "$T/serve.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do [[ -s $T/ready ]] && break; sleep 0.05; done
[[ -s $T/ready ]] || fail "server not ready"
read -r addr _ < "$T/ready"

"$CLI" fetch --servers "$addr" --job topjob --consumer 0 --consumers 2 --steps 0 \
  > /dev/null 2> "$T/fetch-0.log" &
PIDS+=($!)
"$CLI" fetch --servers "$addr" --job topjob --consumer 1 --consumers 2 --steps 0 \
  --step-seconds 0.2 > /dev/null 2> "$T/fetch-1.log" &
PIDS+=($!)

tmux -S "$TMUX_SOCK" -f /dev/null new-session -d -s top -x 160 -y 40 \
  "$CLI top $addr --interval 0.5; sleep 60"

screen() { tmux -S "$TMUX_SOCK" capture-pane -p -t top > "$T/screen.txt"; }
job_line() { grep -E '^topjob +[0-9]+ ' "$T/screen.txt" || true; }
rank_line() { grep -E "^ +$1 +[0-9.]+% +[0-9]+ " "$T/screen.txt" || true; }
shown() {
  screen
  [[ $(job_line) == *"rank 0 ("* && -n $(rank_line 0) && -n $(rank_line 1) ]]
}
ok=0
for _ in $(seq 120); do
  if shown; then ok=1; break; fi
  sleep 0.25
done
[[ $ok == 1 ]] || fail "top does not show topjob with rank 0 waiting most and both ranks"
first=$(cat "$T/screen.txt")
echo "---- conveyor top under tmux:"
echo "$first" | sed '/^$/d'

# The job line: samples/s, 2 streams, queue fill, amplification, three wait figures.
read -r -a f <<< "$(job_line)"
[[ ${f[1]} -gt 0 ]] || fail "samples/s is '${f[1]}'"
[[ ${f[2]} == 2 ]] || fail "streams is '${f[2]}', expected 2"
[[ ${f[3]} == *% ]] || fail "queue fill is '${f[3]}'"
grep -q 'WAIT p50' "$T/screen.txt" || fail "no wait columns"
share0=$(rank_line 0 | awk '{print $2}' | tr -d %)
share1=$(rank_line 1 | awk '{print $2}' | tr -d %)
/usr/bin/python3 -c "import sys; sys.exit(0 if float('$share0') > float('$share1') else 1)" ||
  fail "rank 0 waits $share0%, rank 1 $share1%: rank 0 should wait more"

# It refreshes: the step counts grow.
steps_before=$(rank_line 0 | awk '{print $3}')
for _ in $(seq 40); do
  sleep 0.25
  screen
  steps_after=$(rank_line 0 | awk '{print $3}')
  [[ -z $steps_after || $steps_after == "$steps_before" ]] || break
done
[[ -n $steps_after && $steps_after != "$steps_before" ]] || fail "the screen did not refresh (rank 0 steps $steps_before)"
echo "rank 0 waits $share0% of its step time, rank 1 $share1%; rank 0's steps went from $steps_before to $steps_after"
echo PASS
