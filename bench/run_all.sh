#!/usr/bin/env bash
# Runs every benchmark in bench/ and writes their JSON documents to bench/out/.
# Usage: bash bench/run_all.sh BUILD_DIR [extra read_bench flags...]
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
if [[ ! -x "$read_bench" ]]; then
  echo "run_all: $read_bench not found; build it with: cmake --build $build_dir --target read_bench" >&2
  exit 1
fi

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
