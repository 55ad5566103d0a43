#!/usr/bin/python3
"""What Python costs on top of the C++ client: conveyor.Loader beside `conveyor fetch --stats`,
the same batches from the same server, in one run.

  PYTHONPATH=build/python /usr/bin/python3 python/examples/bench_loader.py \
      --cli build/tools/conveyor --dataset /tmp/bench_ds --steps 60 --lowdim-steps 3000

Starts `conveyor serve` on the dataset (synthesized first when the folder does not exist) with two
configs: examples/pipeline.yaml (3 cameras of 224x224, audio, state, actions: ~31 MB batches) and
a low-dim one (state and a 50-step action chunk: small batches, so per-batch costs show). For each
config it streams the same cursor range with `conveyor fetch --stats` and with conveyor.Loader,
alternating (fetch, loader, fetch, loader), and prints batches/s, MB/s and, for the Loader, the
time per batch spent outside the C++ client's wait (wrapping the batch into numpy arrays, the
generator, the loop).
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import conveyor

SOURCE_DIR = Path(__file__).resolve().parents[2]
LOWDIM_YAML = """\
anchor: action
streams:
  observation.state:
    delta_timestamps: [0.0]
    normalize: mean_std
  action:
    delta_timestamps: {start: 0.0, step: 0.02, count: 50}
    normalize: min_max
pipeline:
  global_batch_size: 32
  seed: 0
"""
FETCH = re.compile(r"fetch: (\d+) batches, (\d+) samples in ([\d.]+) s = ([\d.]+) samples/s, "
                   r"([\d.]+) MB/s")


def serve(cli, dataset, configs, workdir):
    ready = workdir / "ready"
    log = open(workdir / "serve.log", "w")
    cmd = [cli, "serve", dataset] + sum((["--config", c] for c in configs), []) + [
        "--listen", "127.0.0.1:0", "--ready-file", ready]
    p = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            log_text = (workdir / "serve.log").read_text()
            raise SystemExit(f"conveyor serve did not start:\n{log_text}")
        time.sleep(0.05)
    return p, ready.read_text().split()[0]


def run_fetch(cli, address, config_name, steps, cursor):
    r = subprocess.run([str(cli), "fetch", "--servers", address, "--config-name", config_name,
                        "--steps", str(steps), "--cursor", cursor, "--stats"],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"conveyor fetch failed:\n{r.stderr}")
    m = FETCH.search(r.stderr)
    if not m:
        raise SystemExit(f"no stats line from conveyor fetch:\n{r.stderr}")
    batches, seconds, mbps = int(m.group(1)), float(m.group(3)), float(m.group(5))
    return {"batches": batches, "seconds": seconds, "batches_s": batches / seconds, "mb_s": mbps}


def run_loader(address, config_name, steps, cursor):
    loader = conveyor.Loader(servers=[address], job="bench", config_name=config_name,
                             start=cursor, max_batches=steps)
    n = 0
    in_next = 0.0
    t_start = time.perf_counter()
    it = iter(loader)
    waited = 0.0
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:  # the end of the stream, and closing the client: not per batch
            break
        in_next += time.perf_counter() - t0
        waited = loader.stats()["wait_seconds"]  # the C++ Next()'s waiting, so far
        n += 1
        del batch
    seconds = time.perf_counter() - t_start
    s = loader.stats()
    # Time in next() that the C++ client did not spend waiting for a batch: the Python side
    # (and waking up after the wait).
    overhead = max(0.0, in_next - waited)
    return {"batches": n, "seconds": seconds, "batches_s": n / seconds,
            "mb_s": s["bytes"] / 1e6 / seconds, "overhead_us": overhead / max(n, 1) * 1e6,
            "wait_s": s["wait_seconds"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cli", default=str(SOURCE_DIR / "build" / "tools" / "conveyor"))
    p.add_argument("--dataset", required=True, help="dataset folder (synthesized if missing)")
    p.add_argument("--steps", type=int, default=60, help="batches per run, pipeline.yaml")
    p.add_argument("--lowdim-steps", type=int, default=3000, help="batches per run, low-dim")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()

    dataset = Path(args.dataset)
    if not dataset.exists():
        subprocess.run([args.cli, "synth", "--out", str(dataset), "--episodes", "8",
                        "--episode-seconds", "10", "--quiet"], check=True)
    with tempfile.TemporaryDirectory(prefix="conveyor_bench_") as d:
        d = Path(d)
        (d / "lowdim.yaml").write_text(LOWDIM_YAML)
        server, address = serve(args.cli, dataset,
                                [SOURCE_DIR / "examples" / "pipeline.yaml", d / "lowdim.yaml"], d)
        try:
            print(f"server {address}, dataset {dataset}, {os.cpu_count()} CPUs; "
                  f"conveyor {conveyor.__version__}")
            print(f"{'config':10} {'client':22} {'batches':>7} {'s':>7} {'batches/s':>10} "
                  f"{'MB/s':>8} {'py us/batch':>11}")
            for name, steps in [("pipeline", args.steps), ("lowdim", args.lowdim_steps)]:
                for r in range(args.rounds):
                    cursor = f"{r + 1}:0"  # a fresh range per round, the same for both clients
                    for label, fn in [("conveyor fetch --stats",
                                       lambda: run_fetch(args.cli, address, name, steps, cursor)),
                                      ("conveyor.Loader",
                                       lambda: run_loader(address, name, steps, cursor))]:
                        m = fn()
                        extra = f"{m['overhead_us']:11.1f}" if "overhead_us" in m else f"{'':11}"
                        print(f"{name:10} {label:22} {m['batches']:7d} {m['seconds']:7.2f} "
                              f"{m['batches_s']:10.1f} {m['mb_s']:8.1f} {extra}", flush=True)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
