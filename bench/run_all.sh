#!/usr/bin/env bash
# Runs every benchmark in bench/ and writes their JSON documents to bench/out/.
# Usage: bash bench/run_all.sh BUILD_DIR [extra read_bench flags...]
# Extra decode_bench flags come from $DECODE_BENCH_FLAGS, e.g. "--work_dir=/tmp/db" to keep (and
# reuse) the datasets it makes between runs, or "--quick" for a smoke run.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: bash bench/run_all.sh BUILD_DIR [read_bench flags...]" >&2
  exit 2
fi
build_dir=$(realpath "$1")
shift
bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out_dir="$bench_dir/out"
mkdir -p "$out_dir"

read_bench="$build_dir/bench/read_bench"
decode_bench="$build_dir/bench/decode_bench"
for b in "$read_bench" "$decode_bench"; do
  if [[ ! -x "$b" ]]; then
    echo "run_all: $b not found; build it with: cmake --build $build_dir --target $(basename "$b")" >&2
    exit 1
  fi
done

echo "== read_bench (nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
echo "\$ $read_bench --json=$out_dir/read_bench.json $*"
"$read_bench" --json="$out_dir/read_bench.json" "$@"
echo "run_all: wrote $out_dir/read_bench.json"

# The same on one CPU. Unpinned, the HTTP figures depend on whether the scheduler puts nginx and
# the reading thread on the same core or on two (about 4x apart on loopback); pinned, they repeat.
echo
echo "== read_bench on CPU 0 only (nginx, the bench and the baselines)"
echo "\$ taskset -c 0 $read_bench --json=$out_dir/read_bench_one_cpu.json $*"
taskset -c 0 "$read_bench" --json="$out_dir/read_bench_one_cpu.json" "$@"
echo "run_all: wrote $out_dir/read_bench_one_cpu.json"

# Decoders against ffmpeg, tjbench and zstd on the same files, per core: decode_bench pins itself
# (and the tools it starts) to one CPU. It makes its datasets with the conveyor CLI of this build
# (a few minutes in all, most of it 720p synth and the measurements themselves).
echo
echo "== decode_bench"
# shellcheck disable=SC2086  # DECODE_BENCH_FLAGS is a list of flags
echo "\$ $decode_bench --json=$out_dir/decode_bench.json ${DECODE_BENCH_FLAGS:-}"
# shellcheck disable=SC2086
"$decode_bench" --json="$out_dir/decode_bench.json" ${DECODE_BENCH_FLAGS:-}
echo "run_all: wrote $out_dir/decode_bench.json"

# The pipeline end to end (1 and 2 workers, naive vs GOP-scheduled), amplification, shuffle
# quality and memory; then packing fill ratios, the GPU upload (memcpy without a GPU), and the
# wire (conveyor.v1 over loopback beside iperf3; served vs offline samples/s).
for b in pipeline_bench packing_bench upload_bench stream_bench; do
  echo
  echo "== $b"
  echo "\$ $build_dir/bench/$b --json=$out_dir/$b.json"
  "$build_dir/bench/$b" --json="$out_dir/$b.json"
  echo "run_all: wrote $out_dir/$b.json"
done

# `conveyor bench` on the pipeline benchmark's synthetic dataset: one table per modality, JSON and
# the plot (docs/bench.md); bench/RESULTS.md quotes the Markdown.
ds="${CONVEYOR_BENCH_DATASET:-/tmp/conveyor-pipeline-bench/ds}"
if [[ -f "$ds/manifest.json" ]]; then
  echo
  echo "== conveyor bench"
  echo "\$ conveyor bench $ds --config examples/pipeline.yaml --json $out_dir/conveyor_bench.json --plot bench/conveyor_bench.png --markdown $out_dir/conveyor_bench.md"
  "$build_dir/tools/conveyor" bench "$ds" --config "$bench_dir/../examples/pipeline.yaml" \
    --json "$out_dir/conveyor_bench.json" --plot "$bench_dir/conveyor_bench.png" \
    --markdown "$out_dir/conveyor_bench.md"
fi
