#!/usr/bin/python3
"""Peer comparison: a LeRobot-style PyTorch loader against Conveyor, same dataset, same cores.

The peer is what robot-learning users run today: a map-style `torch.utils.data.Dataset` whose
`__getitem__(i)` turns sample i into (episode, anchor time) and, for every camera, opens the
episode's MP4 with PyAV, seeks back to the keyframe before the first requested time, decodes
forward to the last one, converts every decoded frame to RGB and keeps the nearest frames within
the tolerance: LeRobot's `decode_video_frames_torchvision` with its `pyav` backend
(lerobot/common/datasets/video_utils.py, which goes through torchvision's VideoReader), written
directly against PyAV (torchvision is not installed here; the calls are the ones VideoReader's
pyav path makes). It runs inside `torch.utils.data.DataLoader(batch_size=32, shuffle=True,
num_workers=W)`.

Conveyor runs on the same dataset and cores: `conveyor batches` (offline pipeline, 1 and 2
threads, `--schedule naive|gop`) and `conveyor serve` + `conveyor.Loader` (served, 2 threads).
Every row is a steady-state rate: batches after the warm-up ones, timed as they arrive.

  PYTHONPATH=build/python /usr/bin/python3 bench/peers/lerobot_style.py --cli build/tools/conveyor \
      --dataset /tmp/peer_ds --work /tmp/peer_ds.export --json bench/out/peer_bench.json \
      --plot bench/peers/peer_bench.png

bench/peers/run.sh makes the dataset and runs this; bench/peers/README.md explains the choices.
"""

import argparse
import gc
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import torch
    import torch.utils.data
except ImportError:  # pragma: no cover
    sys.exit("lerobot_style.py: needs torch (Debian: python3-torch)")
try:
    import av
except ImportError:  # pragma: no cover
    sys.exit("lerobot_style.py: needs PyAV (Debian: python3-av)")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PEER_SPEC = os.path.join(HERE, "peer.yaml")
FULL_SPEC = os.path.join(REPO, "examples", "pipeline.yaml")

# The sample spec both sides use (bench/peers/peer.yaml; examples/pipeline.yaml's cameras, state
# and action chunk).
CAMERAS = ["cam0", "cam1", "cam2"]
FRAME_DELTAS = [-0.1, 0.0]
STATE_DELTAS = [0.0]
ACTION_DELTAS = [round(0.02 * k, 10) for k in range(50)]
EPS = 1e-8  # LeRobot's (and Conveyor's) normalization epsilon


def load_peer_spec(path):
    """Takes the cameras and the deltas from a Conveyor config of the peer's shape (every stream
    but observation.state and action a camera, all cameras with the same frame deltas; state at
    [0.0]; actions as {start, step, count}), so the peer and Conveyor do the same work on another
    dataset (bench/lerobot_bench.sh runs it on a LeRobot dataset's import)."""
    global PEER_SPEC, CAMERAS, FRAME_DELTAS, STATE_DELTAS, ACTION_DELTAS
    import yaml
    with open(path) as f:
        streams = yaml.safe_load(f)["streams"]
    cams = [k for k in streams if k not in ("observation.state", "action")]
    deltas = {tuple(streams[c]["delta_timestamps"]) for c in cams}
    if not cams or len(deltas) != 1:
        sys.exit(f"lerobot_style.py: {path}: the cameras need one list of frame deltas")
    a = streams["action"]["delta_timestamps"]
    PEER_SPEC, CAMERAS, FRAME_DELTAS = path, cams, list(deltas.pop())
    STATE_DELTAS = list(streams["observation.state"]["delta_timestamps"])
    ACTION_DELTAS = [round(a["start"] + a["step"] * k, 10) for k in range(a["count"])]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The dataset in a LeRobot-like layout: one MP4 per episode and camera, low-dim arrays per episode
# ---------------------------------------------------------------------------------------------

