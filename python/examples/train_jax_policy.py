#!/usr/bin/env python3
"""A vision policy trained with JAX and flax on the GPU(s), fed by Conveyor.

The same model as train_torch_policy.py (jax_policy_model.py): per camera a ResNet-18-shaped
convnet (BasicBlocks [2, 2, 2, 2] at widths 64..512, scaled by --width; GroupNorm, so the step is a
pure function), the features and the state through an MLP head predicting the action chunk; bf16
compute with fp32 parameters, optax AdamW, masked MSE; augmentation (a random crop per sample,
normalisation) inside the jitted step. Data parallel over every device of the process (and of
every process under jax.distributed): each process streams its consumer slice
(jax.process_index() of jax.process_count()), conveyor.jax.prefetch_to_device assembles global
arrays --prefetch-to-device steps ahead, so the copies overlap compute.

The loop is a JAX trainer's: each step is dispatched asynchronously and the host waits for the
device only where a trainer does, when it reads the loss to log it (every --log-every steps), at
the end of the warm-up and at the last step. Per step (host clocks):
  data_wait            host time blocked in the loader's next() (as train_torch_policy.py's)
  make_global_batch    host time starting the copies of the batch --prefetch-to-device steps
                       ahead (conveyor.jax.make_global_batch; the copies themselves are
                       asynchronous and overlap the device's work, so no host clock sees them)
  dispatch             host time handing the step to jax
  block                (logged steps) host time waiting for the device to finish the step
Throughput and the data-wait fraction are over the measured interval's wall time, from the block
that ends the warm-up to the last step's. Prints samples/s and decoded frames/s per GPU.

The loader's state is saved beside the model with Orbax (conveyor.jax.orbax_save_args): a job
restored with --restore continues the data exactly after the last saved step.

  conveyor serve DATASET --config python/examples/policy.yaml --listen 127.0.0.1:7070 &
  python python/examples/train_jax_policy.py --servers 127.0.0.1:7070 --steps 300
"""

import argparse
import json
import os
import sys
import time

import jax
import numpy as np
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
    p.add_argument("--log-every", type=int, default=20,
                   help="steps between losses read (the host's waits for the device)")
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


def camera_keys(batch):
    return [k for k, v in conveyor.tensors(batch).items()
            if v.ndim == 5 and v.dtype == np.uint8 and v.shape[-1] == 3]


def train(batches, mesh, pspec, step, carry, *, steps, warmup, log_every, prefetch,
          frames_per_sample, step0=0, log=None):
    """Runs up to `steps` steps of step(carry, global_batch) -> (carry, loss) over `batches` (a
    conveyor.Loader), dispatched asynchronously; the host waits for the device (float(loss))
    only at every log_every-th step, at the warm-up's last step and at the last step. Returns
    (carry, records, last_trained, measured_seconds): one record per step, the last trained
    batch's cursor keys (for Loader.state_dict(after=...)), and the wall time of the steps after
    the warm-up (from the warm-up's block to the last step's)."""
    host_it = iter(batches)
    wait = [0.0]

    def timed():  # the loader's next(), timed: the host blocked on the data
        while True:
            t0 = time.perf_counter()
            try:
                b = next(host_it)
            except StopIteration:
                return
            wait[0] += time.perf_counter() - t0
            yield b

    device_batches = cj.prefetch_to_device(timed(), mesh, pspec, size=prefetch)
    records, last_trained = [], None
    t_measured = time.perf_counter()
    for i in range(steps):
        t0 = time.perf_counter()
        wait[0] = 0.0
        try:
            g = next(device_batches)
        except StopIteration:
            break
        t1 = time.perf_counter()
        meta = {k: g.pop(k) for k in cj._CURSOR_KEYS if k in g}  # host values, not for the step
        carry, loss = step(carry, g)
        t2 = time.perf_counter()
        samples = int(g["action"].shape[0])
        rec = {"step": step0 + i, "data_wait_ms": wait[0] * 1e3,
               "make_global_batch_ms": (t1 - t0 - wait[0]) * 1e3, "dispatch_ms": (t2 - t1) * 1e3,
               "samples": samples, "frames": samples * frames_per_sample}
        last_trained = meta
        if (i + 1) % log_every == 0 or i + 1 == warmup or i + 1 == steps:
            rec["loss"] = float(loss)  # the trainer's wait for the device: it reads the loss
            rec["block_ms"] = (time.perf_counter() - t2) * 1e3
            if log is not None:
                log(rec)
        rec["step_ms"] = (time.perf_counter() - t0) * 1e3
        records.append(rec)
        if i + 1 == warmup:
            t_measured = time.perf_counter()
    if records and "loss" not in records[-1]:  # the loader ended early: wait for the last step
        records[-1]["loss"] = float(loss)
    return carry, records, last_trained, time.perf_counter() - t_measured


