#!/usr/bin/python3
"""A minimal PyTorch DistributedDataParallel training loop fed by Conveyor.

A tiny policy (each camera frame average-pooled to a few features, plus the proprioceptive state
-> an action chunk) trained with MSE over the non-padded actions. Each rank streams its own
consumer slice of the global batch (rank r of world_size), prints loss and the time it waited
for data per step, and saves the loader's cursor with the checkpoint so --resume continues with
exactly the next batch.

  # 2 local processes (gloo on CPU, nccl on GPU), against a running `conveyor serve`:
  PYTHONPATH=build/python /usr/bin/python3 python/examples/train_ddp.py \
      --servers 127.0.0.1:7070 --nproc 2 --steps 100 --checkpoint /tmp/ckpt.pt
  ... --resume                     # continue from the checkpoint's model, optimizer and cursor
  # or under a launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
  # (torchrun, SLURM wrappers): leave out --nproc.

Debian 12's torch 1.13 `torch.distributed.run` fails under Python 3.11 (an enum change breaks
its --redirects parsing), hence --nproc with torch.multiprocessing.spawn.
"""

import argparse
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import conveyor


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", default=None, help="HOST:PORT[,...] (default: $CONVEYOR_SERVERS)")
    p.add_argument("--config", default=None, help="config (YAML) to send; default: the server's")
    p.add_argument("--config-name", default=None, help="one of the server's configs")
    p.add_argument("--job", default="train_ddp")
    p.add_argument("--steps", type=int, default=100, help="training steps in this run")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--pool", type=int, default=2, help="pooled features per frame side")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--nproc", type=int, default=0,
                   help="spawn this many local ranks (default: one process, or what the "
                        "launcher's RANK/WORLD_SIZE say)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--checkpoint", default=None, help="save model, optimizer and loader state here")
    p.add_argument("--resume", action="store_true", help="start from --checkpoint")
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--max-message-bytes", type=int, default=0,
                   help="ask for messages this large, so big tensors arrive unsplit (0: server's)")
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint")
    return args


class TinyPolicy(nn.Module):
    """cameras [B, T, H, W, 3] uint8 -> pool x pool averages per frame and channel; with the state
    [B, S, D] -> MLP -> actions [B, K, A]."""

    def __init__(self, in_features, action_shape, pool, hidden):
        super().__init__()
        self.pool = pool
        self.action_shape = tuple(action_shape)
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, math.prod(self.action_shape)))

    def features(self, cameras, state):
        feats = []
        for frames in cameras:  # [B, T, H, W, C] uint8
            b, t, h, w, c = frames.shape
            x = frames.reshape(b * t, h, w, c).permute(0, 3, 1, 2).float().div_(255.0)
            feats.append(F.adaptive_avg_pool2d(x, self.pool).reshape(b, -1))
        feats.append(state.reshape(state.shape[0], -1))
        return torch.cat(feats, dim=1)

    def forward(self, cameras, state):
        out = self.net(self.features(cameras, state))
        return out.reshape(out.shape[0], *self.action_shape)


def camera_keys(batch):
    return [k for k, v in conveyor.tensors(batch).items()
            if v.ndim == 5 and str(v.dtype) in ("uint8", "torch.uint8") and v.shape[-1] == 3]


def masked_mse(pred, target, is_pad):
    valid = (~is_pad).unsqueeze(-1).to(pred.dtype)  # [B, K, 1]
    return ((pred - target) ** 2 * valid).sum() / (valid.sum() * pred.shape[-1]).clamp_min(1.0)


def log(text):
    """One write per line: ranks share stdout, and print() may split a line from its newline."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(rank, world_size, args):
    if world_size > 1 or "RANK" in os.environ:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
        os.environ.setdefault("LOCAL_RANK", str(rank))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://", rank=rank,
                            world_size=world_size)
    torch.manual_seed(0)

    # On a GPU the client delivers each batch there itself (one copy from pinned memory as it
    # arrives, ordered on torch's stream: docs/python.md "GPU delivery"); a conveyor built without
    # CUDA hands over host arrays, copied below.
    loader = conveyor.Loader(servers=args.servers, job=args.job, rank=rank, world_size=world_size,
                             config=args.config, config_name=args.config_name,
                             max_batches=args.steps, prefetch=args.prefetch,
                             max_message_bytes=args.max_message_bytes,
                             device=device if use_cuda and conveyor.device_supported() else "cpu")
    ckpt = None
    if args.resume:
        ckpt = torch.load(args.checkpoint, map_location="cpu")
        loader.load_state_dict(ckpt["loader"])
    start_step = ckpt["step"] if ckpt else 0
    log(f"rank {rank}/{world_size} device {device} consumer {loader.rank}/{loader.world_size} "
        f"starts at cursor {loader.cursor[0]}:{loader.cursor[1]} (step {start_step})")

    it = iter(loader)
    model = opt = cams = None
    step = start_step
    for _ in range(args.steps):
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        wait = time.perf_counter() - t0
        if model is None:  # shapes come from the first batch
            cams = camera_keys(batch)
            b = batch["action"].shape[0]
            in_features = len(cams) * batch[cams[0]].shape[1] * 3 * args.pool ** 2 if cams else 0
            in_features += batch["observation.state"].reshape(b, -1).shape[1]
            net = TinyPolicy(in_features, batch["action"].shape[1:], args.pool, args.hidden)
            if ckpt:
                net.load_state_dict(ckpt["model"])
            net.to(device)
            model = nn.parallel.DistributedDataParallel(
                net, device_ids=[device] if use_cuda else None)
            opt = torch.optim.Adam(model.parameters(), lr=args.lr)
            if ckpt:
                opt.load_state_dict(ckpt["optim"])
        if loader.device != "cpu":
            t = batch  # torch tensors on the GPU already
        else:
            t = conveyor.to_torch(batch, device=device if use_cuda else None)  # CPU: no copy
        pred = model([t[k] for k in cams], t["observation.state"])
        loss = masked_mse(pred, t["action"], t["action_is_pad"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        c = batch["_cursor"]
        log(f"rank {rank} step {step} cursor {c[0]}:{c[1]} consumer {batch['_consumer']}/"
            f"{batch['_consumers']} samples {batch['action'].shape[0]} loss {loss.item():.6f} "
            f"data_wait_ms {wait * 1e3:.1f} step_ms {(time.perf_counter() - t0) * 1e3:.1f}")

    state = loader.state_dict()
    if args.checkpoint and model is not None:
        if rank == 0:  # the cursor is global: the same on every rank
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(),
                        "loader": state, "step": step}, tmp)
            os.replace(tmp, args.checkpoint)
        dist.barrier()
    s = loader.stats()
    log(f"rank {rank} done steps {step} cursor {state['cursor'][0]}:{state['cursor'][1]} "
        f"waited {s.get('wait_seconds', 0):.2f} s in the client")
    loader.close()
    dist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    if args.nproc > 0:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        mp.spawn(train, args=(args.nproc, args), nprocs=args.nproc, join=True)
    else:
        train(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
