#!/usr/bin/env bash
# A bounded libFuzzer run of one fuzz target: `run_fuzz.sh FUZZER SECONDS`. The seeds depend on
# the target (its file name), each prefixed with the mode byte that target expects:
#   shard_index_fuzz: the shards of a tiny real dataset made by `conveyor synth` (when the CLI is
#     built), an empty index and an empty directory;
#   image_decoder_fuzz: small JPEGs (4:2:0, 4:4:4, grey, progressive) and PNGs (RGB, RGBA,
#     palette, 16-bit) made by ffmpeg and cjpeg.
#   video_decoder_fuzz: 12 frames of H.264 (B-frames), HEVC, VP9, AV1 and MJPEG packets made by
#     ffmpeg, behind the target's header (codec, packet count, GOP, output mode, packet sizes).
#   audio_decoder_fuzz: 0.2 s of AAC, Opus, FLAC, MP3 and PCM packets made by ffmpeg, each with
#     a header for a native-rate window and one for a 16 kHz mono window.
#   client_wire_fuzz: a stream start and a batch message (header, data, last), hand-encoded,
#     behind the slice-length byte.
#   dataset_fuzz: a tiny real dataset's manifest, episode table and shard, length-prefixed.
#   config_fuzz: the configs in examples/ and two low-dim configs for the target's own dataset.
#   tar_fuzz: small ustar, pax and GNU tars written by Python's tarfile.
#   rlds_fuzz: tiny RLDS datasets by tests/fixtures/rlds/make_rlds.py, length-prefixed as dataset_fuzz's.
#   webdataset_fuzz: WebDataset shards by Python's tarfile: an mp4 (ffmpeg), a JPEG, JSON, a caption,
#     a class label and .npy tensors of several dtypes and orders, and a shard of tensors alone.
#   parquet_fuzz: the committed seeds in tests/fuzz/seeds/parquet/ (nested lists, nulls, v1 and v2
#     pages, delta and byte-stream-split encodings, from parquet-wasm and hyparquet-writer), and
#     when npm is installed every fixture of
#     tests/parquet_test.cc under 64 KiB (tests/fixtures/parquet/make_fixtures.sh).
set -euo pipefail
FUZZER="$1"; SECONDS_BUDGET="${2:-60}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLI="${CONVEYOR_CLI:-$ROOT/build/tools/conveyor}"
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/corpus"
case "$(basename "$FUZZER")" in
  dataset_fuzz)
    # A tiny real dataset (state, action, audio off, one 32x32 camera) packed as the target reads
    # it: [u32 manifest length][manifest][u32 table length][table][shard].
    if [[ -x "$CLI" ]]; then
      "$CLI" synth --out "$WORK/ds" --episodes 2 --episode-seconds 1 --size 32x32 --cameras 1 \
        --audio-codec none --episodes-per-shard 2 --quiet
      /usr/bin/python3 - "$WORK/ds" "$WORK/corpus/synth" <<'PY'