def percentile(values, q):
    return float(np.percentile(values, q * 100)) if values else 0.0


def summarize(records, warmup, measured_seconds, devices):
    """The run's figures over the steps after the warm-up (all of them when there are no more)."""
    measured = records[warmup:] if len(records) > warmup else records
    secs = measured_seconds if len(records) > warmup else sum(r["step_ms"] for r in records) / 1e3
    blocks = [r["block_ms"] for r in measured if "block_ms" in r]
    return {
        "steps": len(records), "warmup": warmup, "measured_steps": len(measured),
        "measured_s": secs,
        "samples_per_s_per_gpu": sum(r["samples"] for r in measured) / secs / devices if secs else 0.0,
        "frames_per_s_per_gpu": sum(r["frames"] for r in measured) / secs / devices if secs else 0.0,
        "data_wait_fraction": sum(r["data_wait_ms"] for r in measured) / (secs * 1e3) if secs else 0.0,
        "data_wait_ms_p50": percentile([r["data_wait_ms"] for r in measured], 0.5),
        "data_wait_ms_p99": percentile([r["data_wait_ms"] for r in measured], 0.99),
        "data_wait_ms_max": max((r["data_wait_ms"] for r in measured), default=0.0),
        "make_global_batch_ms_p50": percentile([r["make_global_batch_ms"] for r in measured], 0.5),
        "dispatch_ms_p50": percentile([r["dispatch_ms"] for r in measured], 0.5),
        "step_ms_mean": secs * 1e3 / len(measured) if measured else 0.0,
        "blocks": len(blocks), "block_ms_sum": sum(blocks),
    }


def main(argv=None):
    args = parse_args(argv)
    import optax  # the model's libraries: jax_policy_model.py

    import jax_policy_model as jpm

    if "JAX_COORDINATOR_ADDRESS" in os.environ or "SLURM_NTASKS" in os.environ:
        jax.distributed.initialize()
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("data",))
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
    model = jpm.Policy(cams, tuple(first["action"].shape[1:]), args.width,
                       tuple(int(x) for x in args.blocks.split(",")), args.hidden)
    crop = min(args.crop, first[cams[0]].shape[2])
    dummy = {c: jax.numpy.zeros((1, crop, crop, 3), jax.numpy.bfloat16) for c in cams}
    params = model.init(jax.random.PRNGKey(0), dummy, jax.numpy.zeros((1, state_dim)))
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

    rank = jax.process_index()

    def log(r):
        if rank == 0:
            print(f"step {r['step']} loss {r['loss']:.4f} wait {r['data_wait_ms']:.2f} ms "
                  f"make_global_batch {r['make_global_batch_ms']:.2f} ms block "
                  f"{r['block_ms']:.1f} ms", flush=True)

    t_run = time.perf_counter()
    carry = (params, opt_state, jax.random.PRNGKey(rank))
    carry, steps, last_trained, measured_s = train(
        batches, mesh, PartitionSpec("data"), jpm.make_train_step(model, tx, cams, crop), carry,
        steps=args.steps, warmup=args.warmup, log_every=args.log_every,
        prefetch=args.prefetch_to_device, frames_per_sample=frames_per_sample, step0=step0,
        log=log)
    params, opt_state, _ = carry
    wall = time.perf_counter() - t_run
    if mngr is not None and steps:
        import orbax.checkpoint as ocp
        last = steps[-1]["step"] + 1
        mngr.save(last, args=ocp.args.Composite(
            model=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
            loader=cj.orbax_save_args(batches, after=last_trained)))
        mngr.wait_until_finished()
    summary = {"device": str(devices[0].device_kind), "devices": len(devices),
               "processes": jax.process_count(), "width": args.width, "blocks": args.blocks,
               "log_every": args.log_every, "prefetch_to_device": args.prefetch_to_device,
               **summarize(steps, args.warmup, measured_s, len(devices)),
               "wall_s": wall, "loader": batches.stats(),
               "state": batches.state_dict(after=last_trained) if last_trained else None}
    if rank == 0:
        print(json.dumps({k: v for k, v in summary.items() if k not in ("loader", "state")}),
              flush=True)
    if args.json:
        path = args.json if jax.process_count() == 1 else f"{args.json}.rank{rank}"
        with open(path, "w") as f:
            json.dump({"summary": summary, "steps": steps}, f, indent=1)
    batches.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
