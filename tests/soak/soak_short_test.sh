#!/bin/bash
# The chaos soak (bench/soak/soak.sh), short: 2 `conveyor serve` on fixed loopback ports, 3
# `conveyor fetch` consumers of one job reading 14 whole epochs (~50 s), 2 servers SIGKILLed and
# restarted on the same port at seeded random times, one consumer stalled 12 s with its server
# SIGKILLed during the stall. Every check is exact, none is about speed: each consumer's lines
# (ids and SHA-256 of every batch) equal `conveyor batches` for its slice, every sample id exactly
# once per epoch, every server's RSS within its memory budget, fds and threads back to their
# ready-time counts once idle, every kill followed by a restart on its port.
# Skipped (77) without ss (iproute2) or /usr/bin/python3.
# Env: CONVEYOR_CLI, CONVEYOR_SOURCE_DIR, SOAK_SEED (default 18), KEEP_TMP=1 keeps the files.
set -uo pipefail

CLI=${CONVEYOR_CLI:?CONVEYOR_CLI: the conveyor binary}
SRC=${CONVEYOR_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
for tool in ss /usr/bin/python3; do
  command -v "$tool" > /dev/null || { echo "SKIP: $tool not found"; exit 77; }
done
T=$(mktemp -d /tmp/conveyor-soak-test.XXXXXX)
keep=()
[[ ${KEEP_TMP:-0} == 1 ]] && keep=(--keep)
CONVEYOR_CLI=$CLI /bin/bash "$SRC/bench/soak/soak.sh" --servers 2 --consumers 3 --minutes 0.8 \
  --step-seconds 0.05 --kills 2 --stall-seconds 12 --seed "${SOAK_SEED:-18}" --work "$T/work" \
  --json "$T/soak.json" "${keep[@]}"
rc=$?
# soak.sh keeps its work dir when it fails (and says where); the JSON goes with it.
if [[ $rc -eq 0 && ${KEEP_TMP:-0} != 1 ]]; then rm -rf "$T"; else echo "test files in $T"; fi
if [[ $rc -eq 2 ]]; then echo "FAIL: the soak could not run"; exit 1; fi
exit $rc
