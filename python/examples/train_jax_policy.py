#!/usr/bin/env python3
"""A vision policy trained with JAX and flax on the GPU(s), fed by Conveyor.

The same model as train_torch_policy.py: per camera a ResNet-18-shaped convnet (BasicBlocks
[2, 2, 2, 2] at widths 64..512, scaled by --width; GroupNorm, so the step is a pure function), the
features and the state through an MLP head predicting the action chunk; bf16 compute with fp32
parameters, optax AdamW, masked MSE; augmentation (a random crop per sample, normalisation) inside
the jitted step. Data parallel over every device of the process (and of every process under
jax.distributed): each process streams its consumer slice (jax.process_index() of
jax.process_count()), conveyor.jax.prefetch_to_device assembles global arrays with
jax.make_array_from_process_local_data two steps ahead, so the copies overlap compute.

The loader's state is saved beside the model with Orbax (conveyor.jax.orbax_save_args): a job
restored with --restore continues the data exactly after the last saved step.

Step attribution (host clocks; JAX has no CUDA events): data_wait (next() of the loader), h2d
(starting the copies of the batch two steps ahead), compute (the jitted step, dispatched and
waited for with block_until_ready: the wait is the device time not hidden by dispatch). Prints
samples/s and decoded frames/s per GPU.

  conveyor serve DATASET --config python/examples/policy.yaml --listen 127.0.0.1:7070 &
  python python/examples/train_jax_policy.py --servers 127.0.0.1:7070 --steps 300
"""

import argparse
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import conveyor
import conveyor.jax as cj


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", default=None, help="HOST:PORT[,...] (default: $CONVEYOR_SERVERS)")
    p.add_argument("--config", default=None, help="config to send (default: the server's)")
    p.add_argument("--job", default="jax_policy")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the summary")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--blocks", default="2,2,2,2")
    p.add_argument("--crop", type=int, default=208)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--prefetch-to-device", type=int, default=2)
    p.add_argument("--checkpoint-dir", default=None, help="Orbax checkpoints (model + loader)")
    p.add_argument("--restore", action="store_true", help="resume from --checkpoint-dir")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


class BasicBlock(nn.Module):
    features: int
    stride: int
    dtype: jnp.dtype = jnp.bfloat16

    @nn.compact
    def __call__(self, x):
        conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
        norm = functools.partial(nn.GroupNorm, num_groups=min(32, self.features), dtype=self.dtype)
        y = nn.relu(norm()(conv(self.features, (3, 3), (self.stride, self.stride))(x)))
        y = norm()(conv(self.features, (3, 3))(y))
        if x.shape[-1] != self.features or self.stride != 1:
            x = norm()(conv(self.features, (1, 1), (self.stride, self.stride))(x))
        return nn.relu(x + y)


