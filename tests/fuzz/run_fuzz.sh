#!/usr/bin/env bash
# A bounded libFuzzer run of the shard index parsers: `run_fuzz.sh FUZZER SECONDS`.
# Seeds: the shards of a tiny real dataset made by `conveyor synth` (when the CLI is built),
# prefixed with the mode byte the fuzz target expects.
set -euo pipefail
FUZZER="$1"; SECONDS_BUDGET="${2:-60}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLI="${CONVEYOR_CLI:-$ROOT/build/tools/conveyor}"
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/corpus"
if [[ -x "$CLI" ]]; then
  "$CLI" synth --out "$WORK/ds" --episodes 2 --episode-seconds 1 --size 32x32 --cameras 1 \
    --episodes-per-shard 2 --quiet
  for s in "$WORK"/ds/shards/*.cvs; do
    { printf '\x00'; cat "$s"; } > "$WORK/corpus/$(basename "$s")"
  done
fi
printf '\x01' > "$WORK/corpus/empty_index"
printf '\x02' > "$WORK/corpus/empty_dir"
echo "fuzz: $(basename "$FUZZER") for ${SECONDS_BUDGET}s"
"$FUZZER" -max_total_time="$SECONDS_BUDGET" -rss_limit_mb=2048 -max_len=65536 \
  -print_final_stats=1 "$WORK/corpus" 2>&1 | tail -n 12
