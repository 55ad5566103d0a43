#!/usr/bin/env python3
"""Per-batch overhead of the Python package: the time conveyor.Loader's next() takes for a batch
that is already waiting in the C++ client's queue (the cost Python adds to every step), for one
or more builds of the package side by side, against one `conveyor serve`.

  bench/python_overhead.py --cli build/tools/conveyor \\
      --package ctypes=build/python --package pybind11=/path/to/old/python --json out.json

Each package runs in its own interpreter (Debian's /usr/bin/python3 unless --python): it opens a
Loader with a prefetch queue deep enough for the whole measurement, waits until the client has
received every batch (stats()["batches"]), then times next() over them: host arrays (numpy views,
the default) and DLPack exporters (dlpack=True). Batches are small (examples/pipeline.yaml's
eight tensors with 32x32 frames), so what is timed is the per-batch and per-tensor work, not
bytes. Printed as a table and written as JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """anchor: action
streams:
  cam0: {delta_timestamps: [-0.1, 0.0], size: [32, 32]}
  cam1: {delta_timestamps: [-0.1, 0.0], size: [32, 32]}
  cam2: {delta_timestamps: [-0.1, 0.0], size: [32, 32]}
  observation.state: {delta_timestamps: [0.0]}
  action: {delta_timestamps: {start: 0.0, step: 0.02, count: 50}}
pipeline: {global_batch_size: 8, seed: 0}
"""

CHILD = r"""
import json, sys, time
import conveyor
address, batches, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
kwargs = {"dlpack": True} if mode == "dlpack" else {}
c = conveyor.Client(servers=[address], max_batches=batches, prefetch_batches=batches + 2,
                    prefetch_bytes=1 << 34, config_yaml=open(sys.argv[4]).read(), **kwargs)
first = c.next()  # the stream is open: wait until every batch is queued in the client
deadline = time.monotonic() + 120
while c.stats()["batches"] < batches and time.monotonic() < deadline:
    time.sleep(0.05)
queued = c.stats()["batches"]
times = []
kept = []
for _ in range(batches - 1):
    t0 = time.perf_counter_ns()
    b = c.next()
    times.append(time.perf_counter_ns() - t0)
    kept.append(b)  # dropping them is not part of next()
print(json.dumps({"times_ns": times, "queued": queued, "tensors": len(conveyor.tensors(first)),
                  "module": getattr(conveyor, "_lib", None) and conveyor._lib.path or
                  conveyor.Client.__module__}))
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cli", default=str(ROOT / "build" / "tools" / "conveyor"))
    p.add_argument("--package", action="append", required=True,
                   help="NAME=PYTHONPATH of a build of the package (repeat)")
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="conveyor-overhead-"))
    config = work / "config.yaml"
    config.write_text(CONFIG)
    subprocess.run([args.cli, "synth", "--out", work / "ds", "--episodes", "2",
                    "--episode-seconds", "30", "--size", "32x32", "--quiet"], check=True)
    ready = work / "ready"
    server = subprocess.Popen([args.cli, "serve", work / "ds", "--config", config, "--listen",
                               "127.0.0.1:0", "--ready-file", ready],
                              stdout=subprocess.DEVNULL, stderr=open(work / "serve.log", "w"))
    try:
        while not ready.exists():
            time.sleep(0.05)
        address = ready.read_text().split()[0]
        rows = []
        for mode in ("numpy", "dlpack"):
            for spec in args.package:
                name, path = spec.split("=", 1)
                samples = []
                info = {}
                for _ in range(args.rounds):  # a fresh process each round
                    env = dict(os.environ, PYTHONPATH=path)
                    r = subprocess.run([args.python, "-c", CHILD, address, str(args.batches), mode,
                                        str(config)], env=env, capture_output=True, text=True,
                                       check=True, timeout=300)
                    info = json.loads(r.stdout.strip().splitlines()[-1])
                    samples += info["times_ns"]
                rows.append({"package": name, "mode": mode, "tensors": info["tensors"],
                             "batches_timed": len(samples),
                             "median_us": statistics.median(samples) / 1e3,
                             "p90_us": sorted(samples)[int(0.9 * len(samples))] / 1e3,
                             "mean_us": statistics.fmean(samples) / 1e3,
                             "module": info["module"]})
        base = {r["mode"]: r for r in rows if r["package"] == args.package[0].split("=", 1)[0]}
        print(f"{'package':10s} {'mode':7s} {'tensors':>7s} {'median us':>10s} {'p90 us':>8s} "
              f"{'vs ' + args.package[0].split('=')[0]:>12s}")
        for r in rows:
            r["ratio_to_first"] = r["median_us"] / base[r["mode"]]["median_us"]
            print(f"{r['package']:10s} {r['mode']:7s} {r['tensors']:7d} {r['median_us']:10.1f} "
                  f"{r['p90_us']:8.1f} {r['ratio_to_first']:12.2f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"rows": rows, "batches": args.batches,
                                                   "rounds": args.rounds,
                                                   "python": args.python}, indent=1))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