def export_dataset(cli, dataset, work):
    """`conveyor extract` every camera (the coded packets remuxed to MP4, nothing re-encoded) and
    the low-dim streams of every episode, plus the manifest statistics, into `work`."""
    meta_path = os.path.join(work, "meta.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("dataset") == os.path.abspath(dataset):
            return meta
    info = json.loads(subprocess.run([cli, "inspect", dataset, "--json"], check=True,
                                     capture_output=True, text=True).stdout)
    streams = {s["name"]: s for s in info["streams"]}
    for cam in CAMERAS:
        if streams.get(cam, {}).get("kind") != "video":
            sys.exit(f"lerobot_style.py: dataset {dataset} has no video stream {cam}")
    os.makedirs(work, exist_ok=True)
    t0 = time.monotonic()
    for ep in range(info["episodes"]):
        for name in CAMERAS + ["observation.state", "action"]:
            ext = "mp4" if name in CAMERAS else "npy"
            out = os.path.join(work, "episode_%06d" % ep, f"{name}.{ext}")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            subprocess.run([cli, "extract", dataset, "--episode", str(ep), "--stream", name,
                            "--out", out], check=True, capture_output=True)
    meta = {
        "dataset": os.path.abspath(dataset),
        "fingerprint": info["fingerprint"],
        "episodes": info["episodes"],
        "rates": {n: s["rate"] for n, s in streams.items()},
        "stats": info["stats"],
    }
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    log(f"exported {info['episodes']} episodes x {len(CAMERAS)} cameras to {work} "
        f"in {time.monotonic() - t0:.1f} s")
    return meta


def decode_video_frames_pyav(video_path, timestamps, tolerance_s, single_thread=False):
    """LeRobot's decode_video_frames_torchvision with backend="pyav", as torchvision's
    VideoReader runs it: seek(first_ts, keyframes_only=True) is container.seek(offset,
    backward=True, any_frame=False, stream=...), then every decoded frame is converted to RGB
    (`frame.to_rgb().to_ndarray()`) until one at or after the last requested time; the nearest
    loaded frame is taken for each time and must lie within the tolerance. Returns the frames
    (uint8 [T, H, W, 3]; LeRobot then permutes to CHW and divides by 255) and how many frames
    were decoded."""
    first_ts, last_ts = min(timestamps), max(timestamps)
    container = av.open(video_path)
    try:
        stream = container.streams.video[0]
        if single_thread:  # not LeRobot's default (FFmpeg's slice threads, thread_count 0)
            stream.thread_type = "NONE"
            stream.codec_context.thread_count = 1
        offset = int(round(max(first_ts, 0.0) / stream.time_base))
        container.seek(offset, backward=True, any_frame=False, stream=stream)
        loaded_frames, loaded_ts = [], []
        for frame in container.decode(stream):
            current_ts = float(frame.pts * frame.time_base)
            loaded_frames.append(frame.to_rgb().to_ndarray())
            loaded_ts.append(current_ts)
            if current_ts >= last_ts:
                break
    finally:
        container.close()
    query = np.asarray(timestamps, dtype=np.float64)
    dist = np.abs(query[:, None] - np.asarray(loaded_ts)[None, :])
    argmin = dist.argmin(1)  # ties: the first (earlier) frame, as torch's min does here
    min_ = dist[np.arange(len(query)), argmin]
    if not (min_ < tolerance_s).all():
        raise AssertionError(
            f"{video_path}: query timestamps {timestamps} violate the tolerance {tolerance_s} "
            f"(nearest loaded {[loaded_ts[k] for k in argmin]})")
    return np.stack([loaded_frames[k] for k in argmin]), len(loaded_frames)


class LeRobotStyleDataset(torch.utils.data.Dataset):
    """Sample i = anchor step i of the action stream over all episodes in order (LeRobot's global
    frame index; Conveyor's sample index). Frames at t + [-0.1, 0] per camera, state at t, actions
    at t + 0.00 .. 0.98, LeRobot's padding (clamp to the episode, flag `_is_pad`) and
    normalization formulas (state mean_std, action min_max, from the manifest statistics)."""

    def __init__(self, work, meta, single_thread=False):
        self.work = work
        self.single_thread = single_thread
        self.lowdim_rate = meta["rates"]["action"]
        self.fps = {cam: meta["rates"][cam] for cam in CAMERAS}
        # Conveyor's default tolerance (half a frame period plus 1 us): actions at 50 Hz and
        # cameras at 30 fps put most anchor times between frames. LeRobot's 1e-4 s assumes one
        # rate for every stream and would refuse these samples.
        self.tolerance = {cam: 0.5 / self.fps[cam] + 1e-6 for cam in CAMERAS}
        self.state, self.action, self.last_frame_ts = [], [], []
        for ep in range(meta["episodes"]):
            d = os.path.join(work, "episode_%06d" % ep)
            # In memory: generous to the peer (LeRobot reads a memory-mapped Arrow table through
            # hf_dataset.select, which costs more per sample than numpy indexing).
            self.state.append(np.load(os.path.join(d, "observation.state.npy")).astype(np.float32))
            self.action.append(np.load(os.path.join(d, "action.npy")).astype(np.float32))
            last = {}
            for cam in CAMERAS:  # the episode's last frame time (LeRobot: from its metadata)
                with av.open(os.path.join(d, f"{cam}.mp4")) as c:
                    s = c.streams.video[0]
                    last[cam] = float(max(p.pts for p in c.demux(s) if p.pts is not None)
                                      * s.time_base)
            self.last_frame_ts.append(last)
        lengths = np.array([len(a) for a in self.action])
        self.ep_start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        self.ep_len = lengths
        self.n = int(lengths.sum())
        st = meta["stats"]
        self.s_mean = np.asarray(st["observation.state"]["mean"], np.float32)
        self.s_std = np.asarray(st["observation.state"]["std"], np.float32)
        self.a_min = np.asarray(st["action"]["min"], np.float32)
        self.a_max = np.asarray(st["action"]["max"], np.float32)

    def __len__(self):
        return self.n

    def locate(self, i):
        ep = int(np.searchsorted(self.ep_start, i, side="right") - 1)
        return ep, int(i - self.ep_start[ep])

    def __getitem__(self, i):
        ep, step = self.locate(i)
        t = step / self.lowdim_rate
        item = {"index": torch.tensor(i), "episode": torch.tensor(ep), "step": torch.tensor(step)}
        decoded = 0
        d = os.path.join(self.work, "episode_%06d" % ep)
        for cam in CAMERAS:
            tol, last = self.tolerance[cam], self.last_frame_ts[ep][cam]
            query, pad = [], []
            for delta in FRAME_DELTAS:
                q = t + delta
                pad.append(q < -tol or q > last + tol)
                query.append(min(max(q, 0.0), last))
            frames, n = decode_video_frames_pyav(os.path.join(d, f"{cam}.mp4"), query, tol,
                                                 self.single_thread)
            decoded += n
            item[cam] = torch.from_numpy(frames)
            item[f"{cam}_is_pad"] = torch.tensor(pad)
        n_steps = self.ep_len[ep]
        for name, deltas, data in (("observation.state", STATE_DELTAS, self.state[ep]),
                                   ("action", ACTION_DELTAS, self.action[ep])):
            idx = np.array([step + int(round(dt * self.lowdim_rate)) for dt in deltas])
            pad = (idx < 0) | (idx >= n_steps)
            x = data[np.clip(idx, 0, n_steps - 1)]
            if name == "observation.state":
                x = (x - self.s_mean) / (self.s_std + EPS)
            else:
                x = 2 * (x - self.a_min) / (self.a_max - self.a_min + EPS) - 1
            item[name] = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
            item[f"{name}_is_pad"] = torch.from_numpy(pad)
        item["decoded_frames"] = torch.tensor(decoded)
        return item


def live_threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def bench_peer(ds, workers, batches, warmup, seed):
    # PyAV containers end up in reference cycles, so the codec contexts of the last ~100 closed
    # containers (each with FFmpeg's slice threads: thread_count 0 = auto) stay alive until the
    # cyclic GC runs. A DataLoader worker forked then inherits them without their threads; when
    # the worker's GC frees one, avcodec_close joins a pthread_t that glibc has since reused for
    # a thread of the worker's own, and the worker hangs for ever (seen here: FFmpeg 5.1, PyAV
    # 10). Any main process that decoded before forking its workers can hit this; collect first.
    threads_before = live_threads()
    gc.collect()
    g = torch.Generator()
    g.manual_seed(seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=workers,
                                         generator=g, drop_last=True,
                                         timeout=300 if workers else 0)
    times, decoded, shapes = [], 0, None
    t_start = time.monotonic()
    it = iter(loader)
    for b in range(warmup + batches):
        batch = next(it)
        times.append(time.monotonic())
        if b >= warmup:
            decoded += int(batch["decoded_frames"].sum())
        if shapes is None:
            shapes = {k: list(v.shape) for k, v in batch.items()}
    del it
    span = times[-1] - times[warmup - 1] if warmup else times[-1] - t_start
    samples = 32 * batches
    return {
        "loader": "LeRobot-style (PyAV, DataLoader)", "spec": "peer", "schedule": "shuffle",
        "workers": workers, "batches": batches, "warmup_batches": warmup, "seconds": span,
        "samples_per_s": samples / span,
        "delivered_frames_per_s": samples * len(CAMERAS) * len(FRAME_DELTAS) / span,
        "decoded_frames_per_s": decoded / span,
        "amplification": decoded / (samples * len(CAMERAS) * len(FRAME_DELTAS)),
        "total_seconds": times[-1] - t_start, "batch_shapes": shapes,
        "main_threads_before_gc": threads_before,
        "pyav_threads": "1" if ds.single_thread else "auto (FFmpeg slice threads)",
    }


# ---------------------------------------------------------------------------------------------
# Conveyor
# ---------------------------------------------------------------------------------------------

STATS_RE = re.compile(r"stats: (\d+) batches, (\d+) samples .* = ([\d.]+) samples/s")
VIDEO_RE = re.compile(r"video: (\d+) frames decoded for (\d+) delivered")


def bench_batches(cli, dataset, spec, threads, schedule, steps, warmup):
    """`conveyor batches --stats`, each batch line timed as it arrives (the CLI flushes a line per
    batch), so the rate excludes start-up like the peer's."""
    cmd = [cli, "batches", dataset, "--config", spec, "--steps", str(steps), "--threads",
           str(threads), "--schedule", schedule, "--stats"]
    t_start = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    times, tail = [], []
    for line in p.stdout:
        if re.match(r"\d+:\d+ consumer", line):
            times.append(time.monotonic())
        else:
            tail.append(line)
    if p.wait() != 0 or len(times) != steps:
        sys.exit(f"lerobot_style.py: {' '.join(cmd)} failed:\n{''.join(tail)}")
    text = "".join(tail)
    m, v = STATS_RE.search(text), VIDEO_RE.search(text)
    span = times[-1] - times[warmup - 1]
    samples = 32 * (steps - warmup)
    amp = int(v.group(1)) / int(v.group(2)) if v else None
    return {
        "loader": "conveyor batches (offline)", "spec": os.path.splitext(os.path.basename(spec))[0],
        "schedule": schedule, "threads": threads, "batches": steps - warmup,
        "warmup_batches": warmup, "seconds": span, "samples_per_s": samples / span,
        "delivered_frames_per_s": samples * len(CAMERAS) * len(FRAME_DELTAS) / span,
        "decoded_frames_per_s": amp * samples * 6 / span if amp else None,
        "amplification": amp, "cli_stats_samples_per_s": float(m.group(3)) if m else None,
        "total_seconds": times[-1] - t_start, "command": " ".join(cmd),
    }


def bench_served(cli, dataset, spec_paths, threads, steps, warmup):
    """`conveyor serve` (its own process, `--threads` decode workers per stream) read by
    `conveyor.Loader` in this process, one config at a time."""
    try:
        import conveyor
    except ImportError:
        log("lerobot_style.py: the conveyor Python module is not importable "
            "(PYTHONPATH=build/python); skipping the served rows")
        return []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ready = os.path.join(tmp, "ready")
        cmd = [cli, "serve", dataset, "--threads", str(threads), "--listen", "127.0.0.1:0",
               "--ready-file", ready]
        for s in spec_paths:
            cmd += ["--config", s]
        server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                  stderr=open(os.path.join(tmp, "serve.log"), "w"))
        try:
            deadline = time.monotonic() + 60
            while not (os.path.exists(ready) and open(ready).read().strip()):
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit("lerobot_style.py: conveyor serve did not start:\n"
                             + open(os.path.join(tmp, "serve.log")).read())
                time.sleep(0.05)
            addr = open(ready).read().strip()
            for s in spec_paths:
                name = os.path.splitext(os.path.basename(s))[0]
                loader = conveyor.Loader(servers=[addr], config_name=name, max_batches=steps)
                times, t_start, n = [], time.monotonic(), 0
                for batch in loader:
                    frames = torch.from_numpy(batch[CAMERAS[0]])  # what a trainer does: no copy
                    assert tuple(frames.shape) == (32, 2, 224, 224, 3), frames.shape
                    times.append(time.monotonic())
                    n += 1
                loader.close()
                if n != steps:
                    sys.exit(f"lerobot_style.py: served {n} of {steps} batches")
                span = times[-1] - times[warmup - 1]
                samples = 32 * (steps - warmup)
                rows.append({
                    "loader": "conveyor serve + conveyor.Loader", "spec": name, "schedule": "gop",
                    "threads": threads, "batches": steps - warmup, "warmup_batches": warmup,
                    "seconds": span, "samples_per_s": samples / span,
                    "delivered_frames_per_s": samples * 6 / span, "decoded_frames_per_s": None,
                    "amplification": None, "total_seconds": times[-1] - t_start,
                    "command": " ".join(cmd),
                })
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    return rows


