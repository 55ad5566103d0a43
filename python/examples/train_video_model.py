#!/usr/bin/env python3
"""A video world model's training loop on 720p clips, its frames decoded on the GPU's NVDEC
engines in this process (conveyor.video.DeviceFrames) for the samples `conveyor serve` orders.

  conveyor synth --out /data/clips --preset video-model --episodes 48
  conveyor serve /data/clips --config examples/video_model_captions.yaml --listen 127.0.0.1:7070 &
  python python/examples/train_video_model.py --servers 127.0.0.1:7070 --dataset /data/clips

--frames picks where the frames come from:
  nvdec   (default) the server serves captions and sample ids (video_model_captions.yaml); a
          thread here decodes each batch's 49-frame clips on NVDEC into the device batch
          (video_model_nvdec.yaml: 256x256, uint8), --prefetch batches ahead. No frame passes
          through host memory.
  served  the server decodes the same clips on its CPU cores (video_model_served.yaml, the
          same frames) and Loader(device="cuda:N") copies each batch to the GPU: the baseline.

The model step (--model): a small video transformer of the kind video world models use. Clips
[B, 49, 256, 256, 3] uint8 are normalised on the GPU, cut into tubelets of 2x16x16 (24 x 256 =
6,144 tokens per clip), embedded, run through --depth pre-norm transformer layers of --width
(bf16 autocast, SDPA attention), and trained to reconstruct the tubelets (MSE) with AdamW.
`--model none` takes no step: the rate frames reach the device batch, the path's ceiling.

Printed and written to --json: clips/s and frames/s into the device batch, data wait (host time
waiting for the next batch) as a fraction of the run, the step time (CUDA events), per step.
"""

import argparse
import hashlib
import json
import queue
import sys
import threading
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import conveyor
from conveyor import video


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", required=True)
    p.add_argument("--dataset", help="the served dataset (--frames nvdec opens it too)")
    p.add_argument("--frames", choices=["nvdec", "served"], default="nvdec")
    p.add_argument("--config", default=None,
                   help="config sent to the server (default: examples/video_model_captions.yaml "
                        "for nvdec, examples/video_model_served.yaml for served)")
    p.add_argument("--frames-config", default=None,
                   help="DeviceFrames' config (default: examples/video_model_nvdec.yaml)")
    p.add_argument("--sessions", type=int, default=7, help="NVDEC sessions")
    p.add_argument("--prefetch", type=int, default=3, help="decoded batches ahead")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the summary")
    p.add_argument("--model", choices=["transformer", "none"], default="transformer")
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--heads", type=int, default=0, help="attention heads (default: width / 64)")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _example(name):
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    for root in (os.path.join(here, "..", "..", "examples"),
                 os.path.join(os.environ.get("CONVEYOR_SOURCE_DIR", ""), "examples")):
        path = os.path.join(root, name)
        if os.path.exists(path):
            return os.path.abspath(path)
    raise FileNotFoundError(f"examples/{name}: run from the repository or set CONVEYOR_SOURCE_DIR")


