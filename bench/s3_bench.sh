#!/usr/bin/env bash
# `conveyor batches` from radosgw on loopback (tests/s3/radosgw.sh) against local disk, with the
# node-local cache cold and warm, beside `aws s3 cp` of the same objects (the transfer baseline,
# Debian's /usr/bin/aws) in the same run. Prints a table and one JSON line.
#
#   bench/s3_bench.sh [BUILD_DIR] [--episodes N] [--steps K]
#
# Wall times are medians of 3 runs; the machine is noisy (shared/LIMITS.md), so only the ratios
# within one run mean anything.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
EPISODES=6
STEPS=20
shift || true
while [[ $# -gt 0 ]]; do
  case "$1" in
    --episodes) EPISODES="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
CLI="$BUILD/tools/conveyor"
AWS=/usr/bin/aws
WORK="$(mktemp -d)"
trap '"$ROOT/tests/s3/radosgw.sh" stop "$WORK/ceph"; rm -rf "$WORK"' EXIT

line=$("$ROOT/tests/s3/radosgw.sh" start "$WORK/ceph")
eval "$line"
export AWS_ACCESS_KEY_ID="$RGW_ACCESS_KEY" AWS_SECRET_ACCESS_KEY="$RGW_SECRET_KEY"
export AWS_REGION=us-east-1 AWS_ENDPOINT_URL="http://127.0.0.1:$RGW_PORT" HOME="$WORK"
export AWS_EC2_METADATA_DISABLED=true
unset CONVEYOR_CACHE_DIR
# Debian's awscli 2.9 predates AWS_ENDPOINT_URL (2.13): it gets the endpoint as a flag.
AWS="$AWS --endpoint-url $AWS_ENDPOINT_URL"

"$CLI" synth --out "$WORK/ds" --episodes "$EPISODES" --cameras 2 --size 224x224 \
  --episode-seconds 4 --audio-codec none --quiet
cat >"$WORK/config.yaml" <<'EOF'
anchor: action
streams:
  cam0: {delta_timestamps: [0.0], size: [224, 224]}
  cam1: {delta_timestamps: [0.0], size: [224, 224]}
  observation.state: {delta_timestamps: [0.0]}
  action: {delta_timestamps: {start: 0.0, step: 0.02, count: 50}}
pipeline:
  global_batch_size: 16
  seed: 7
  schedule: {mode: gop}
EOF
$AWS s3 mb s3://bench >/dev/null
$AWS s3 cp --only-show-errors --recursive "$WORK/ds" s3://bench/ds
BYTES=$(du -sb "$WORK/ds" | cut -f1)

# Median wall seconds of 3 runs of "$@" (before each, `prep` if set).
median3() {
  local times=()
  for _ in 1 2 3; do
    [[ -n "${prep:-}" ]] && eval "$prep"
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    t1=$(date +%s.%N)
    times+=("$(echo "$t1 - $t0" | bc -l)")
  done
  printf '%s\n' "${times[@]}" | sort -g | sed -n 2p
}

batches() { "$CLI" batches "$1" --config "$WORK/config.yaml" --steps "$STEPS" --digest; }
prep="" t_local=$(median3 batches "$WORK/ds")
prep="" t_s3=$(median3 batches s3://bench/ds)
prep="rm -rf $WORK/cache" t_cold=$(CONVEYOR_CACHE_DIR="$WORK/cache" median3 batches s3://bench/ds)
prep="" t_warm=$(CONVEYOR_CACHE_DIR="$WORK/cache" median3 batches s3://bench/ds)
prep="rm -rf $WORK/copy" t_aws=$(median3 $AWS s3 cp --only-show-errors --recursive s3://bench/ds "$WORK/copy")
# Every byte into an empty cache: `inspect --verify` reads every packet and block of every shard,
# which the cache turns into runs of 1 MiB block requests: the cold fill rate beside aws s3 cp's.
prep="rm -rf $WORK/cache" t_fill=$(CONVEYOR_CACHE_DIR="$WORK/cache" median3 "$CLI" inspect --verify s3://bench/ds)

ratio() { echo "scale=3; $1 / $2" | bc -l; }
printf '%-34s %10s %14s\n' workload seconds "vs local"
printf '%-34s %10.3f %14s\n' "batches, local disk" "$t_local" 1.000
printf '%-34s %10.3f %14.3f\n' "batches, s3 (no cache)" "$t_s3" "$(ratio "$t_local" "$t_s3")"
printf '%-34s %10.3f %14.3f\n' "batches, s3, cache cold" "$t_cold" "$(ratio "$t_local" "$t_cold")"
printf '%-34s %10.3f %14.3f\n' "batches, s3, cache warm" "$t_warm" "$(ratio "$t_local" "$t_warm")"
printf '%-34s %10.3f   %.1f MB/s\n' "aws s3 cp --recursive (baseline)" "$t_aws" \
  "$(echo "$BYTES / $t_aws / 1000000" | bc -l)"
printf '%-34s %10.3f   %.1f MB/s (%.2f of aws s3 cp)\n' "inspect --verify, cache cold" "$t_fill" \
  "$(echo "$BYTES / $t_fill / 1000000" | bc -l)" "$(echo "$t_aws / $t_fill" | bc -l)"
printf '{"bench":"s3","dataset_bytes":%s,"steps":%s,"local_s":%s,"s3_s":%s,"s3_cache_cold_s":%s,"s3_cache_warm_s":%s,"aws_s3_cp_s":%s,"verify_cache_cold_s":%s}\n' \
  "$BYTES" "$STEPS" "$t_local" "$t_s3" "$t_cold" "$t_warm" "$t_aws" "$t_fill"
