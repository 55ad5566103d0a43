#!/usr/bin/env python3
"""A vision policy trained with PyTorch DistributedDataParallel on the GPU, fed by Conveyor.

Per camera a ResNet-18-shaped convnet (BasicBlocks [2, 2, 2, 2] at widths 64..512, scaled by
--width), the features of all cameras and the state through an MLP head predicting the action
chunk; bf16 autocast on the GPU, AdamW, masked MSE over the non-padded actions. Augmentation runs
on the GPU (a random crop per sample and normalisation), as ACT's does once moved there.

Batches come from `conveyor serve` with Loader(device="cuda:N"): the C++ client copies each batch
to the GPU as it arrives and the tensors are ordered on torch's stream (no host sync). Each step
is attributed with CUDA events and host clocks:
  data_wait   host time inside next() (the trainer waiting for a batch)
  h2d         GPU time the compute stream idles for the batch's copy (device delivery), or the
              copy itself (--host-batches)
  compute     forward + backward + optimizer on the GPU (DDP's all-reduce overlaps backward)
  comm        GPU time of the gradient all-reduces (DDP comm hook), overlapped with backward
and the run prints samples/s and decoded frames/s per GPU. --json writes every figure.

  conveyor serve DATASET --config python/examples/policy.yaml --listen 127.0.0.1:7070 &
  python python/examples/train_torch_policy.py --servers 127.0.0.1:7070 --steps 300
  torchrun --nproc-per-node 8 python/examples/train_torch_policy.py --servers ...   # 8 GPUs

--width and --blocks move the demand (a smaller model asks for more frames/s); --device cpu runs
the same loop on the CPU (fp32), as the CI test does with a tiny model.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import conveyor


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", default=None, help="HOST:PORT[,...] (default: $CONVEYOR_SERVERS)")
    p.add_argument("--config", default=None, help="config to send (default: the server's)")
    p.add_argument("--job", default="torch_policy")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the summary")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--width", type=int, default=64, help="first stage's channels (ResNet-18: 64)")
    p.add_argument("--blocks", default="2,2,2,2", help="BasicBlocks per stage")
    p.add_argument("--crop", type=int, default=208, help="random crop side (GPU augmentation)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--device", choices=["cuda", "cpu"],
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--host-batches", action="store_true",
                   help="take host batches and copy them (the path without device delivery)")
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--checkpoint", default=None, help="save model, optimizer and loader state")
    p.add_argument("--json", default=None, help="write the per-step figures and summary here")
    return p.parse_args(argv)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class Encoder(nn.Module):
    """ResNet-18's shape at `width` (64 = ResNet-18): [N, 3, H, W] -> [N, 8 * width]."""

    def __init__(self, width, blocks):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], width
        for i, n in enumerate(blocks):
            cout = width * 2 ** i
            for j in range(n):
                stages.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.stages = nn.Sequential(*stages)
        self.out_features = cin

    def forward(self, x):
        return F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1).flatten(1)


class Policy(nn.Module):
    def __init__(self, cameras, state_dim, action_shape, width, blocks, hidden):
        super().__init__()
        self.cameras = list(cameras)
        self.action_shape = tuple(action_shape)
        self.encoders = nn.ModuleList(Encoder(width, blocks) for _ in self.cameras)
        feats = sum(e.out_features for e in self.encoders) + state_dim
        self.head = nn.Sequential(nn.Linear(feats, hidden), nn.GELU(), nn.Linear(hidden, hidden),
                                  nn.GELU(), nn.Linear(hidden, math.prod(self.action_shape)))

    def forward(self, images, state):
        feats = [enc(img) for enc, img in zip(self.encoders, images)]
        out = self.head(torch.cat(feats + [state], dim=1))
        return out.reshape(out.shape[0], *self.action_shape)


