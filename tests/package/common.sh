# Shared by the package tests (sourced): skip/fail, waiting for a server's ready file, and the two
# ways of comparing what a server sends with what the offline pipeline computes.
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
# wait_ready FILE PID: until FILE has the bound address (conveyor serve --ready-file), or PID dies.
wait_ready() {
  local file="$1" pid="$2" i
  for i in $(seq 600); do
    [[ -s "$file" ]] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# The batch lines' cursor, sample count and ids, from `conveyor fetch --ids`
# ("E:S consumer I/N samples K ids XXH3 [ep/step ...]") or from examples/cpp_consumer
# ("E:S samples K tensors T bytes B [ep/step ...]").
ids_of_fetch() { sed -E 's/^([0-9]+:[0-9]+) consumer [0-9]+\/[0-9]+ samples ([0-9]+) .*(\[.*\])$/\1 \2 \3/' "$@"; }
ids_of_consumer() { sed -E 's/^([0-9]+:[0-9]+) samples ([0-9]+) .*(\[.*\])$/\1 \2 \3/' "$@"; }