class VideoTransformer(nn.Module):
    """Tubelet embedding, pre-norm transformer layers, a linear head back to the tubelets."""

    def __init__(self, width, depth, heads, tubelet=(2, 16, 16)):
        super().__init__()
        self.tubelet = tubelet
        t, p, q = tubelet
        self.embed = nn.Conv3d(3, width, tubelet, stride=tubelet)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(width, 3 * t * p * q)
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1, 1))

    def forward(self, clips):  # uint8 [B, T, H, W, 3]
        t, p, q = self.tubelet
        x = clips[:, : clips.shape[1] // t * t].permute(0, 4, 1, 2, 3).float() / 255.0
        x = (x - self.mean) / self.std                                   # [B, 3, T, H, W]
        tokens = self.embed(x)                                           # [B, C, T', H', W']
        b, c, tt, hh, ww = tokens.shape
        y = self.head(self.encoder(tokens.flatten(2).transpose(1, 2)))  # [B, N, 3 t p q]
        target = x.reshape(b, 3, tt, t, hh, p, ww, q).permute(0, 2, 4, 6, 1, 3, 5, 7)
        return F.mse_loss(y.float(), target.reshape(b, tt * hh * ww, -1))


def batches_nvdec(args, out, stop):
    """The Loader's batches with their clips decoded on NVDEC, into `out` (bounded)."""
    frames = video.DeviceFrames(args.dataset, args.frames_config or _example("video_model_nvdec.yaml"),
                                device="cuda:0", sessions=args.sessions)
    loader = conveyor.Loader(servers=args.servers,
                             config=args.config or _example("video_model_captions.yaml"),
                             job="video_model_nvdec", max_batches=args.steps)
    try:
        batches = iter(loader)
        decoded_before = 0
        while not stop.is_set():
            # Where the producer's time goes, per batch (in the --json steps): waiting for the
            # server's batch, decoding its clips, and the pictures NVDEC decoded for them (the
            # rest came from the frame cache). A data wait with a slow producer says which.
            t0 = time.perf_counter()
            batch = next(batches, None)
            t1 = time.perf_counter()
            if batch is None:
                break
            clips = frames.decode(batch)
            t2 = time.perf_counter()
            decoded = frames.stats()["frames_decoded"]
            name = frames.tensors[0]["name"]
            timing = {"loader_s": t1 - t0, "decode_s": t2 - t1,
                      "pictures_decoded": decoded - decoded_before}
            decoded_before = decoded
            out.put((clips[name], clips[name + "_is_pad"], batch, timing))
        out.put(None)
    except BaseException as e:  # the trainer sees it
        out.put(e)
    finally:
        loader.close()
        stats = frames.stats()
        frames.close()
        out.put(("stats", stats))


def main(argv=None):
    args = parse_args(argv)
    if args.frames == "nvdec" and not args.dataset:
        sys.exit("--frames nvdec needs --dataset (the served dataset, opened here too)")
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda:0")
    model = None
    if args.model == "transformer":
        model = VideoTransformer(args.width, args.depth, args.heads or max(1, args.width // 64)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    stop = threading.Event()
    if args.frames == "nvdec":
        q = queue.Queue(maxsize=args.prefetch)
        worker = threading.Thread(target=batches_nvdec, args=(args, q, stop), daemon=True)
        worker.start()

        def next_clips():
            item = q.get()
            if isinstance(item, BaseException):
                raise item
            return item
    else:
        served = iter(conveyor.Loader(servers=args.servers,
                                      config=args.config or _example("video_model_served.yaml"),
                                      job="video_model_served", device="cuda:0",
                                      max_batches=args.steps, prefetch=args.prefetch))

        def next_clips():
            batch = next(served, None)
            if batch is None:
                return None
            return batch["cam0"], batch["cam0_is_pad"], batch, {}

    steps, pending = [], None
    ids_digest = hashlib.sha256()  # the samples in order: equal for both --frames sources
    t_run = None
    nvdec_stats = None
    for step in range(args.steps):
        t0 = time.perf_counter()
        item = next_clips()
        wait = time.perf_counter() - t0
        if item is None:
            break
        clips, pads, batch, timing = item
        queued = q.qsize() if args.frames == "nvdec" else None  # decoded batches still ahead
        ids_digest.update(np.ascontiguousarray(batch["_ids"], np.int64).tobytes())
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        loss = None
        if model is not None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(clips)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        end.record()
        if pending is not None:  # read the previous step's events: no sync on this one
            pending[2].synchronize()
            steps[-1]["step_ms"] = pending[1].elapsed_time(pending[2])
            if pending[3] is not None:
                steps[-1]["loss"] = float(pending[3])
        if step == args.warmup:
            torch.cuda.synchronize()
            t_run = time.perf_counter()
        steps.append({"step": step, "wait_s": wait, "clips": int(clips.shape[0]),
                      "frames": int(clips.shape[0] * clips.shape[1]),
                      # the host's flags (nvdec); served flags are on the device: no sync for them
                      "padded": int(pads.sum()) if isinstance(pads, np.ndarray) else None,
                      "queued": queued, **timing})
        pending = (step, start, end, loss.detach() if loss is not None else None)
    torch.cuda.synchronize()
    t_end = time.perf_counter()
    if pending is not None and steps:
        steps[-1]["step_ms"] = pending[1].elapsed_time(pending[2])
    stop.set()
    if args.frames == "nvdec":
        while True:  # drain: the worker's last items are its end and its stats
            item = q.get()
            if isinstance(item, tuple) and item and item[0] == "stats":
                nvdec_stats = item[1]
                break
    measured = steps[args.warmup:]
    if t_run is None or not measured:
        sys.exit(f"only {len(steps)} steps ran; need more than --warmup {args.warmup}")
    seconds = t_end - t_run
    # Steps after the warm-up: their waits fall inside [t_run, t_end].
    wait = sum(s["wait_s"] for s in measured[1:])
    clips = sum(s["clips"] for s in measured[1:])
    frames = sum(s["frames"] for s in measured[1:])
    step_ms = sorted(s["step_ms"] for s in measured if "step_ms" in s)

    def p50_max(key):  # the producer's per-batch seconds, in ms (nvdec)
        v = sorted(s[key] for s in measured if key in s)
        return [round(1000 * v[len(v) // 2], 2), round(1000 * v[-1], 2)] if v else None
    summary = {
        "frames_source": args.frames, "model": args.model, "width": args.width,
        "depth": args.depth, "steps": len(measured), "seconds": round(seconds, 3),
        "clips_per_s": round(clips / seconds, 2), "frames_per_s": round(frames / seconds, 1),
        "data_wait_fraction": round(wait / seconds, 4),
        "step_ms_p50": round(step_ms[len(step_ms) // 2], 2) if step_ms else None,
        "producer_loader_ms_p50_max": p50_max("loader_s"),
        "producer_decode_ms_p50_max": p50_max("decode_s"),
        "clip_shape": list(clips_shape(steps)), "gpu": torch.cuda.get_device_name(0),
        "ids_sha256": ids_digest.hexdigest()[:16],
        "nvdec": nvdec_stats,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "steps": steps}, f, indent=1)
    print(json.dumps(summary))


def clips_shape(steps):
    return (steps[0]["clips"], steps[0]["frames"] // max(1, steps[0]["clips"])) if steps else ()


if __name__ == "__main__":
    main()
