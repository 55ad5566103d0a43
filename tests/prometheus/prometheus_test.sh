#!/bin/bash
# deploy/prometheus on a real Prometheus (Debian's 2.42) scraping two real `conveyor serve`
# processes on 127.0.0.1, nothing mocked:
#
#   - jobA and jobB stream from the servers (`conveyor fetch`, a 50 ms "step" after each batch);
#     jobC asks for `on_error: fail` and ends with an error. One video packet of the dataset is
#     corrupted, so skip-mode streams skip samples and jobC fails on it.
#   - PromQL over the HTTP API answers, per job: samples/s, the client-reported data wait share,
#     decode amplification, skips and errors; every expression of the Grafana dashboard
#     (deploy/grafana/conveyor.json) runs and returns series.
#   - ConveyorSamplesSkipped and ConveyorStreamErrors fire for their jobs; kill -9 of server 0
#     fires ConveyorServerDown for that server only, and jobA carries on at server 1.
#
# The rules are deploy/prometheus/conveyor_rules.yml with `for:` set to 0s (the only change), and
# Prometheus scrapes and evaluates every second. Skipped (77) without prometheus.
# Env: CONVEYOR_CLI (the conveyor binary), CONVEYOR_SOURCE_DIR, KEEP_TMP=1 keeps the files.
set -euo pipefail