# ---------------------------------------------------------------------------------------------
# Correctness: the peer's samples against `conveyor sample` for the same indices
# ---------------------------------------------------------------------------------------------

def check_samples(cli, dataset, ds, indices):
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([cli, "sample", dataset, "--config", PEER_SPEC, "--indices",
                        ",".join(map(str, indices)), "--out", tmp, "--quiet"], check=True)
        results = []
        for k, i in enumerate(indices):
            d = os.path.join(tmp, "%06d" % k)
            with open(os.path.join(d, "meta.json")) as f:
                meta = json.load(f)
            mine = ds[i]
            r = {"index": i, "episode": meta["episode"], "step": meta["anchor_step"],
                 "anchor_time_s": meta["anchor_time_s"],
                 "same_episode_step": (int(mine["episode"]), int(mine["step"]))
                 == (meta["episode"], meta["anchor_step"])}
            frame_diff, frames_equal, pads_equal, lowdim_diff = 0, True, True, 0.0
            for name in CAMERAS + ["observation.state", "action"]:
                ref = np.load(os.path.join(d, f"{name}.npy"))
                got = mine[name].numpy()
                if ref.shape != got.shape:
                    raise AssertionError(f"sample {i} {name}: shape {got.shape} vs {ref.shape}")
                diff = np.abs(ref.astype(np.float64) - got.astype(np.float64)).max()
                if name in CAMERAS:
                    frame_diff = max(frame_diff, int(diff))
                    frames_equal &= bool(np.array_equal(ref, got))
                else:
                    lowdim_diff = max(lowdim_diff, float(diff))
                pads_equal &= bool(np.array_equal(
                    np.load(os.path.join(d, f"{name}_is_pad.npy")), mine[f"{name}_is_pad"].numpy()))
            r.update(frames_bit_identical=frames_equal, frames_max_abs_diff=frame_diff,
                     lowdim_max_abs_diff=lowdim_diff, is_pad_equal=pads_equal)
            results.append(r)
    return results


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def fmt(x, digits=1):
    return "-" if x is None else f"{x:,.{digits}f}"


