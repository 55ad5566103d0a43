#!/usr/bin/env bash
# Mixture overhead (issue 16, docs/mixtures.md): samples/s of a three-dataset mixture against each
# of its datasets alone with the same spec (a one-dataset mixture file with the same mapping),
# all through `conveyor batches --stats` with the same threads, in the same run.
#
# Usage: bash bench/mixture_bench.sh BUILD_DIR [--steps N] [--threads T] [--work DIR] [--repeat R]
# Writes bench/out/mixture_bench.json and prints a markdown table.
#
# The figures: each run's samples/s (median of R runs); the mixture's expected rate if mixing cost
# nothing, 1 / sum_k(share_k / rate_k) (each sample costs what it costs in its own dataset); and
# the overhead 1 - mixture / expected. Goal: overhead <= 5%, and mixture >= 0.95 x the slowest
# dataset alone.
set -euo pipefail
build=$(realpath "${1:?usage: bash bench/mixture_bench.sh BUILD_DIR [--steps N] [--threads T] [--work DIR] [--repeat R]}")
shift
steps=60 threads=2 work="" repeat=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    *) echo "mixture_bench: unknown flag $1" >&2; exit 2 ;;
  esac
done
cli="$build/tools/conveyor"
[[ -x "$cli" ]] || { echo "mixture_bench: $cli not found (cmake --build $build --target conveyor)" >&2; exit 1; }
bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$bench_dir/out"
if [[ -z "$work" ]]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"

synth() {  # NAME FLAGS...
  local name=$1; shift
  if [[ ! -f "$work/$name/manifest.json" ]]; then
    echo "mixture_bench: synth $name $*" >&2
    "$cli" synth --quiet --out "$work/$name" "$@"
  fi
}
# Three robots: 2 cameras 224x224 at 50 Hz; 1 camera at 15 fps with a 7-dim state at 10 Hz; 3
# cameras 320x240 at 25 Hz (resized to 224x224 by the spec).
synth aloha  --episodes 6 --episode-seconds 10 --cameras 2 --size 224x224 --state-dim 14 --lowdim-rate 50 --audio-codec none --seed 1
synth pusht  --episodes 6 --episode-seconds 10 --cameras 1 --size 224x224 --fps 15 --gop 15 --state-dim 7 --lowdim-rate 10 --audio-codec none --seed 2
synth widowx --episodes 6 --episode-seconds 10 --cameras 3 --size 320x240 --state-dim 14 --lowdim-rate 25 --audio-codec none --seed 3

member() {  # NAME WEIGHT EXTRA
  printf '    - {name: %s, uri: %s, weight: %s%s}\n' "$1" "$work/$1" "$2" "$3"
}
header='mixture:
  pad: {observation.state: 14}
  datasets:'
m_aloha=$(member aloha 0.5 "")
m_pusht=$(member pusht 0.2 ", missing: [cam1]")
m_widowx=$(member widowx 0.3 ", streams: {cam1: cam2}")
printf '%s\n%s\n%s\n%s\n' "$header" "$m_aloha" "$m_pusht" "$m_widowx" > "$work/mix.yaml"
printf '%s\n%s\n' "$header" "$m_aloha" > "$work/only_aloha.yaml"
# pusht alone has no cam1 to pad (no other dataset gives its shape): its run leaves cam1 out of
# the config (config_pusht.yaml); padding a missing camera in the mixture is a memset.
printf '%s\n%s\n' "$header" "$(member pusht 0.2 "")" > "$work/only_pusht.yaml"
printf '%s\n%s\n' "$header" "$m_widowx" > "$work/only_widowx.yaml"
cat > "$work/config.yaml" <<'YAML'
anchor: action
streams:
  cam0: {size: [224, 224]}
  cam1: {size: [224, 224]}
  observation.state: {normalize: mean_std}
  action: {delta_timestamps: {start: 0, step: 0.1, count: 10}}
pipeline: {seed: 0, global_batch_size: 32, schedule: {mode: gop}}
YAML

grep -v '^  cam1:' "$work/config.yaml" > "$work/config_pusht.yaml"

rate() {  # FILE [CONFIG] -> median samples/s of $repeat runs
  local f=$1 cfg=${2:-config.yaml} r=()
  for _ in $(seq "$repeat"); do
    local out
    out=$("$cli" batches "$work/$f" --config "$work/$cfg" --steps "$steps" --threads "$threads" --stats 2>&1 >/dev/null)
    [[ "$out" == *samples/s* ]] || { echo "mixture_bench: $f: $out" >&2; exit 1; }
    r+=("$(sed -n 's/.* = \([0-9.]*\) samples\/s.*/\1/p' <<<"$out" | head -1)")
  done
  printf '%s\n' "${r[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

echo "mixture_bench: $steps batches of 32, $threads threads, median of $repeat (nproc $(nproc))" >&2
declare -A rates
for f in only_aloha only_pusht only_widowx mix; do
  cfg=config.yaml
  [[ $f == only_pusht ]] && cfg=config_pusht.yaml
  rates[$f]=$(rate "$f.yaml" "$cfg")
  echo "mixture_bench: $f ${rates[$f]} samples/s" >&2
done

/usr/bin/python3 - "$bench_dir/out/mixture_bench.json" "$steps" "$threads" "$repeat" \
  "${rates[only_aloha]}" "${rates[only_pusht]}" "${rates[only_widowx]}" "${rates[mix]}" <<'PY'
import json, os, sys
out, steps, threads, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
alone = dict(zip(["aloha", "pusht", "widowx"], map(float, sys.argv[5:8])))
mix = float(sys.argv[8])
share = {"aloha": 0.5, "pusht": 0.2, "widowx": 0.3}
expected = 1.0 / sum(share[k] / alone[k] for k in alone)
slowest = min(alone, key=alone.get)
doc = {
    "bench": "mixture_bench", "steps": steps, "threads": threads, "repeat": repeat,
    "batch": 32, "nproc": os.cpu_count(),
    "alone_samples_per_s": alone, "shares": share, "mixture_samples_per_s": mix,
    "expected_samples_per_s": expected, "overhead": 1 - mix / expected,
    "slowest": slowest, "mixture_over_slowest": mix / alone[slowest],
}
json.dump(doc, open(out, "w"), indent=2)
print("| run | samples/s |")
print("|---|---|")
for k in alone:
    note = " (no cam1: it has none to pad)" if k == "pusht" else ""
    print(f"| {k} alone, same spec{note} | {alone[k]:.1f} |")
print(f"| mixture 0.5/0.2/0.3 | {mix:.1f} |")
print(f"| expected if mixing cost nothing: 1 / sum(share / rate) | {expected:.1f} |")
print(f"\noverhead {100 * (1 - mix / expected):.1f}% (goal <= 5%); mixture / slowest alone ({slowest}) {mix / alone[slowest]:.2f} (goal >= 0.95)")
print(f"mixture_bench: wrote {out}", file=sys.stderr)
PY
