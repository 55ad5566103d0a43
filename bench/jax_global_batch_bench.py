#!/usr/bin/env python3
"""Per-batch host cost of conveyor.jax.make_global_batch (issue 41 item 2): the time the
trainer's thread spends turning one process's batch into global jax.Arrays (the copies
themselves are asynchronous), against the way it was done before, in the same run:

  baseline   per tensor, a new NamedSharding and one jax.make_array_from_process_local_data
             (conveyor.jax before issue 41)
  current    conveyor.jax.make_global_batch: shardings made once, a one-process batch in one
             jax.device_put

on python/examples/policy.yaml's batch (64 samples: two uint8 cameras [64, 1, 224, 224, 3], the
state, a 50-step action chunk and its padding flags) over every device of this process, sharded
over the batch. Each call's host time is timed alone (time.perf_counter around the call), then
its copies are waited for outside the timing, so the figures are the host's cost per batch and
not the copy. Median and p90 over --iterations calls after --warmup; JSON with --json.

  /opt/torch/.venv/bin/python bench/jax_global_batch_bench.py --json out.json   # the GPU image
"""

import argparse
import json
import statistics
import sys
import time


def policy_batch(np, batch=64):
    rng = np.random.default_rng(0)
    return {"cam0": rng.integers(0, 255, (batch, 1, 224, 224, 3), dtype=np.uint8),
            "cam1": rng.integers(0, 255, (batch, 1, 224, 224, 3), dtype=np.uint8),
            "observation.state": rng.standard_normal((batch, 1, 14), dtype=np.float32),
            "action": rng.standard_normal((batch, 50, 14), dtype=np.float32),
            "action_is_pad": np.zeros((batch, 50), dtype=bool),
            "_cursor": (0, 0), "_ids": np.zeros((batch, 3), dtype=np.int64)}


def baseline(batch, mesh, spec):
    """make_global_batch as it was: a NamedSharding and a make_array_from_process_local_data per
    tensor, per batch."""
    import jax
    from jax.sharding import NamedSharding

    return {name: jax.make_array_from_process_local_data(NamedSharding(mesh, spec), a)
            for name, a in batch.items() if not name.startswith("_")}


def measure(fn, batch, mesh, spec, warmup, iterations):
    import jax

    times = []
    for i in range(warmup + iterations):
        t0 = time.perf_counter()
        out = fn(batch, mesh, spec)
        t1 = time.perf_counter()
        jax.block_until_ready(out)  # outside the timing: the copy is not the host's cost
        if i >= warmup:
            times.append((t1 - t0) * 1e6)
    times.sort()
    return {"us_p50": statistics.median(times), "us_p90": times[int(0.9 * (len(times) - 1))],
            "iterations": iterations}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import jax
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec

    import conveyor.jax as cj

    mesh = Mesh(np.array(jax.devices()), ("data",))
    spec = PartitionSpec("data")
    batch = policy_batch(np)
    rows = {"baseline": measure(baseline, batch, mesh, spec, args.warmup, args.iterations),
            "current": measure(cj.make_global_batch, batch, mesh, spec, args.warmup,
                               args.iterations)}
    # The two give the same arrays.
    a, b = baseline(batch, mesh, spec), cj.make_global_batch(batch, mesh, spec)
    same = all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a) and list(a) == list(b)
    out = {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
           "tensors": len(a), "batch_bytes": int(sum(v.nbytes for k, v in batch.items()
                                                     if not k.startswith("_"))),
           "same_arrays": same, **rows,
           "speedup_p50": rows["baseline"]["us_p50"] / max(rows["current"]["us_p50"], 1e-9)}
    print(f"make_global_batch host time per batch ({len(a)} tensors, {jax.device_count()} "
          f"devices): baseline {rows['baseline']['us_p50']:.0f} us, current "
          f"{rows['current']['us_p50']:.0f} us (p50), {out['speedup_p50']:.2f}x")
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