def table(rows):
    best_peer = max(r["samples_per_s"] for r in rows if r["spec"] == "peer" and "workers" in r)
    lines = ["| loader | spec | schedule | workers / threads | samples/s | frames/s delivered "
             "| frames/s decoded | amplification | x best peer |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        r["ratio_to_best_peer"] = r["samples_per_s"] / best_peer
        wt = f"{r['workers']} workers" if "workers" in r else f"{r['threads']} threads"
        lines.append(f"| {r['loader']} | {r['spec']} | {r['schedule']} | {wt} | "
                     f"{fmt(r['samples_per_s'])} | {fmt(r['delivered_frames_per_s'], 0)} | "
                     f"{fmt(r['decoded_frames_per_s'], 0)} | {fmt(r['amplification'], 2)} | "
                     f"{r['ratio_to_best_peer']:.1f}x |")
    return "\n".join(lines), best_peer


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels, values, colors = [], [], []
    for r in rows:
        wt = f"W={r['workers']}" if "workers" in r else f"T={r['threads']}"
        if "workers" in r:
            labels.append(f"LeRobot-style PyAV {wt}")
            colors.append("#999999")
        else:
            kind = "served" if "serve" in r["loader"] else "batches"
            labels.append(f"Conveyor {kind} {r['schedule']} {wt} [{r['spec']}]")
            colors.append("#1f77b4" if r["schedule"] == "gop" else "#7fb3d5")
        values.append(r["samples_per_s"])
    fig, ax = plt.subplots(figsize=(8, 0.38 * len(rows) + 1.2))
    y = np.arange(len(rows))[::-1]
    ax.barh(y, values, color=colors)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("samples/s (log scale; 3 cameras x 2 frames 224x224 H.264 GOP 30, "
                  "state, 50-step actions)", fontsize=8)
    for yy, v in zip(y, values):
        ax.text(v * 1.05, yy, f"{v:,.0f}", va="center", fontsize=7)
    ax.set_xlim(min(values) / 2, max(values) * 3)
    ax.set_title("Shuffled batches of 32 on the same 2 cores", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def machine_info():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus_usable": len(os.sched_getaffinity(0)), "nproc": os.cpu_count(), "cpu": model,
            "loadavg": os.getloadavg(), "python": platform.python_version(),
            "torch": torch.__version__, "pyav": av.__version__,
            "ffmpeg_libs": {k: ".".join(map(str, v)) for k, v in av.library_versions.items()
                            if k in ("libavcodec", "libavformat", "libswscale")}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default=os.path.join(REPO, "build", "tools", "conveyor"))
    ap.add_argument("--dataset", required=True, help="a dataset made by `conveyor synth`")
    ap.add_argument("--work", help="where the exported MP4s and .npy go (default: DATASET.export)")
    ap.add_argument("--workers", default="0,1,2", help="DataLoader num_workers values")
    ap.add_argument("--threads", default="1,2", help="conveyor batches worker threads")
    ap.add_argument("--serve-threads", type=int, default=2)
    ap.add_argument("--batches", type=int, default=30, help="peer batches timed")
    ap.add_argument("--warmup", type=int, default=2, help="batches before timing starts (all rows)")
    ap.add_argument("--gop-steps", type=int, default=160,
                    help="batches per gop row (several 850-sample windows)")
    ap.add_argument("--naive-steps", type=int, default=32, help="batches per naive row")
    ap.add_argument("--pyav-single-thread", action="store_true",
                    help="peer decoders without FFmpeg's slice threads (LeRobot keeps PyAV's "
                         "default, thread_count 0 = auto)")
    ap.add_argument("--specs", default="peer,pipeline",
                    help="Conveyor configs: peer (bench/peers/peer.yaml: the peer's tensors) "
                         "and/or pipeline (examples/pipeline.yaml: + audio window + instruction)")
    ap.add_argument("--peer-spec", default=PEER_SPEC,
                    help="the config both sides use (cameras, frame deltas, action chunk); "
                         "default bench/peers/peer.yaml")
    ap.add_argument("--check", default="0,999,1234,4321,7777",
                    help="sample indices to compare with `conveyor sample` ('' to skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="write a PNG bar chart here")
    args = ap.parse_args()
    if os.path.abspath(args.peer_spec) != PEER_SPEC:
        load_peer_spec(os.path.abspath(args.peer_spec))

    cli = os.path.abspath(args.cli)
    dataset = os.path.abspath(args.dataset)
    work = os.path.abspath(args.work or dataset.rstrip("/") + ".export")
    specs = {"peer": PEER_SPEC, "pipeline": FULL_SPEC}  # PEER_SPEC as --peer-spec set it
    spec_list = [specs[s] for s in args.specs.split(",") if s]
    t_all = time.monotonic()
    machine = machine_info()
    log(f"machine: {machine['cpus_usable']} usable cores of {machine['nproc']} ({machine['cpu']}), "
        f"load average {machine['loadavg'][0]:.2f}")

    meta = export_dataset(cli, dataset, work)
    ds = LeRobotStyleDataset(work, meta, args.pyav_single_thread)
    log(f"peer dataset: {len(ds)} samples over {meta['episodes']} episodes")

    checks = []
    if args.check:
        checks = check_samples(cli, dataset, ds, [int(x) for x in args.check.split(",")])
        for c in checks:
            log(f"check sample {c['index']} (episode {c['episode']} step {c['step']}): frames "
                f"{'bit-identical' if c['frames_bit_identical'] else 'max abs diff %d' % c['frames_max_abs_diff']}"
                f", low-dim max abs diff {c['lowdim_max_abs_diff']:.2g}, is_pad "
                f"{'equal' if c['is_pad_equal'] else 'DIFFER'}, same episode/step "
                f"{c['same_episode_step']}")

    rows = []
    for w in [int(x) for x in args.workers.split(",") if x != ""]:
        log(f"peer: DataLoader num_workers={w} ...")
        rows.append(bench_peer(ds, w, args.batches, args.warmup, args.seed))
        log(f"  {rows[-1]['samples_per_s']:.1f} samples/s")
    for spec in spec_list:
        for schedule, steps in (("gop", args.gop_steps), ("naive", args.naive_steps)):
            for t in [int(x) for x in args.threads.split(",") if x]:
                log(f"conveyor batches {os.path.basename(spec)} --schedule {schedule} "
                    f"--threads {t} --steps {steps} ...")
                rows.append(bench_batches(cli, dataset, spec, t, schedule, steps, args.warmup))
                log(f"  {rows[-1]['samples_per_s']:.1f} samples/s")
    if args.serve_threads > 0 and spec_list:
        log(f"conveyor serve --threads {args.serve_threads} + conveyor.Loader, "
            f"{args.gop_steps} batches per config ...")
        rows += bench_served(cli, dataset, spec_list, args.serve_threads, args.gop_steps,
                             args.warmup)

    text, best_peer = table(rows)
    conveyor_rows = [r for r in rows if "workers" not in r]
    verdict = {}
    if conveyor_rows:
        def best(pred):
            c = [r for r in conveyor_rows if pred(r)]
            return max(c, key=lambda r: r["samples_per_s"]) if c else None
        for key, pred in (("best_conveyor", lambda r: True),
                          ("best_conveyor_gop_same_spec", lambda r: r["schedule"] == "gop"
                           and r["spec"] == "peer"),
                          ("best_conveyor_served_same_spec", lambda r: "serve" in r["loader"]
                           and r["spec"] == "peer"),
                          ("best_conveyor_naive_same_spec", lambda r: r["schedule"] == "naive"
                           and r["spec"] == "peer")):
            b = best(pred)
            if b:
                verdict[key] = {"row": f"{b['loader']} {b['spec']} {b['schedule']} "
                                       f"{b.get('threads')} threads",
                                "samples_per_s": b["samples_per_s"],
                                "ratio": b["samples_per_s"] / best_peer,
                                "goal_10x_met": b["samples_per_s"] >= 10 * best_peer}
    machine["loadavg_after"] = os.getloadavg()
    print(text)
    print(f"\nbest peer: {best_peer:.1f} samples/s")
    for k, v in verdict.items():
        print(f"{k}: {v['row']}: {v['samples_per_s']:.1f} samples/s = {v['ratio']:.1f}x the best "
              f"peer; goal >= 10x {'met' if v['goal_10x_met'] else 'NOT met'}")
    if checks:
        ok = all(c["frames_bit_identical"] for c in checks)
        print(f"frames of samples {args.check} vs `conveyor sample`: "
              f"{'bit-identical' if ok else 'max abs diff %d' % max(c['frames_max_abs_diff'] for c in checks)}"
              f"; low-dim max abs diff {max(c['lowdim_max_abs_diff'] for c in checks):.2g}; "
              f"is_pad {'equal' if all(c['is_pad_equal'] for c in checks) else 'DIFFER'}")
    print(f"machine: {machine['cpus_usable']} cores ({machine['cpu']}), load average "
          f"{machine['loadavg'][0]:.2f} before, {machine['loadavg_after'][0]:.2f} after; "
          f"total {time.monotonic() - t_all:.0f} s")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "dataset": dataset, "fingerprint": meta["fingerprint"],
                       "rows": rows, "best_peer_samples_per_s": best_peer, "verdict": verdict,
                       "checks": checks, "table_markdown": text}, f, indent=1)
        log(f"wrote {args.json}")
    if args.plot:
        plot(rows, args.plot)
        log(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
