#!/bin/bash
# Buckets, end to end (bench/RESULTS.md "Buckets, end to end (issue 40 item 3)"): `conveyor bench`
# on a WebDataset folder of clips of mixed shapes (bench/buckets/make_clips.py) under each bucket
# config of bench/buckets/ (buckets_256.yaml, buckets_320.yaml), in alternating rounds so that the
# other load on a shared machine falls on both mixes alike. Each run's `uptime` goes into its log
# before it starts; its JSON and log land in OUT (bench_MIX_rROUND.{json,log}). Every JSON is then
# checked: the bucket rows are there with a CLI baseline, and the bucket fill accounts for every clip.
#
#   bash bench/buckets/run.sh BUILD_DIR OUT [--data DIR] [--clips N] [--divide D] [--seconds S]
#                              [--rounds R] [--threads 1,2] [--mixes "256 320"] [--no-serve]
#
# --data DIR: clips made before (make_clips.py DIR); else they are made in a temporary folder.
# The quick ctest (bucket_bench_quick) runs it on 6 clips at 1/8 of the size, 0.3 s per figure.
set -euo pipefail
usage="usage: bash bench/buckets/run.sh BUILD_DIR OUT [--data DIR] [--clips N] [--divide D] [--seconds S] [--rounds R] [--threads T] [--mixes \"256 320\"] [--no-serve]"
build=$(realpath "${1:?$usage}")
out=${2:?$usage}
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
data="" clips=24 divide=1 seconds=4 rounds=2 threads=1,2 mixes="256 320" serve=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --clips) clips=$2; shift 2 ;;
    --divide) divide=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --mixes) mixes=$2; shift 2 ;;
    --no-serve) serve=(--no-serve); shift ;;
    *) echo "run.sh: unknown flag $1 ($usage)" >&2; exit 2 ;;
  esac
done
cli="$build/tools/conveyor"
[[ -x "$cli" ]] || { echo "run.sh: $cli not found" >&2; exit 1; }
mkdir -p "$out"
if [[ -z "$data" ]]; then
  data=$(mktemp -d)
  trap 'rm -rf "$data"' EXIT
  /usr/bin/python3 "$here/make_clips.py" "$data" --clips "$clips" --divide "$divide"
fi
runs=()
for round in $(seq "$rounds"); do
  for mix in $mixes; do
    name="bench_${mix}_r${round}"
    {
      echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); uptime:$(uptime)"
      echo "command: conveyor bench $data/wds --config bench/buckets/buckets_$mix.yaml --modality video --threads $threads --seconds $seconds ${serve[*]} --json $out/$name.json"
    } > "$out/$name.log"
    "$cli" bench "$data/wds" --config "$here/buckets_$mix.yaml" --modality video --threads "$threads" \
      --seconds "$seconds" "${serve[@]}" --json "$out/$name.json" >> "$out/$name.log" 2>&1 ||
      { cat "$out/$name.log" >&2; echo "run.sh: $name failed" >&2; exit 1; }
    runs+=("$out/$name.json")
  done
done
# Every run: a bucket crop row beside its CLI baseline per thread count, a shuffled row beside the
# bucket bound, and a fill whose samples are the clips (one per video) in groups of the config's.
/usr/bin/python3 - "$(wc -l < "$data/shapes.txt")" "${runs[@]}" <<'PY'
import json, sys
clips = int(sys.argv[1])
for path in sys.argv[2:]:
    rows = json.load(open(path))["rows"]
    crop = [r for r in rows if r["order"] == "bucket crop and scale"]
    shuffled = [r for r in rows if r["stage"] == "assemble" and r["order"] == "shuffled, naive"]
    assert crop and all(r["value"] > 0 and r["limit"] > 0 for r in crop), f"{path}: no bucket crop row with a CLI baseline"
    assert all(r["stages"]["cli_decode_only_frames_per_s"] > 0 and r["stages"]["clips"] == clips for r in crop), path
    assert shuffled and all(r["limit_name"].startswith("bucket bound") and r["limit"] > 0 for r in shuffled), \
        f"{path}: the shuffled rows lack the bucket bound"
    for r in shuffled:
        fill = r["stages"]["buckets"]
        assert sum(b["samples"] for b in fill) == clips, f"{path}: the bucket fill holds {fill}, not {clips} clips"
        assert all(b["samples"] == b["groups"] * b["group"] + b["left_for_a_later_epoch"]
                   and b["left_for_a_later_epoch"] < b["group"] for b in fill), f"{path}: groups and leftovers disagree: {fill}"
    print(f"{path}: ok ({len(crop)} bucket crop rows, {len(shuffled)} shuffled rows, fill "
          + ", ".join(f"{b['width']}x{b['height']}: {b['samples']}" for b in shuffled[0]["stages"]["buckets"]) + ")")
PY
