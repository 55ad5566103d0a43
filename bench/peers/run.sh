#!/usr/bin/env bash
# Peer comparison in one command: a LeRobot-style PyTorch/PyAV loader against Conveyor on the same
# synthetic dataset and the same cores (bench/peers/README.md).
#
#   bash bench/peers/run.sh            # ~5 minutes on 2 cores
#
# Environment: BUILD (default build/: needs build/tools/conveyor and build/python), WORK (dataset
# and exported MP4s, default /tmp/conveyor_peer_bench; kept and reused: `conveyor synth` is
# deterministic), CORES (taskset CPU list every process is pinned to, default 0,1; "all" = no
# pinning). Extra arguments go to lerobot_style.py (e.g. --workers 0,1,2,4 --batches 40).
# Writes bench/out/peer_bench.{json,txt} and bench/peers/peer_bench.png.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(realpath "${BUILD:-$repo/build}")
work=${WORK:-/tmp/conveyor_peer_bench}
cores=${CORES:-0,1}
cli="$build/tools/conveyor"
py=/usr/bin/python3   # Debian's: numpy, torch and av come from python3-numpy/-torch/-av

if [[ ! -x "$cli" ]]; then
  echo "run.sh: $cli not found; build first (./run test, or cmake --build $build)" >&2
  exit 1
fi
if [[ ! -d "$build/python/conveyor" ]]; then
  echo "run.sh: $build/python/conveyor not found (the Python module); the served row needs it" >&2
  exit 1
fi
missing=()
for m in av:python3-av torch:python3-torch numpy:python3-numpy matplotlib:python3-matplotlib; do
  "$py" -c "import ${m%%:*}" 2>/dev/null || missing+=("${m#*:}")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "run.sh: installing ${missing[*]}" >&2
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  if ! { DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
           "${missing[@]}" >/dev/null 2>&1 ||
         { $SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive \
           $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; }; then
    echo "run.sh: could not install ${missing[*]}" >&2
    exit 1
  fi
fi

pin=()
if [[ "$cores" != "all" ]] && command -v taskset >/dev/null; then
  pin=(taskset -c "$cores")
fi

ds="$work/ds"
mkdir -p "$work"
if ! "$cli" inspect "$ds" >/dev/null 2>&1; then
  rm -rf "$ds" "$ds.export"
  echo "run.sh: conveyor synth --out $ds --episodes 8 --episode-seconds 20 (3 cameras 224x224 H.264 30 fps GOP 30)" >&2
  "${pin[@]}" "$cli" synth --out "$ds" --episodes 8 --episode-seconds 20 --quiet
fi

mkdir -p "$repo/bench/out"
echo "run.sh: uptime before: $(uptime)" >&2
PYTHONPATH="$build/python" "${pin[@]}" "$py" "$here/lerobot_style.py" --cli "$cli" \
  --dataset "$ds" --work "$ds.export" --json "$repo/bench/out/peer_bench.json" \
  --plot "$here/peer_bench.png" "$@" | tee "$repo/bench/out/peer_bench.txt"
echo "run.sh: uptime after: $(uptime)" >&2