_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def augment(frames, crop, generator):
    """uint8 [B, T, H, W, 3] (T = 1) -> float [B, 3, crop, crop]: a random crop per sample,
    scaled and normalised, on the frames' device."""
    b, t, h, w, c = frames.shape
    x = frames.reshape(b * t, h, w, c).permute(0, 3, 1, 2)
    crop = min(crop, h, w)
    ys = torch.randint(0, h - crop + 1, (b * t,), device=x.device, generator=generator)
    xs = torch.randint(0, w - crop + 1, (b * t,), device=x.device, generator=generator)
    rows = (ys.view(-1, 1) + torch.arange(crop, device=x.device)).view(-1, 1, crop, 1)
    cols = (xs.view(-1, 1) + torch.arange(crop, device=x.device)).view(-1, 1, 1, crop)
    n = torch.arange(b * t, device=x.device).view(-1, 1, 1, 1)
    ch = torch.arange(c, device=x.device).view(1, -1, 1, 1)
    x = x[n, ch, rows, cols].float().div_(255.0)
    return (x - _MEAN.to(x.device)) / _STD.to(x.device)


def masked_mse(pred, target, is_pad):
    valid = (~is_pad).unsqueeze(-1).to(pred.dtype)
    return ((pred - target) ** 2 * valid).sum() / (valid.sum() * pred.shape[-1]).clamp_min(1.0)


def camera_keys(batch):
    return [k for k, v in conveyor.tensors(batch).items()
            if v.dim() == 5 and v.dtype == torch.uint8 and v.shape[-1] == 3]


class Timer:
    """CUDA events on the current stream, or host clocks on the CPU."""

    def __init__(self, cuda):
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b):
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