SKIP=77
SRC=${CONVEYOR_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
CLI=${CONVEYOR_CLI:?CONVEYOR_CLI: the conveyor binary}
PY=/usr/bin/python3
for tool in prometheus curl; do
  if ! command -v "$tool" > /dev/null; then
    echo "SKIP: $tool not found (Debian: apt-get install prometheus curl; tools/setup.sh installs them)"
    exit "$SKIP"
  fi
done

T=$(mktemp -d /tmp/conveyor-prometheus-test.XXXXXX)
PIDS=()
log() { echo "[$(date +%T)] $*"; }

fail() {
  echo "FAIL: $*"
  for f in "$T"/*.log; do
    [[ -e $f ]] || continue
    echo "---- $f (last 8 lines)"
    tail -n 8 "$f" | cut -c 1-300
  done
  exit 1
}

cleanup() {
  local rc=$? pid
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

# ---- a dataset with one corrupted video packet --------------------------------------------------
"$CLI" synth --out "$T/ds" --episodes 2 --episode-seconds 3 --cameras 1 --size 64x64 \
  --audio-codec none --quiet
# Episode 0's data starts at byte 16 of the first shard, cam0's packets first (docs/format.md):
# byte 200 is inside its first packets, whose checksums then fail.
shard=$(find "$T/ds/shards" -name '*.cvs' | sort | head -n 1)
printf '\xff\xfe\xfd\xfc' | dd of="$shard" bs=1 seek=200 conv=notrunc status=none
spec() {
  cat <<EOF
anchor: action
on_error: $1
streams:
  cam0:
    delta_timestamps: [-0.1, 0.0]
  observation.state:
    delta_timestamps: [0.0]
  action:
    delta_timestamps: {start: 0.0, step: 0.1, count: 4}
pipeline:
  global_batch_size: 8
  seed: 3
  max_epochs: 0
EOF
}
spec skip > "$T/skip.yaml"
spec fail > "$T/fail.yaml"

# ---- two servers --------------------------------------------------------------------------------
for i in 0 1; do
  "$CLI" serve "$T/ds" --config "$T/skip.yaml" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --threads 1 --ready-file "$T/ready-$i" > "$T/serve-$i.log" 2>&1 &
  PIDS+=($!)
  SERVE_PID[i]=$!
done
for i in 0 1; do
  for _ in $(seq 200); do [[ -s $T/ready-$i ]] && break; sleep 0.05; done
  [[ -s $T/ready-$i ]] || fail "server $i not ready"
  read -r "ADDR[i]" "METRICS[i]" < "$T/ready-$i"
done
log "servers at ${ADDR[0]} and ${ADDR[1]}, metrics at ${METRICS[0]} and ${METRICS[1]}"

# ---- Prometheus ---------------------------------------------------------------------------------
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
PROM=http://127.0.0.1:$port
sed -E 's/^( *)for: .*/\1for: 0s/' "$SRC/deploy/prometheus/conveyor_rules.yml" > "$T/rules.yml"
cat > "$T/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["$T/rules.yml"]
scrape_configs:
  - job_name: conveyor
    honor_labels: true
    static_configs:
      - targets: ["${METRICS[0]}", "${METRICS[1]}"]
EOF
prometheus --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/tsdb" \
  --web.listen-address="127.0.0.1:$port" --log.level=warn > "$T/prometheus.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do curl -sf "$PROM/-/ready" > /dev/null && break; sleep 0.1; done
curl -sf "$PROM/-/ready" > /dev/null || fail "prometheus not ready on $PROM"
log "prometheus at $PROM"

# ---- consumers ----------------------------------------------------------------------------------
"$CLI" fetch --servers "${ADDR[0]},${ADDR[1]}" --job jobA --steps 0 --step-seconds 0.05 \
  --stats > /dev/null 2> "$T/fetch-jobA.log" &
PIDS+=($!)
"$CLI" fetch --servers "${ADDR[1]},${ADDR[0]}" --job jobB --steps 0 --step-seconds 0.05 \
  > /dev/null 2> "$T/fetch-jobB.log" &
PIDS+=($!)
if "$CLI" fetch --servers "${ADDR[1]}" --job jobC --config "$T/fail.yaml" --steps 0 \
  > /dev/null 2> "$T/fetch-jobC.log"; then
  fail "jobC (on_error: fail over a corrupted packet) ended without an error"
fi
grep -q "checksum mismatch" "$T/fetch-jobC.log" || fail "jobC failed otherwise: $(cat "$T/fetch-jobC.log")"

# query PROMQL: prints "LABELS VALUE" lines (LABELS: the series' labels but its name, as
# k=v,k=v, or "-"; an empty vector prints nothing); fails on a bad expression.
query() {
  curl -sfG "$PROM/api/v1/query" --data-urlencode "query=$1" | $PY -c '
import json, sys
r = json.load(sys.stdin)
if r["status"] != "success":
    sys.exit("query failed: " + json.dumps(r))
for s in r["data"]["result"]:
    m = s["metric"]
    print(",".join(f"{k}={m[k]}" for k in sorted(m) if k != "__name__") or "-", s["value"][1])' ||
    fail "PromQL failed: $1"
}

# wait_for DESCRIPTION TIMEOUT_S COMMAND...: polls until COMMAND succeeds.
wait_for() {
  local what=$1 timeout=$2
  shift 2
  for _ in $(seq $((timeout * 4))); do
    "$@" && return 0
    sleep 0.25
  done
  fail "$what (within ${timeout}s)"
}

# A job's value of a per-job expression, as "LO <= v <= HI".
in_range() {  # EXPR JOB LO HI
  local v
  v=$(query "$1" | awk -v j="job=$2" '$1 == j {print $2}')
  [[ -n $v ]] && $PY -c "import sys; sys.exit(0 if $3 <= float('$v') <= $4 else 1)"
}
firing() {  # ALERT LABEL=VALUE
  curl -sf "$PROM/api/v1/alerts" | $PY -c '
import json, sys
name, want = sys.argv[1], sys.argv[2].split("=", 1)
alerts = json.load(sys.stdin)["data"]["alerts"]
sys.exit(0 if any(a["labels"].get("alertname") == name and a["state"] == "firing"
                  and a["labels"].get(want[0]) == want[1] for a in alerts) else 1)' "$1" "$2"
}

for job in jobA jobB; do
  wait_for "$job: samples/s" 20 in_range 'conveyor:job_samples:rate1m' "$job" 1 1e9
  wait_for "$job: data wait share" 20 in_range 'conveyor:job_data_wait_share:rate1m' "$job" 0 1
  wait_for "$job: decode amplification" 20 in_range 'conveyor:job_decode_amplification:rate5m' "$job" 1 1000
  wait_for "$job: samples skipped" 20 in_range 'sum by (job) (conveyor_samples_skipped_total)' "$job" 1 1e9
done
wait_for "jobC: errors" 10 in_range 'sum by (job) (conveyor_errors_total{reason="DATA_LOSS"})' jobC 1 1e9
errors="$(query 'sum by (job) (conveyor_errors_total)')"
grep -q '^job=jobA ' <<< "$errors" && fail "jobA has errors: $errors"
log "per job (samples/s, data wait share, decode amplification, skipped, errors):"
for job in jobA jobB jobC; do
  row=$job
  for e in 'conveyor:job_samples:rate1m' 'conveyor:job_data_wait_share:rate1m' \
    'conveyor:job_decode_amplification:rate5m' 'sum by (job) (conveyor_samples_skipped_total)' \
    'sum by (job) (conveyor_errors_total)'; do
    row+=" $(query "$e" | awk -v j="job=$job" '$1 == j {v = sprintf("%.3g", $2)} END {print v == "" ? "-" : v}')"
  done
  echo "  $row"
done
wait_for "ConveyorSamplesSkipped for jobA" 10 firing ConveyorSamplesSkipped job=jobA
wait_for "ConveyorStreamErrors for jobC" 10 firing ConveyorStreamErrors job=jobC

# Every panel of the Grafana dashboard: its expression runs and returns series.
# shellcheck disable=SC2016  # the $ are PromQL/Grafana text, not shell
mapfile -t EXPRS < <($PY -c '
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["panels"]:
    for t in p["targets"]:
        print(t["expr"].replace("$__rate_interval", "1m").replace("$job", ".*"))' \
  "$SRC/deploy/grafana/conveyor.json")
[[ ${#EXPRS[@]} -ge 6 ]] || fail "the dashboard has ${#EXPRS[@]} expressions"
for e in "${EXPRS[@]}"; do
  [[ -n $(query "$e") ]] || fail "dashboard expression returns nothing: $e"
done
log "all ${#EXPRS[@]} dashboard expressions return series"

# ---- a server dies ------------------------------------------------------------------------------
[[ $(query 'up{job="conveyor"}' | awk '{print $2}' | sort -u) == 1 ]] || fail "a server was down before the kill"
kill -KILL "${SERVE_PID[0]}"
log "kill -9 server 0 (pid ${SERVE_PID[0]}, metrics ${METRICS[0]})"
wait_for "ConveyorServerDown for ${METRICS[0]}" 15 firing ConveyorServerDown "instance=${METRICS[0]}"
firing ConveyorServerDown "instance=${METRICS[1]}" && fail "ConveyorServerDown fired for the live server"
jobA_on_1() {
  [[ -n $(query "conveyor_job_samples_total{job=\"jobA\",instance=\"${METRICS[1]}\"} > 0") ]]
}
wait_for "jobA streaming from server 1 after the kill" 20 jobA_on_1
log "ConveyorServerDown fires for ${METRICS[0]} only; jobA continues at ${METRICS[1]}"
log "PASS"
