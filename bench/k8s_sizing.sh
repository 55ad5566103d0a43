#!/usr/bin/env bash
# What one `conveyor serve` costs per sample, for sizing its CPU and memory requests
# (deploy/k8s/conveyor-servers.yaml, deploy/README.md "How many servers").
#
# Usage: bash bench/k8s_sizing.sh BUILD_DIR [--consumers 1,2,4,8] [--steps N] [--threads T]
#                                 [--config FILE] [--dataset DIR] [--work DIR]
#
# For each consumer count C: one server (loopback, --threads T) and C `conveyor fetch` consumers
# of one job (consumer i of C, N steps each, so N x global_batch_size samples in all), then:
#   - samples per server CPU-second: samples / the server process's user + system CPU time
#     (/proc/PID/stat). A core gives one CPU-second per second, so this is the server's
#     per-core rate. It leaves out the consumers (on Kubernetes they run on the trainer nodes),
#     and CPU time, unlike wall time, barely moves when other work shares the cores;
#   - decoded / delivered video frames (the server's metrics): the decode amplification. It grows
#     with C: each consumer's stream decodes the GOPs its own slice of a batch needs, so a GOP
#     that feeds samples of several consumers is decoded once per consumer;
#   - peak RSS (VmHWM) of the server and of the largest consumer;
#   - wall samples/s, for reference only (server and consumers share this machine's cores).
# Defaults: the pipeline.yaml of deploy/k8s/conveyor-servers.yaml's ConfigMap, on `conveyor synth
# --episodes 6 --episode-seconds 20 --cameras 2 --audio-codec none` (what that config reads).
set -euo pipefail
usage="usage: bash bench/k8s_sizing.sh BUILD_DIR [--consumers 1,2,4,8] [--steps N] [--threads T] [--config FILE] [--dataset DIR] [--work DIR]"
build=$(realpath "${1:?$usage}")
shift
consumers=1,2,4,8 steps=400 threads=2 config="" dataset="" work=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --consumers) consumers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --config) config=$(realpath "$2"); shift 2 ;;
    --dataset) dataset=$(realpath "$2"); shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "k8s_sizing: unknown flag $1 ($usage)" >&2; exit 2 ;;
  esac
done
cli="$build/tools/conveyor"
[[ -x "$cli" ]] || { echo "k8s_sizing: $cli not found (cmake --build $build --target conveyor)" >&2; exit 1; }
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z "$work" ]]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
if [[ -z "$config" ]]; then
  config="$work/pipeline.yaml"
  /usr/bin/python3 - "$src/deploy/k8s/conveyor-servers.yaml" "$config" <<'PY'
import sys, yaml
cm = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "ConfigMap")
open(sys.argv[2], "w").write(cm["data"]["pipeline.yaml"])
PY
fi
if [[ -z "$dataset" ]]; then
  dataset="$work/ds"
  [[ -f "$dataset/manifest.json" ]] ||
    "$cli" synth --quiet --out "$dataset" --episodes 6 --episode-seconds 20 --cameras 2 --audio-codec none
fi
batch=$(/usr/bin/python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["pipeline"]["global_batch_size"])' "$config")
tck=$(getconf CLK_TCK)

echo "k8s_sizing: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) before; config $config; dataset $dataset; --threads $threads; $steps steps of $batch per run" >&2
echo "| consumers | samples | server CPU s | samples per server CPU-second | decoded / delivered frames | server peak RSS MiB | consumer peak RSS MiB | wall samples/s | load average after |"
echo "|---|---|---|---|---|---|---|---|---|"
IFS=, read -ra counts <<< "$consumers"
for c in "${counts[@]}"; do
  rm -f "$work/ready" "$work"/fetch*.rss
  "$cli" serve "$dataset" --config "$config" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --ready-file "$work/ready" --threads "$threads" --max-streams $((c + 4)) 2> "$work/serve.log" &
  server=$!
  for _ in $(seq 300); do [[ -s "$work/ready" ]] && break; sleep 0.1; done
  read -r addr metrics < "$work/ready" || true
  [[ -n "${metrics:-}" ]] || { echo "k8s_sizing: the server did not start:" >&2; cat "$work/serve.log" >&2; exit 1; }
  start=$(date +%s.%N)
  fetchers=()
  for ((i = 0; i < c; i++)); do
    /usr/bin/time -f %M -o "$work/fetch$i.rss" "$cli" fetch --servers "$addr" --job k8s_sizing \
      --consumer $i --consumers "$c" --steps "$steps" > "$work/fetch$i.out" 2>&1 &
    fetchers+=($!)
  done
  for p in "${fetchers[@]}"; do
    wait "$p" || { echo "k8s_sizing: a consumer failed:" >&2; tail -3 "$work"/fetch*.out >&2; exit 1; }
  done
  end=$(date +%s.%N)
  read -r utime stime < <(awk '{print $14, $15}' "/proc/$server/stat")
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$server/status")
  amp=$(curl -s "http://$metrics/metrics" | awk '/^conveyor_video_frames_decoded_total/ {d += $2}
    /^conveyor_video_frames_delivered_total/ {v += $2} END {if (v > 0) printf "%.2f", d / v; else print "-"}')
  kill -TERM "$server"
  wait "$server" || true
  fetch_rss=$(sort -n "$work"/fetch*.rss | tail -1)
  awk -v c="$c" -v n=$((steps * batch)) -v cpu="$((utime + stime))" -v tck="$tck" -v amp="$amp" \
    -v hwm="$hwm" -v frss="$fetch_rss" -v wall="$(echo "$end - $start" | bc -l)" -v load="$(cut -d' ' -f1 /proc/loadavg)" \
    'BEGIN {printf "| %d | %d | %.1f | %.0f | %s | %d | %d | %.0f | %s |\n", c, n, cpu / tck, n / (cpu / tck), amp, hwm / 1024, frss / 1024, n / wall, load}'
done