def timed_allreduce_hook(records, world_size):
    """DDP comm hook: the default all-reduce (average), with CUDA events around each bucket."""

    def hook(state, bucket):
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()

        def done(f):
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            records.append((start, end))
            return f.value()[0].div_(world_size)

        return fut.then(done)

    return hook


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def main(argv=None):
    args = parse_args(argv)
    env = conveyor.launch_env(servers=args.servers)
    rank, world = env["rank"], env["world_size"]
    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", env["local_rank"] % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    distributed = world > 1 or "MASTER_ADDR" in os.environ
    if distributed:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    gen = torch.Generator(device=device)
    gen.manual_seed(1234 + rank)

    deliver = cuda and not args.host_batches
    loader = conveyor.Loader(servers=args.servers, job=args.job, rank=rank, world_size=world,
                             config=args.config, prefetch=args.prefetch,
                             device=device if deliver else "cpu")
    timer = Timer(cuda)
    comm_records = []
    model = opt = None
    steps, it = [], iter(loader)
    # Each step's GPU events and loss are read one step later, so the host never drains the GPU to
    # time it: the host enqueues step N+1 while the GPU runs step N, as a trainer that does not
    # time itself would. step_ms is the host's time from one step's start to the next's.
    pending, last = [], None

    def finish(p):
        rec, e0, e1, e2, loss_t, comm = p
        if cuda:
            e2.synchronize()
        rec.update(h2d_ms=timer.ms(e0, e1), compute_ms=timer.ms(e1, e2),
                   comm_ms=sum(a.elapsed_time(b) for a, b in comm) if cuda else 0.0,
                   loss=float(loss_t))
        steps.append(rec)
        if rank == 0 and (rec["step"] % 20 == 0 or rec["step"] == args.steps - 1):
            print(f"step {rec['step']} loss {rec['loss']:.4f} wait {rec['data_wait_ms']:.2f} ms h2d "
                  f"{rec['h2d_ms']:.2f} ms compute {rec['compute_ms']:.1f} ms comm "
                  f"{rec['comm_ms']:.1f} ms step {rec['step_ms']:.1f} ms", flush=True)

    t_run = time.perf_counter()
    for step in range(args.steps):
        # Recorded before the batch is taken: on the GPU, the stream reaches e0 once the previous
        # step's work is done, then waits for this batch's copy (the wait the Loader enqueued
        # through DLPack), then reaches e1. e1 - e0 is the time the GPU idled for the copy.
        e0 = timer.mark()
        t0 = time.perf_counter()
        if last is not None:
            last[0]["step_ms"] = (t0 - last[1]) * 1e3
        try:
            batch = next(it)
        except StopIteration:
            break
        wait_ms = (time.perf_counter() - t0) * 1e3
        if not cuda:
            e0 = timer.mark()  # host clocks: the conversion alone, not the wait
        if deliver:
            t = batch  # CUDA tensors, ordered on this stream after the client's copy
        else:
            t = conveyor.to_torch(batch, device=device if cuda else None, non_blocking=True)
        e1 = timer.mark()
        if model is None:
            cams = camera_keys(t)
            state_dim = t["observation.state"].reshape(t["action"].shape[0], -1).shape[1]
            net = Policy(cams, state_dim, t["action"].shape[1:], args.width,
                         [int(x) for x in args.blocks.split(",")], args.hidden).to(device)
            if cuda:
                net = net.to(memory_format=torch.channels_last)
            model = net
            if distributed:
                model = nn.parallel.DistributedDataParallel(
                    net, device_ids=[device] if cuda else None)
                if cuda:
                    model.register_comm_hook(None, timed_allreduce_hook(comm_records, world))
            opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
            params = sum(p.numel() for p in net.parameters())
            if rank == 0:
                print(f"policy: {len(cams)} cameras {list(t[cams[0]].shape)}, "
                      f"{params / 1e6:.1f} M parameters, device {device}", flush=True)
        frames_per_sample = sum(t[k].shape[1] for k in cams)
        comm_records.clear()
        with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16,
                            enabled=cuda):
            images = [augment(t[k], args.crop, gen) for k in cams]
            if cuda:
                images = [x.contiguous(memory_format=torch.channels_last) for x in images]
            state = t["observation.state"].reshape(t["action"].shape[0], -1).float()
            pred = model(images, state)
            loss = masked_mse(pred.float(), t["action"].float(), t["action_is_pad"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        e2 = timer.mark()
        del batch, t, images  # the batch's device buffer returns to the client after this work
        samples = int(pred.shape[0])
        rec = {"step": step, "data_wait_ms": wait_ms, "samples": samples,
               "frames": samples * frames_per_sample}
        pending.append((rec, e0, e1, e2, loss.detach(), list(comm_records)))
        last = (rec, t0)
        while len(pending) > 1:
            finish(pending.pop(0))
    for p in pending:
        if cuda:
            p[3].synchronize()
        if "step_ms" not in p[0]:
            p[0]["step_ms"] = (time.perf_counter() - last[1]) * 1e3
        finish(p)
    wall = time.perf_counter() - t_run
    measured = steps[args.warmup:] if len(steps) > args.warmup else steps
    secs = sum(r["step_ms"] for r in measured) / 1e3
    summary = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "world_size": world, "rank": rank, "steps": len(steps), "warmup": args.warmup,
        "width": args.width, "blocks": args.blocks, "delivery": "device" if deliver else "host",
        "samples_per_s": sum(r["samples"] for r in measured) / secs if secs else 0.0,
        "frames_per_s": sum(r["frames"] for r in measured) / secs if secs else 0.0,
        "data_wait_fraction": sum(r["data_wait_ms"] for r in measured) / (secs * 1e3) if secs else 0,
        "step_ms_p50": percentile([r["step_ms"] for r in measured], 0.5),
        "data_wait_ms_p50": percentile([r["data_wait_ms"] for r in measured], 0.5),
        "data_wait_ms_p99": percentile([r["data_wait_ms"] for r in measured], 0.99),
        "h2d_ms_p50": percentile([r["h2d_ms"] for r in measured], 0.5),
        "compute_ms_p50": percentile([r["compute_ms"] for r in measured], 0.5),
        "comm_ms_p50": percentile([r["comm_ms"] for r in measured], 0.5),
        "wall_s": wall, "loader": loader.stats(), "state": loader.state_dict(),
    }
    if rank == 0:
        print(json.dumps({k: v for k, v in summary.items() if k not in ("loader", "state")}),
              flush=True)
    if args.json:
        path = args.json if world == 1 else f"{args.json}.rank{rank}"
        with open(path, "w") as f:
            json.dump({"summary": summary, "steps": steps}, f, indent=1)
    if args.checkpoint and rank == 0 and model is not None:
        torch.save({"model": (model.module if distributed else model).state_dict(),
                    "optim": opt.state_dict(), "loader": loader.state_dict()}, args.checkpoint)
    loader.close()
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