class Encoder(nn.Module):
    width: int
    blocks: tuple
    dtype: jnp.dtype = jnp.bfloat16

    @nn.compact
    def __call__(self, x):  # [N, H, W, 3]
        x = nn.Conv(self.width, (7, 7), (2, 2), use_bias=False, dtype=self.dtype)(x)
        x = nn.relu(nn.GroupNorm(num_groups=min(32, self.width), dtype=self.dtype)(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
        for i, n in enumerate(self.blocks):
            for j in range(n):
                x = BasicBlock(self.width * 2 ** i, 2 if (j == 0 and i > 0) else 1, self.dtype)(x)
        return jnp.mean(x, axis=(1, 2))


class Policy(nn.Module):
    cameras: tuple
    action_shape: tuple
    width: int
    blocks: tuple
    hidden: int

    @nn.compact
    def __call__(self, images, state):
        feats = [Encoder(self.width, self.blocks, name=f"enc_{c}")(images[c]) for c in self.cameras]
        x = jnp.concatenate(feats + [state.astype(jnp.bfloat16)], axis=-1)
        x = nn.gelu(nn.Dense(self.hidden, dtype=jnp.bfloat16)(x))
        x = nn.gelu(nn.Dense(self.hidden, dtype=jnp.bfloat16)(x))
        x = nn.Dense(int(np.prod(self.action_shape)), dtype=jnp.bfloat16)(x)
        return x.astype(jnp.float32).reshape((x.shape[0],) + tuple(self.action_shape))


_MEAN = jnp.array([0.485, 0.456, 0.406])
_STD = jnp.array([0.229, 0.224, 0.225])


def augment(frames, crop, key):
    """uint8 [B, 1, H, W, 3] -> float [B, crop, crop, 3]: a random crop per sample, normalised."""
    b, t, h, w, c = frames.shape
    x = frames.reshape(b * t, h, w, c)
    crop = min(crop, h, w)
    ky, kx = jax.random.split(key)
    ys = jax.random.randint(ky, (b * t,), 0, h - crop + 1)
    xs = jax.random.randint(kx, (b * t,), 0, w - crop + 1)
    cut = jax.vmap(lambda img, y, x0: jax.lax.dynamic_slice(img, (y, x0, 0), (crop, crop, c)))
    x = cut(x, ys, xs).astype(jnp.float32) / 255.0
    return ((x - _MEAN) / _STD).astype(jnp.bfloat16)


def camera_keys(batch):
    return [k for k, v in conveyor.tensors(batch).items()
            if v.ndim == 5 and v.dtype == np.uint8 and v.shape[-1] == 3]


def main(argv=None):
    args = parse_args(argv)
    if "JAX_COORDINATOR_ADDRESS" in os.environ or "SLURM_NTASKS" in os.environ:
        jax.distributed.initialize()
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("data",))
    data = PartitionSpec("data")
    batches = cj.loader(servers=args.servers, job=args.job, config=args.config)

    mngr = None
    if args.checkpoint_dir:
        import orbax.checkpoint as ocp
        mngr = ocp.CheckpointManager(os.path.abspath(args.checkpoint_dir),
                                     options=ocp.CheckpointManagerOptions(max_to_keep=2))

    # The first batch fixes the shapes (static for the whole run).
    first = next(iter(cj.loader(servers=args.servers, job=args.job + "-shapes",
                                config=args.config, max_batches=1)))
    cams = tuple(camera_keys(first))
    frames_per_sample = sum(first[k].shape[1] for k in cams)
    state_dim = int(np.prod(first["observation.state"].shape[1:]))
    model = Policy(cams, tuple(first["action"].shape[1:]), args.width,
                   tuple(int(x) for x in args.blocks.split(",")), args.hidden)
    crop = min(args.crop, first[cams[0]].shape[2])
    dummy = {c: jnp.zeros((1, crop, crop, 3), jnp.bfloat16) for c in cams}
    params = model.init(jax.random.PRNGKey(0), dummy, jnp.zeros((1, state_dim)))
    tx = optax.adamw(args.lr)
    replicated = NamedSharding(mesh, PartitionSpec())
    params = jax.device_put(params, replicated)
    opt_state = jax.device_put(tx.init(params), replicated)
    step0 = 0
    if mngr is not None and args.restore and mngr.latest_step() is not None:
        import orbax.checkpoint as ocp
        step0 = mngr.latest_step()
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct,
                                          {"params": params, "opt_state": opt_state})
        restored = mngr.restore(step0, args=ocp.args.Composite(
            model=ocp.args.StandardRestore(abstract), loader=cj.orbax_restore_args()))
        params, opt_state = restored.model["params"], restored.model["opt_state"]
        cj.restore_loader(batches, restored.loader)
        print(f"restored step {step0}, loader cursor {batches.cursor}", flush=True)

    @jax.jit
    def train_step(params, opt_state, batch, key):
        keys = jax.random.split(key, len(cams))
        images = {c: augment(batch[c], crop, k) for c, k in zip(cams, keys)}
        state = batch["observation.state"].reshape(batch["action"].shape[0], -1)

        def loss_fn(p):
            pred = model.apply(p, images, state)
            valid = (~batch["action_is_pad"])[..., None].astype(jnp.float32)
            err = (pred - batch["action"]) ** 2 * valid
            return err.sum() / jnp.maximum(valid.sum() * pred.shape[-1], 1.0)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rank = jax.process_index()
    host_it = iter(batches)
    timed = {"data_wait_ms": 0.0}

    def timed_batches():
        while True:
            t0 = time.perf_counter()
            try:
                b = next(host_it)
            except StopIteration:
                return
            timed["data_wait_ms"] += (time.perf_counter() - t0) * 1e3
            t1 = time.perf_counter()
            yield b
            timed["h2d_ms"] = timed.get("h2d_ms", 0.0) + (time.perf_counter() - t1) * 1e3

    device_batches = cj.prefetch_to_device(timed_batches(), mesh, data,
                                           size=args.prefetch_to_device)
    key = jax.random.PRNGKey(rank)
    steps = []
    last_trained = None
    t_run = time.perf_counter()
    for i in range(args.steps):
        t0 = time.perf_counter()
        timed["data_wait_ms"], timed["h2d_ms"] = 0.0, 0.0
        try:
            g = next(device_batches)
        except StopIteration:
            break
        meta = {k: g.pop(k) for k in cj._CURSOR_KEYS}  # host values, not for the jitted step
        last_trained = meta
        t1 = time.perf_counter()
        key, sub = jax.random.split(key)
        params, opt_state, loss = train_step(params, opt_state, g, sub)
        loss.block_until_ready()
        t2 = time.perf_counter()
        samples = int(g["action"].shape[0])
        steps.append({"step": step0 + i, "data_wait_ms": timed["data_wait_ms"],
                      "h2d_ms": timed["h2d_ms"], "compute_ms": (t2 - t1) * 1e3,
                      "step_ms": (t2 - t0) * 1e3, "samples": samples,
                      "frames": samples * frames_per_sample, "loss": float(loss)})
        if rank == 0 and (i % 20 == 0 or i == args.steps - 1):
            r = steps[-1]
            print(f"step {r['step']} loss {r['loss']:.4f} wait {r['data_wait_ms']:.2f} ms h2d "
                  f"{r['h2d_ms']:.2f} ms compute {r['compute_ms']:.1f} ms", flush=True)
    wall = time.perf_counter() - t_run
    if mngr is not None and steps:
        import orbax.checkpoint as ocp
        last = steps[-1]["step"] + 1
        mngr.save(last, args=ocp.args.Composite(
            model=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
            loader=cj.orbax_save_args(batches, after=last_trained)))
        mngr.wait_until_finished()
    measured = steps[args.warmup:] if len(steps) > args.warmup else steps
    secs = sum(r["step_ms"] for r in measured) / 1e3
    n_gpu = len(jax.local_devices())
    summary = {
        "device": str(devices[0].device_kind), "devices": len(devices), "steps": len(steps),
        "width": args.width, "blocks": args.blocks,
        "samples_per_s_per_gpu": (sum(r["samples"] for r in measured) / secs / n_gpu
                                  if secs else 0.0),
        "frames_per_s_per_gpu": (sum(r["frames"] for r in measured) / secs / n_gpu
                                 if secs else 0.0),
        "data_wait_fraction": sum(r["data_wait_ms"] for r in measured) / (secs * 1e3) if secs else 0,
        "step_ms_p50": float(np.median([r["step_ms"] for r in measured])) if measured else 0,
        "compute_ms_p50": float(np.median([r["compute_ms"] for r in measured])) if measured else 0,
        "wall_s": wall, "loader": batches.stats(),
        "state": batches.state_dict(after=last_trained) if last_trained else None,
    }
    if rank == 0:
        print(json.dumps({k: v for k, v in summary.items() if k not in ("loader", "state")}),
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "steps": steps}, f, indent=1)
    batches.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
