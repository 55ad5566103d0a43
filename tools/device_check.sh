#!/usr/bin/env bash
# Every GPU check of the project in one run on the GPU machine, from the carried bundle
# (tools/device_bundle.sh), with the machine's own Python (CUDA torch, jax, flax, optax, orbax):
#   the C++ GPU tests (upload_test, client_device_test, capi_test, nvdec_test, device_frames_test,
#   decode_backend_test),
#   nvdec_bench, the video-model example (train_video_model.py, NVDEC and served), the Python package's tests
#   (Loader(device="cuda:0"), DLPack into torch and jax, make_global_batch on real devices),
#   upload_bench beside cudaMemcpy, `conveyor train --comm nccl --device`, and both training
#   examples (python/examples/train_torch_policy.py, train_jax_policy.py) against a data server on
#   the same host, multi-process JAX (tools/jax_multiprocess_check.py: real jax.distributed on
#   CPU devices) and make_global_batch's host cost (bench/jax_global_batch_bench.py); within
#   about 7 minutes.
#
#   (here)       bash tools/device_bundle.sh build out/device     # the archive to carry
#   (device)     bash tools/device_check.sh [BUNDLE.tar.xz|DIR]   # from the repository root
#
# Raw data: every check's log and JSON go into one folder named by device and date,
# $OUT/RUN (RUN: CONVEYOR_CHECK_NAME, default e.g. h200-2026-11-29, cpu-... for a rehearsal), with
# RUN/device_check.json summing them up, and the folder packed as $OUT/RUN.tgz (the device tool
# brings back a few files per call). Unpack it under bench/ beside RESULTS.md and commit it:
# bench/RUN/ is then the raw data of every figure RESULTS quotes from that run. A check the
# deadline left out is listed as skipped (status "skipped", passed false), never as passed; the
# summary's "passed" is true only when every selected check ran and passed.
#
# Knobs: CONVEYOR_DEVICE_PYTHON (default /opt/torch/.venv/bin/python, else python3),
# CONVEYOR_CHECK_STEPS (training steps per example, default 300), CONVEYOR_CHECK_EPISODES (of the
# synthetic dataset, default 48 of 10 s, so 300 steps of batch 64 stay in one epoch, 3 cameras
# 224x224 H.264), CONVEYOR_CHECK_ONLY (a space-separated list of check names), CONVEYOR_CHECK_SKIP
# (check names to leave out), CONVEYOR_CHECK_DEADLINE (seconds into the run after which checks are
# skipped and listed as such), CONVEYOR_CHECK_NVDEC_SESSIONS (nvdec_bench's --sessions),
# CONVEYOR_CHECK_VIDEO_STEPS and _PREFETCH (train_video_model.py's --steps and --prefetch), CONVEYOR_CHECK_CPU=1 (runs the examples on the CPU with a
# tiny model: a rehearsal of the script where there is no GPU).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="${1:-$ROOT/out/device/conveyor-bundle.tar.xz}"
PY="${CONVEYOR_DEVICE_PYTHON:-/opt/torch/.venv/bin/python}"
[[ -x "$PY" ]] || PY="$(command -v python3)"
STEPS="${CONVEYOR_CHECK_STEPS:-300}"
CPU="${CONVEYOR_CHECK_CPU:-0}"
# The run's name: the GPU's model (NVIDIA H200 -> h200) and the date, "cpu" without a GPU.
device_slug() {
  local name
  name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  [[ -z "$name" || "$CPU" == 1 ]] && { echo cpu; return; }
  name="${name#NVIDIA }"; name="${name%% *}"
  echo "${name,,}" | tr -c 'a-z0-9\n' '-'
}
RUN="${CONVEYOR_CHECK_NAME:-$(device_slug)-$(date -u +%Y-%m-%d)}"
OUT_ROOT="${OUT:-$ROOT/out/device-check}"
OUT="$OUT_ROOT/$RUN"  # every check's log and JSON, below; packed as $OUT_ROOT/$RUN.tgz
rm -rf "$OUT"
mkdir -p "$OUT"
# Checks that would start later than this many seconds into the run are skipped (and listed as
# such): the device's time is counted, so the order below is the order of importance.
DEADLINE="${CONVEYOR_CHECK_DEADLINE:-100000}"
T0=$(date +%s)
WORK="$(mktemp -d)"
cleanup() { [[ -n "${SERVER_PID:-}" ]] && kill -TERM "$SERVER_PID" 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT

if [[ -d "$SRC" ]]; then
  B="$SRC"
else
  tar -xJf "$SRC" -C "$WORK" || { echo "device_check: cannot unpack $SRC" >&2; exit 1; }
  B="$WORK/conveyor-bundle"
fi
export CONVEYOR_CLI="$B/conveyor" CONVEYOR_SOURCE_DIR="$ROOT" PYTHONPATH="$B/python"
export CONVEYOR_BUNDLE_QUIET=1
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"

# A check runs when CONVEYOR_CHECK_ONLY is empty or one of its words is its name or the start of
# it (torch_policy selects torch_policy_w96).
wanted() {
  local w
  for w in ${CONVEYOR_CHECK_SKIP:-}; do [[ "$1" == "$w" ]] && return 1; done
  [[ -z "${CONVEYOR_CHECK_ONLY:-}" ]] && return 0
  for w in $CONVEYOR_CHECK_ONLY; do [[ "$1" == "$w"* ]] && return 0; done
  return 1
}

# check NAME TIMEOUT CMD...: runs CMD with its log in $OUT/NAME.log, one JSON line per check.
check() {
  local name="$1" limit="$2"; shift 2
  wanted "$name" || return 0
  if (( $(date +%s) - T0 > DEADLINE )); then  # out of device time: say so, run nothing
    echo "{\"check\": \"$name\", \"status\": \"skipped\", \"passed\": false, \"skipped\": \"past CONVEYOR_CHECK_DEADLINE ($DEADLINE s)\", \"seconds\": 0}" >> "$RESULTS"
    echo "== $name: skipped, past the deadline" >&2
    return 0
  fi
  local t=$(date +%s%N)
  echo "== $name ($(($(date +%s) - T0)) s in)" >&2
  timeout --kill-after=5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  "$PY" - "$name" "$rc" "$t" "$OUT/$name.log" >> "$RESULTS" <<'PY'
import json, re, sys, time
name, rc, log = sys.argv[1], int(sys.argv[2]), sys.argv[4]
secs = (time.time_ns() - int(sys.argv[3])) / 1e9
text = open(log, errors="replace").read()
r = {"check": name, "status": "passed" if rc == 0 else "failed", "rc": rc, "passed": rc == 0,
     "seconds": round(secs, 1), "log": name + ".log",
     "tail": text[-1500:]}
m = re.findall(r"\[  PASSED  \] (\d+) test", text)
if m: r["gtest_passed"] = int(m[-1])
m = re.findall(r"\[  SKIPPED \] (\d+) test", text)
if m: r["gtest_skipped"] = int(m[-1])
m = re.search(r"Ran (\d+) tests? in", text)
if m: r["unittest_ran"] = int(m.group(1))
m = re.search(r"skipped=(\d+)", text)
if m: r["unittest_skipped"] = int(m.group(1))
for line in reversed(text.splitlines()):  # the examples print one JSON summary line
    if line.startswith("{") and line.endswith("}"):
        try: r["summary"] = json.loads(line); break
        except ValueError: pass
print(json.dumps(r))
PY
  echo "   rc $rc" >&2
  return $rc
}

check gpu 20 bash -c 'nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv; nvidia-smi -q -d CLOCK | grep -A6 -i "max clocks"'
check python_env 60 "$PY" -c '
import sys, json
out = {"python": sys.version.split()[0]}
try:
    import torch; out.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
except Exception as e: out["torch"] = repr(e)
try:
    import jax; out.update(jax=jax.__version__, jax_devices=[str(d) for d in jax.devices()])
except Exception as e: out["jax"] = repr(e)
import conveyor, conveyor._lib as lib
out.update(conveyor=conveyor.__version__, library=lib.path, device_supported=conveyor.device_supported())
print(json.dumps(out))'
# The server's decode workers per stream: CONVEYOR_CHECK_SERVER_THREADS, default all cores but 4,
# which the trainer's own process keeps (see the robot server below).
SERVER_THREADS="${CONVEYOR_CHECK_SERVER_THREADS:-$(( $(nproc) > 6 ? $(nproc) - 4 : 2 ))}"
# Issue 32 item 4 and its video-model goal: python/examples/train_video_model.py on the 720p
# H.264 clips, 49-frame clips at 256x256, batch 8. --frames nvdec: the server serves captions and
# ids, the trainer decodes on NVDEC into its device batch (conveyor.video.DeviceFrames); --frames
# served: the server decodes the same clips on its cores (all but 4) and the client uploads.
# --model none: the path's ceiling (frames/s into the device batch, no model step).
video_model_checks() {
  local vds="$WORK/v720_h264" ready="$WORK/video_ready"
  "$B/conveyor" serve "$vds" --config "$ROOT/examples/video_model_captions.yaml" \
    --listen 127.0.0.1:0 --ready-file "$ready" --threads "$SERVER_THREADS" > "$OUT/video_serve.log" 2>&1 &
  local vpid=$!
  for _ in $(seq 300); do [[ -s "$ready" ]] && break; kill -0 "$vpid" 2>/dev/null || break; sleep 0.1; done
  local vaddr="$(cut -d' ' -f1 "$ready" 2>/dev/null)"
  local vm=("$PY" "$ROOT/python/examples/train_video_model.py" --servers "$vaddr" --dataset "$vds")
  check video_model_nvdec_ceiling 120 "${vm[@]}" --model none --steps 60 --warmup 10 --json "$OUT/video_model_nvdec_ceiling.json"
  check video_model_served_ceiling 120 "${vm[@]}" --frames served --model none --steps 60 --warmup 10 --json "$OUT/video_model_served_ceiling.json"
  # The model step: CONVEYOR_CHECK_VIDEO_MODELS, space-separated WIDTH:DEPTH pairs, each trained
  # from both sources (named video_model_nvdec_w512_d12 when there are several).
  local m name vargs
  read -r -a VIDEO_MODELS <<< "${CONVEYOR_CHECK_VIDEO_MODELS:-384:8}"
  for m in "${VIDEO_MODELS[@]}"; do
    vargs=(--width "${m%%:*}" --depth "${m#*:}" --steps "${CONVEYOR_CHECK_VIDEO_STEPS:-60}" --warmup 10
           --prefetch "${CONVEYOR_CHECK_VIDEO_PREFETCH:-3}")
    for src in nvdec served; do
      name="video_model_$src"
      (( ${#VIDEO_MODELS[@]} > 1 )) && name="${name}_w${m%%:*}_d${m#*:}"
      check "$name" 150 "${vm[@]}" --frames "$src" "${vargs[@]}" --json "$OUT/$name.json"
    done
  done
  kill -TERM "$vpid" 2>/dev/null; wait "$vpid" 2>/dev/null
}
# NVDEC (media/nvdec_decoder.h, issue 32): its tests, then nvdec_bench on 720p clips of the
# video-model preset, H.264 and HEVC: sessions 1..14 in one process, libavcodec on every core, both
# at once, the pixel difference; then 7 processes of one session each at once (how FFmpeg's
# probe ran), to see whether separate processes share the engines as threads of one do.
check nvdec_test 180 "$B/run" nvdec_test
check device_frames_test 120 "$B/run" device_frames_test
# Served batches with `decode: gpu` (NVDEC frames copied into the batch): same bits at 1 and 3
# threads, the kernel's tolerance against the CPU's frames.
check decode_backend_test 120 "$B/run" decode_backend_test
for codec in h264 hevc; do
  check "nvdec_synth_720p_$codec" 180 "$B/conveyor" synth --preset video-model --out "$WORK/v720_$codec" \
    --episodes "${CONVEYOR_CHECK_CLIPS:-12}" --video-codec "$codec" --quiet
  check "nvdec_bench_$codec" 180 "$B/run" nvdec_bench --dataset "$WORK/v720_$codec" \
    --sessions "${CONVEYOR_CHECK_NVDEC_SESSIONS:-1,2,4,7,14}" --seconds 3 --json "$OUT/nvdec_bench_$codec.json"
  [[ "$codec" == h264 && "$CPU" != 1 ]] && video_model_checks
done
nvdec_processes() {
  local pids=() i
  for i in $(seq 7); do
    "$B/run" nvdec_bench --dataset "$WORK/v720_h264" --only nvdec --sessions 1 --seconds 4 \
      --json "$OUT/nvdec_process_$i.json" > /dev/null 2>&1 & pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || return 1; done
  "$PY" -c 'import json,sys; r=[json.load(open(f))["nvdec"][0]["frames_per_s"] for f in sys.argv[1:]]; print(json.dumps({"processes": len(r), "frames_per_s": sum(r), "each": r}))' "$OUT"/nvdec_process_*.json
}
export -f nvdec_processes
export B WORK OUT PY
check nvdec_7_processes 120 bash -c nvdec_processes
check upload_test 120 "$B/run" upload_test
check client_device_test 120 "$B/run" client_device_test
check capi_test 120 "$B/run" capi_test
check python_tests 240 "$PY" -m unittest discover -s "$B/python/tests" -p test_loader.py \
  -k DeviceTest -k DeviceFramesTest -k ZeroCopyTest -k BatchesTest -k JaxTest -k StateTest -v
check upload_bench 120 "$B/run" upload_bench --json="$OUT/upload_bench.json"
# conveyor.jax.make_global_batch's host time per batch against the per-tensor way it was (issue 41).
check jax_global_batch_bench 120 "$PY" "$ROOT/bench/jax_global_batch_bench.py" \
  --json "$OUT/jax_global_batch_bench.json"

# A dataset and a server for the trainers: 2 cameras 224x224 H.264 (the examples' policy.yaml)
# and pipeline.yaml's 3 cameras for `conveyor train`.
DS="$WORK/ds"
check synth 240 "$B/conveyor" synth --out "$DS" --episodes "${CONVEYOR_CHECK_EPISODES:-48}" \
  --cameras 3 --episode-seconds 10 --quiet
# Issue 29, one consumer at the pipeline's speed on this host's cores (bench/RESULTS.md "One
# consumer at the pipeline's speed"): `conveyor bench`'s serve rows, gRPC and the same-host
# region, uncached and with a warm frame cache, at CONVEYOR_CHECK_TRANSPORT_THREADS (default 4 and
# every core), on the dataset above, before its server starts; at the end, striped over 4
# connections and 8 consumers of one server. Only when asked (CONVEYOR_CHECK_ONLY=transport, or
# CONVEYOR_CHECK_TRANSPORT=1): about 3 minutes of device time.
TRANSPORT=0
if [[ "${CONVEYOR_CHECK_TRANSPORT:-0}" == 1 || " ${CONVEYOR_CHECK_ONLY:-} " == *" transport"* ]]; then
  TRANSPORT=1
  TDS="$DS"  # the robot dataset, else one of its own (CONVEYOR_CHECK_ONLY=transport skips synth)
  if [[ ! -s "$TDS/manifest.json" ]]; then
    TDS="$WORK/transport_ds"
    "$B/conveyor" synth --out "$TDS" --episodes "${CONVEYOR_CHECK_TRANSPORT_EPISODES:-24}" --cameras 3 \
      --episode-seconds 10 --quiet
  fi
  TT="${CONVEYOR_CHECK_TRANSPORT_THREADS:-4,$(nproc)}"
  # The plot needs /usr/bin/python3 with matplotlib, which the GPU image lacks: plot the JSON
  # afterwards elsewhere (bench/RESULTS.md says how).
  PLOT=()
  /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && PLOT=(--plot "$OUT/transport_bench.png")
  check transport_bench 240 "$B/conveyor" bench "$TDS" --modality video --threads "$TT" --seconds 3 \
    --frame-cache-bytes 8GB --json "$OUT/transport_bench.json" "${PLOT[@]}"
fi
# The server runs SERVER_THREADS decode workers per stream (set above). `conveyor serve`'s own
# default is 2, which is what the H200 runs of 2026-11-27 had: one stream then decodes on two cores, about the examples' demand,
# and the trainer waited at every shuffle window (bench/RESULTS.md "The GPU check on an H200").
"$B/conveyor" serve "$DS" --config "$ROOT/python/examples/policy.yaml" \
  --config "$ROOT/examples/pipeline.yaml" --listen 127.0.0.1:0 --ready-file "$WORK/ready" \
  --threads "$SERVER_THREADS" > "$OUT/serve.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 300); do [[ -s "$WORK/ready" ]] && break; kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
ADDR="$(cut -d' ' -f1 "$WORK/ready" 2>/dev/null)"
echo "server: ${ADDR:-none} (pid $SERVER_PID)" >&2
[[ -n "$ADDR" ]] || { echo "device_check: the data server did not start:" >&2; tail -5 "$OUT/serve.log" >&2; }

if [[ "$CPU" == 1 ]]; then
  EX_ARGS=(--device cpu --width 4 --blocks 1,1 --crop 64 --hidden 32)
  JAX_ARGS=(--width 4 --blocks 1,1 --crop 64 --hidden 32)
  TRAIN_DEVICE=()
else
  EX_ARGS=()
  JAX_ARGS=()
  TRAIN_DEVICE=(--device --comm nccl)
fi
check conveyor_train 120 "$B/conveyor" train --servers "$ADDR" --config-name pipeline --rank 0 \
  --world-size 1 --rendezvous "$WORK/rdv" --steps 100 "${TRAIN_DEVICE[@]}" --json "$OUT/train.json"
# The model step: CONVEYOR_CHECK_TORCH_MODELS / CONVEYOR_CHECK_JAX_MODELS, space-separated
# WIDTH:BLOCKS pairs (the encoder's --width and --blocks; width a multiple of 32 for GroupNorm),
# one run each, named torch_policy_w96_b3333 when there are several; defaults: torch 64:3,3,3,3, jax 96:3,3,3,3 (the H200 runs of 2026-11-27, bench/RESULTS.md).
read -r -a TORCH_MODELS <<< "${CONVEYOR_CHECK_TORCH_MODELS:-64:3,3,3,3}"
read -r -a JAX_MODELS <<< "${CONVEYOR_CHECK_JAX_MODELS:-96:3,3,3,3}"
model_args() {  # model_args WIDTH:BLOCKS -> the examples' flags (none on the CPU rehearsal)
  [[ "$CPU" == 1 ]] && return 0
  echo "--width ${1%%:*} --blocks ${1#*:}"
}
model_name() {  # model_name BASE WIDTH:BLOCKS COUNT
  if (( $3 > 1 )); then local b="${2#*:}"; echo "$1_w${2%%:*}_b${b//,/}"; else echo "$1"; fi
}
for m in "${TORCH_MODELS[@]}"; do
  name="$(model_name torch_policy "$m" ${#TORCH_MODELS[@]})"
  read -r -a margs <<< "$(model_args "$m")"
  check "$name" 150 "$PY" "$ROOT/python/examples/train_torch_policy.py" --servers "$ADDR" \
    --config "$ROOT/python/examples/policy.yaml" --steps "$STEPS" --json "$OUT/$name.json" \
    "${margs[@]}" "${EX_ARGS[@]}"
done
for m in "${JAX_MODELS[@]}"; do
  name="$(model_name jax_policy "$m" ${#JAX_MODELS[@]})"
  read -r -a margs <<< "$(model_args "$m")"
  check "$name" 180 "$PY" "$ROOT/python/examples/train_jax_policy.py" --servers "$ADDR" \
    --config "$ROOT/python/examples/policy.yaml" --steps "$STEPS" --json "$OUT/$name.json" \
    --checkpoint-dir "$WORK/jax_ckpt_$name" "${margs[@]}" "${JAX_ARGS[@]}"
done
# Multi-process JAX (issue 41 item 3): 2 processes of the real jax joined on 127.0.0.1 (2 CPU
# devices each), global arrays against the offline batch, an Orbax checkpoint restored at 4 and 1.
check jax_multiprocess 300 "$PY" "$ROOT/tools/jax_multiprocess_check.py" --dataset "$DS" \
  --cli "$B/conveyor" --json "$OUT/jax_multiprocess.json" --workdir "$WORK/jax_multiprocess"
check jax_policy_resume 120 "$PY" "$ROOT/python/examples/train_jax_policy.py" --servers "$ADDR" \
  --config "$ROOT/python/examples/policy.yaml" --steps 20 --warmup 0 --checkpoint-dir "$WORK/jax_ckpt_jax_policy" \
  --restore "${JAX_ARGS[@]}"

# Issue 29's striped and many-consumer rows (the first row ran before the trainers, above).
if [[ "$TRANSPORT" == 1 ]]; then
  [[ -n "${SERVER_PID:-}" ]] && { kill -TERM "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=; }
  # Striped gRPC with a warm frame cache (the row where one loopback connection delivered 0.19),
  # and epoch 1 with a pre-faulted cache on a fresh VM (issue 29 item 5).
  check transport_bench_striped 180 "$B/conveyor" bench "$TDS" --modality video --threads "$(nproc)" \
    --seconds 3 --payload-streams 4 --frame-cache-bytes 8GB --frame-cache-prefault \
    --json "$OUT/transport_bench_striped.json"
  # 8 consumers at all cores per stream: the server's default CPU slots, then none (how it was).
  check transport_bench_8_consumers 120 "$B/conveyor" bench "$TDS" --modality lowdim --threads "$(nproc)" \
    --seconds 3 --consumers 8 --json "$OUT/transport_bench_8_consumers.json"
  check transport_bench_8_consumers_no_slots 120 "$B/conveyor" bench "$TDS" --modality lowdim \
    --threads "$(nproc)" --seconds 3 --consumers 8 --cpu-slots 0 --json "$OUT/transport_bench_8_consumers_no_slots.json"
fi

"$PY" - "$RESULTS" "$OUT/device_check.json" "$(($(date +%s) - T0))" "$RUN" <<'PY'
import json, sys
results = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
skipped = [r["check"] for r in results if r["status"] == "skipped"]
failed = [r["check"] for r in results if r["status"] == "failed"]
summary = {"run": sys.argv[4], "seconds": int(sys.argv[3]),
           "passed": bool(results) and not skipped and not failed,
           "ran": len(results) - len(skipped), "failed": failed, "skipped": skipped,
           "checks": {r["check"]: r for r in results}}
for name, r in summary["checks"].items():
    s = r.get("summary")
    if not s or not name.startswith(("torch_policy", "jax_policy")) or "resume" in name:
        continue
    goal = "frames_per_s" if name.startswith("torch") else "frames_per_s_per_gpu"
    summary[f"{name}_goal"] = {"frames_per_s_per_gpu": s.get(goal), "width": s.get("width"),
                               "data_wait_fraction": s.get("data_wait_fraction"),
                               "met": bool(s.get(goal, 0) >= 2400
                                           and s.get("data_wait_fraction", 1) <= 0.02)}
json.dump(summary, open(sys.argv[2], "w"), indent=1)
print(json.dumps({k: v for k, v in summary.items() if k != "checks"}, indent=1))
for r in results:
    state = {"passed": "ok", "skipped": "SKIPPED"}.get(r["status"], "FAILED rc=%d" % r.get("rc", -1))
    print(f"{r['check']:28s} {state:>12s} {r['seconds']:7.1f} s")
sys.exit(0 if summary["passed"] else 1)
PY
STATUS=$?
rm -f "$RESULTS"  # its lines are device_check.json's "checks"
# Everything in one archive: the device tool brings back only a few files per call.
tar -czf "$OUT_ROOT/$RUN.tgz" -C "$OUT_ROOT" "$RUN"
echo "device_check: $OUT_ROOT/$RUN.tgz holds every log and JSON of this run; unpack it under" \
     "bench/ (bench/$RUN/) and commit it beside RESULTS.md" >&2
exit $STATUS