import glob, struct, sys
d, out = sys.argv[1], sys.argv[2]
m = open(d + "/manifest.json", "rb").read()
t = open(d + "/episodes.bin", "rb").read()
s = open(sorted(glob.glob(d + "/shards/*.cvs"))[0], "rb").read()
open(out, "wb").write(struct.pack("<I", len(m)) + m + struct.pack("<I", len(t)) + t + s)
PY
    fi
    printf '\x02\x00\x00\x00{}\x00\x00\x00\x00' > "$WORK/corpus/empty"
    ;;
  config_fuzz)
    for f in "$ROOT"/examples/*.yaml; do cp "$f" "$WORK/corpus/"; done
    printf 'anchor: action\nstreams:\n  observation.state: {delta_timestamps: [-0.1, 0.0], normalize: mean_std}\n  action:\n    delta_timestamps: {start: 0.0, step: 0.02, count: 10}\n  instruction: {}\npipeline: {global_batch_size: 8, seed: 1}\n' \
      > "$WORK/corpus/lowdim.yaml"
    printf 'anchor: action\nstreams:\n  action: {delta_timestamps: [0.0]}\npipeline: {global_batch_size: 4, schedule: {mode: gop, block_steps: 5, window_blocks: 3}}\npacking: {max_tokens: 64}\n' \
      > "$WORK/corpus/packed.yaml"
    ;;
  client_wire_fuzz)
    printf '\x07\x0a\x07\x08\x01\x22\x03abc' > "$WORK/corpus/start"
    printf '\x03\x12\x08\x0a\x04\x08\x03\x10\x04\x38\x10\x22\x100123456789abcdef\x28\x01' \
      > "$WORK/corpus/batch"
    ;;
  tar_fuzz)
    # Small tars in each header dialect Python's tarfile writes (ustar, pax with a long name and
    # a non-ASCII one, GNU with a long name), with a directory entry and a zero-length member.
    /usr/bin/python3 - "$WORK/corpus" <<'PY'
import io, sys, tarfile
for fmt, name in ((tarfile.USTAR_FORMAT, "ustar"), (tarfile.PAX_FORMAT, "pax"), (tarfile.GNU_FORMAT, "gnu")):
    with tarfile.open(f"{sys.argv[1]}/{name}.tar", "w", format=fmt) as t:
        d = tarfile.TarInfo("clips"); d.type = tarfile.DIRTYPE; t.addfile(d)
        long = "clips/" + ("k" * 120 if fmt != tarfile.USTAR_FORMAT else "key0")
        for member, data in ((long + ".txt", b"a caption"), (long + ".json", b'{"fps": 24}'),
                             ("clips/empty.cls", b"")):
            i = tarfile.TarInfo(member); i.size = len(data); t.addfile(i, io.BytesIO(data))
        if fmt == tarfile.PAX_FORMAT:
            i = tarfile.TarInfo("clips/\u00e9t\u00e9.txt"); i.size = 2; t.addfile(i, io.BytesIO(b"ok"))
PY
    ;;
  rlds_fuzz)
    # Tiny RLDS datasets as the RLDS tools write them (tests/fixtures/rlds/make_rlds.py: tf.train
    # Example records through python3-protobuf, TFRecord framing, JPEGs by cjpeg): two episodes of
    # three steps with 8x8 cameras, and three of two with 16x16, each packed as the target reads it.
    for spec in "2 3 8" "3 2 16"; do
      set -- $spec
      /usr/bin/python3 "$ROOT/tests/fixtures/rlds/make_rlds.py" --bench "$1" "$2" "$3" 1 \
        "$WORK/rlds_$3" > /dev/null 2>&1 || { echo "fuzz: make_rlds.py failed" >&2; continue; }
      /usr/bin/python3 - "$WORK/rlds_$3" "$WORK/corpus/rlds_$3" <<'PY'
import glob, struct, sys
d, out = sys.argv[1], sys.argv[2]
info = open(d + "/dataset_info.json", "rb").read()
features = open(d + "/features.json", "rb").read()
shard = open(sorted(glob.glob(d + "/*.tfrecord-*"))[0], "rb").read()
open(out, "wb").write(struct.pack("<I", len(info)) + info + struct.pack("<I", len(features)) + features + shard)
PY
    done
    ;;
  webdataset_fuzz)
    # WebDataset shards as video2dataset and Cosmos-Curate write them (Python's tarfile, numpy):
    # samples of an mp4 (a second of 32x24 H.264 by ffmpeg, when it is installed) with a JPEG,
    # JSON metadata, a caption, a class label and .npy tensors (float16, float32, float64, int32,
    # bool, Fortran order, 0-d); and a shard of tensors alone whose shapes vary per sample.
    if command -v ffmpeg >/dev/null; then
      ffmpeg -hide_banner -loglevel error -nostdin -y -f lavfi -i testsrc2=size=32x24:rate=8 \
        -t 1 -c:v libx264 -g 4 -pix_fmt yuv420p "$WORK/clip.mp4"
      ffmpeg -hide_banner -loglevel error -nostdin -y -f lavfi -i testsrc2=size=16x12 \
        -frames:v 1 "$WORK/frame.jpg"
    fi
    /usr/bin/python3 - "$WORK" "$WORK/corpus" <<'PY'
import io, json, os, sys, tarfile
import numpy as np
work, out = sys.argv[1], sys.argv[2]
def npy(a):
    b = io.BytesIO(); np.save(b, a); return b.getvalue()
def write(name, samples):
    with tarfile.open(os.path.join(out, name), "w", format=tarfile.USTAR_FORMAT) as t:
        for key, members in samples:
            for ext, data in members:
                i = tarfile.TarInfo(f"{key}.{ext}"); i.size = len(data); t.addfile(i, io.BytesIO(data))
media = []
for ext, path in (("mp4", "clip.mp4"), ("jpg", "frame.jpg")):
    if os.path.exists(os.path.join(work, path)):
        media.append((ext, open(os.path.join(work, path), "rb").read()))
write("clips.tar", [(f"{k:05d}", media + [
    ("json", json.dumps({"duration": 1.0, "fps": 8, "caption": "a clip", "vec": [1, 2, 3]}).encode()),
    ("txt", b"a caption"), ("cls", str(k).encode()),
    ("t5.npy", npy((np.arange(12) / 8 + k).astype(np.float16).reshape(3, 4)))]) for k in range(2)])
write("tensors.tar", [
    ("a", [("f8.npy", npy(np.linspace(0, 1, 6).reshape(2, 3))), ("i4.npy", npy(np.arange(4, dtype=np.int32))),
           ("b.npy", npy(np.array([True, False]))), ("f.npy", npy(np.asfortranarray(np.ones((2, 3), np.float32)))),
           ("s.npy", npy(np.float32(2.5)))]),
    ("b", [("f8.npy", npy(np.zeros((4, 3)))), ("i4.npy", npy(np.arange(2, dtype=np.int32))),
           ("b.npy", npy(np.array([False]))), ("f.npy", npy(np.zeros((3, 2), np.float32))),
           ("s.npy", npy(np.float32(-1)))]),
])
PY
    ;;
  parquet_fuzz)
    cp "$ROOT"/tests/fuzz/seeds/parquet/*.parquet "$WORK/corpus/"
    if command -v npm >/dev/null && command -v node >/dev/null; then
      npm_dir="${CONVEYOR_PARQUET_NPM_DIR:-$(dirname "$FUZZER")/parquet_npm}"
      if bash "$ROOT/tests/fixtures/parquet/make_fixtures.sh" "$npm_dir" "$WORK/fixtures" >/dev/null; then
        find "$WORK/fixtures" -name '*.parquet' -size -64k -exec cp {} "$WORK/corpus/" \;
      else
        echo "fuzz: make_fixtures.sh failed; the committed seeds only" >&2
      fi
    fi
    ;;
  shard_index_fuzz)
    if [[ -x "$CLI" ]]; then
      "$CLI" synth --out "$WORK/ds" --episodes 2 --episode-seconds 1 --size 32x32 --cameras 1 \
        --episodes-per-shard 2 --quiet
      for s in "$WORK"/ds/shards/*.cvs; do
        { printf '\x00'; cat "$s"; } > "$WORK/corpus/$(basename "$s")"
      done
    fi
    printf '\x01' > "$WORK/corpus/empty_index"
    printf '\x02' > "$WORK/corpus/empty_dir"
    ;;
  image_decoder_fuzz)
    # First byte: even = JPEG, odd = PNG (the higher bits pick the minimum size of a scaled decode).
    ff() { ffmpeg -hide_banner -loglevel error -nostdin -y -f lavfi -i "testsrc2=size=$1" \
      -frames:v 1 "${@:3}" "$WORK/$2"; }
    ff 32x24 a420.jpg -pix_fmt yuvj420p
    ff 18x14 a444.jpg -pix_fmt yuvj444p
    ff 24x16 src.ppm -pix_fmt rgb24
    cjpeg -grayscale -outfile "$WORK/gray.jpg" "$WORK/src.ppm"
    cjpeg -progressive -outfile "$WORK/progressive.jpg" "$WORK/src.ppm"
    ff 16x16 rgb.png -pix_fmt rgb24
    ff 20x12 rgba.png -pix_fmt rgba
    ff 16x8 pal8.png -pix_fmt pal8
    ff 12x10 rgb48.png -pix_fmt rgb48be
    for f in "$WORK"/*.jpg; do { printf '\x12'; cat "$f"; } > "$WORK/corpus/$(basename "$f")"; done
    for f in "$WORK"/*.png; do { printf '\x13'; cat "$f"; } > "$WORK/corpus/$(basename "$f")"; done
    ;;
  audio_decoder_fuzz)
    # The target's header (codec, window start, window shape, priming, packet count), then the
    # packet sizes (u16 LE) and the packets, as ffmpeg demuxes them from a file it encoded.
    hex() { printf "\\x$(printf %02x "$1")"; }
    af() {  # af CODEC_BYTE PRIMING_FRAMES NAME RATE ENCODER_ARGS...
      local name="$3" sizes s
      ffmpeg -hide_banner -loglevel error -nostdin -y -f lavfi \
        -i "aevalsrc=0.5*sin(2*PI*(200+400*t)*t)|0.4*sin(2*PI*300*t):s=$4:d=0.2" "${@:5}" \
        "$WORK/$name"
      ffmpeg -hide_banner -loglevel error -nostdin -y -i "$WORK/$name" -map 0:a -c copy \
        -f data "$WORK/$name.packets"
      mapfile -t sizes < <(ffprobe -v error -select_streams a:0 -show_entries packet=size \
        -of default=noprint_wrappers=1:nokey=1 "$WORK/$name")
      for shape in 4 76; do  # 4800 samples at the stream rate; 4800 at 16 kHz mono
        { hex "$1"; hex 68; hex "$shape"; hex "$2"; hex "${#sizes[@]}"
          for s in "${sizes[@]}"; do hex $((s & 255)); hex $((s >> 8)); done
          cat "$WORK/$name.packets"; } > "$WORK/corpus/$name.$shape"
      done
    }
    af 0 1 aac.m4a 44100 -c:a aac -b:a 96k
    af 1 0 opus.ogg 48000 -c:a libopus -b:a 64k
    af 2 0 flac.flac 44100 -c:a flac -frame_size 4096 -sample_fmt s16
    af 3 1 mp3.mp3 44100 -c:a libmp3lame -b:a 96k
    af 4 0 pcm.wav 44100 -c:a pcm_s16le
    ;;
  video_decoder_fuzz)
    hex() { printf "\\x$(printf %02x "$1")"; }
    vf() {  # vf CODEC_BYTE GOP NAME ENCODER_ARGS...
      local name="$3" sizes s
      ffmpeg -hide_banner -loglevel error -nostdin -y -f lavfi -i "testsrc2=size=64x48:rate=10" \
        -frames:v 12 "${@:4}" "$WORK/$name"
      ffmpeg -hide_banner -loglevel error -nostdin -y -i "$WORK/$name" -map 0:v -c copy \
        -f data "$WORK/$name.packets"
      mapfile -t sizes < <(ffprobe -v error -select_streams v:0 -show_entries packet=size \
        -of default=noprint_wrappers=1:nokey=1 "$WORK/$name")
      for mode in 0 3; do  # native size; resized and rotated
        { hex "$1"; hex "${#sizes[@]}"; hex "$2"; hex "$mode"
          for s in "${sizes[@]}"; do hex $((s & 255)); hex $((s >> 8)); done
          cat "$WORK/$name.packets"; } > "$WORK/corpus/$name.$mode"
      done
    }
    vf 0 6 h264.h264 -c:v libx264 -g 6 -bf 2 -bsf:v h264_mp4toannexb -f h264
    vf 1 6 hevc.hevc -c:v libx265 -x265-params log-level=error:keyint=6 -f hevc
    vf 2 6 vp9.webm -c:v libvpx-vp9 -deadline realtime -cpu-used 8 -g 6
    vf 3 6 av1.mkv -c:v libaom-av1 -cpu-used 8 -g 6
    vf 4 1 mjpeg.mkv -c:v mjpeg -pix_fmt yuvj420p
    ;;
esac
# Inputs that once failed stay in the corpus:
# tests/fuzz/regressions/<video|audio|image|shard|parquet|webdataset|rlds>_*.
prefix="$(basename "$FUZZER")"; prefix="${prefix%%_*}"
for f in "$ROOT"/tests/fuzz/regressions/"$prefix"_*; do
  if [[ -f "$f" ]]; then cp "$f" "$WORK/corpus/"; fi
done
echo "fuzz: $(basename "$FUZZER") for ${SECONDS_BUDGET}s"
"$FUZZER" -seed="${FUZZ_SEED:-1}" -max_total_time="$SECONDS_BUDGET" -rss_limit_mb=2048 -max_len=65536 \
  -print_final_stats=1 "$WORK/corpus" 2>&1 | tail -n 12
