#!/usr/bin/env python3
"""Multi-process JAX against a Conveyor server: global arrays equal the offline global batch, and
an Orbax checkpoint taken at one process count restores at others and continues the same global
sample sequence (issue 41 item 3; docs/python.md "Multi-process JAX").

  tools/jax_multiprocess_check.py --dataset DS [--config examples/pipeline.yaml]
      [--processes 2] [--restore-processes 4,1] [--devices-per-process 2] [--steps 3]
      [--more-steps 3] [--json OUT]

Starts `conveyor serve DS` (or uses --servers), then:
  1. --processes processes joined with jax.distributed.initialize on 127.0.0.1, each with
     --devices-per-process CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=N,
     JAX_PLATFORMS=cpu), each streaming its consumer slice (conveyor.jax.loader) through
     conveyor.jax.prefetch_to_device, --steps global batches; then an Orbax checkpoint of the
     loader's state after the last trained batch (conveyor.jax.orbax_save_args);
  2. for each count of --restore-processes, as many processes restore that checkpoint
     (conveyor.jax.restore_loader) and run --more-steps global batches.
Every process checks each global array's shards it holds (addressable_shards) against the same
rows of the global batch a one-consumer stream of the same job sequence gives (a reference
loader resumed at the same state); this launcher checks that the shards of all processes cover
every row, that each reference batch's digest is `conveyor batches --digest`'s at its cursor
(so the reference is the offline pipeline's batch), and that the restored runs' cursors continue
right after the checkpointed batch. Nothing crosses processes but the checkpoint, so the check
needs no collectives. Prints one JSON summary; exit status 0 when every check passed.

With the GPU image's jax (and orbax) this runs the real thing (tools/device_check.sh);
--standin DIR puts a stand-in jax first on the workers' PYTHONPATH (python/tests/jax_standin,
which runs it on a machine without jax: python/tests/jax_multiprocess_check_test.py).
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASE_TIMEOUT_S = 240


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, help="the dataset (for the offline digests)")
    p.add_argument("--config", default=str(ROOT / "examples" / "pipeline.yaml"))
    p.add_argument("--servers", default=None,
                   help="a server of --dataset with --config (default: start one)")
    p.add_argument("--cli", default=os.environ.get("CONVEYOR_CLI", "conveyor"))
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--restore-processes", default="4,1",
                   help="comma-separated process counts restoring the checkpoint")
    p.add_argument("--devices-per-process", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="global batches before the checkpoint")
    p.add_argument("--more-steps", type=int, default=3, help="global batches after a restore")
    p.add_argument("--prefetch", type=int, default=2, help="prefetch_to_device's size")
    p.add_argument("--standin", default=None, help="a stand-in jax's directory (tests)")
    p.add_argument("--json", default=None)
    p.add_argument("--workdir", default=None, help="checkpoints and logs (default: a temp dir)")
    # A worker (started by the launcher): one process of a phase.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    p.add_argument("--process-id", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--num-processes", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)
    p.add_argument("--restore", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def digest(batch):
    """`conveyor batches --digest`'s sha256 (tools/batch_line.cc): per tensor in batch order,
    "name|dtype|d0,d1,...," and its bytes; the "_" metadata keys left out."""
    import numpy as np

    h = hashlib.sha256()
    for name, array in batch.items():
        if name.startswith("_"):
            continue
        array = np.ascontiguousarray(array)
        h.update(f"{name}|{array.dtype.name}|{''.join(f'{d},' for d in array.shape)}".encode())
        h.update(array.tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------- worker


def rows_of(index, n):
    start, stop, _ = index[0].indices(n)
    return [start, stop]


def worker(args):
    import jax

    try:  # multi-process CPU collectives (Orbax's barriers) through gloo where jax has the knob
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, KeyError, ValueError):
        pass
    jax.distributed.initialize(coordinator_address=args.coordinator,
                               num_processes=args.num_processes, process_id=args.process_id)
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, PartitionSpec

    import conveyor
    import conveyor.jax as cj

    pid = jax.process_index()
    if (pid, jax.process_count()) != (args.process_id, args.num_processes):
        raise SystemExit(f"jax says process {pid} of {jax.process_count()}, launched as "
                         f"{args.process_id} of {args.num_processes}")
    mesh = Mesh(np.array(jax.devices()), ("data",))
    spec = PartitionSpec("data")
    job = f"mp-{args.phase}"
    batches = cj.loader(servers=args.servers, job=job, config=args.config)
    # The reference: one consumer of the whole global batch, its own job, at the same state.
    reference = conveyor.Loader(servers=args.servers, job=f"{job}-ref{pid}", rank=0,
                                world_size=1, config=args.config)
    mngr = ocp.CheckpointManager(os.path.abspath(args.workdir + "/ckpt"),
                                 options=ocp.CheckpointManagerOptions(max_to_keep=1))
    restored_step = None
    if args.restore:
        restored_step = mngr.latest_step()
        if restored_step is None:
            raise SystemExit(f"no checkpoint in {args.workdir}/ckpt to restore")
        r = mngr.restore(restored_step, args=ocp.args.Composite(loader=cj.orbax_restore_args()))
        cj.restore_loader(batches, r.loader)
        cj.restore_loader(reference, r.loader)
    steps = args.more_steps if args.restore else args.steps
    out = {"phase": args.phase, "process": pid, "processes": jax.process_count(),
           "devices": len(jax.devices()), "local_devices": len(jax.local_devices()),
           "jax": getattr(jax, "__version__", "?"), "restored_step": restored_step,
           "batches": []}
    ref_it = iter(reference)
    last = None
    for n, g in enumerate(cj.prefetch_to_device(batches, mesh, spec, size=args.prefetch)):
        if n == steps:
            break
        ref = next(ref_it)
        meta = {k: g.pop(k) for k in cj._CURSOR_KEYS if k in g}
        cursor = [int(x) for x in meta["_cursor"]]
        if cursor != [int(x) for x in ref["_cursor"]]:
            raise SystemExit(f"process {pid}: global batch {n} is at cursor {cursor}, the "
                             f"reference at {list(ref['_cursor'])}")
        rows = {}
        for name, array in g.items():
            want = ref[name]
            if tuple(array.shape) != tuple(want.shape):
                raise SystemExit(f"process {pid}, cursor {cursor}, tensor {name}: global shape "
                                 f"{tuple(array.shape)}, the global batch's {tuple(want.shape)}")
            rows[name] = []
            for shard in array.addressable_shards:
                r = rows_of(shard.index, want.shape[0])
                got = np.asarray(shard.data)
                if not np.array_equal(got, want[tuple(shard.index)]):
                    raise SystemExit(f"process {pid}, cursor {cursor}, tensor {name}: the shard "
                                     f"on {shard.device} (rows {r[0]}..{r[1]}) differs from "
                                     f"those rows of the global batch")
                rows[name].append(r)
        out["batches"].append({"cursor": cursor, "reference_sha256": digest(ref), "rows": rows,
                               "samples": int(ref["_ids"].shape[0])})
        last = meta
    if len(out["batches"]) != steps:
        raise SystemExit(f"process {pid}: the stream ended after {len(out['batches'])} of "
                         f"{steps} global batches")
    if not args.restore:
        mngr.save(args.steps, args=ocp.args.Composite(
            loader=cj.orbax_save_args(batches, after=last)))
        mngr.wait_until_finished()
        out["saved_state"] = batches.state_dict(after=last)
    batches.close()
    reference.close()
    with open(os.path.join(args.workdir, f"{args.phase}-p{pid}.json"), "w") as f:
        json.dump(out, f)
    return 0


# -------------------------------------------------------------------------------- launcher


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def offline_lines(args, steps):
    """{(epoch, step): sha256} of `conveyor batches --digest` (one consumer: the global batch)."""
    r = subprocess.run([args.cli, "batches", args.dataset, "--config", args.config, "--steps",
                        str(steps), "--digest"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"conveyor batches exited with {r.returncode}:\n{r.stderr[-2000:]}")
    out = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^(\d+):(\d+) consumer \d+/\d+ samples \d+ .*sha256 ([0-9a-f]{64})", line)
        if m:
            out[(int(m.group(1)), int(m.group(2)))] = m.group(3)
    if len(out) != steps:
        raise SystemExit(f"conveyor batches printed {len(out)} batches, not {steps}")
    return out


def run_phase(args, phase, processes, restore, servers):
    """Starts `processes` workers joined through a coordinator on 127.0.0.1; their results."""
    coordinator = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                          f" --xla_force_host_platform_device_count={args.devices_per_process}").strip())
    if args.standin:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.standin, env.get("PYTHONPATH")) if p)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "JAX_COORDINATOR_ADDRESS"):
        env.pop(k, None)
    env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "OMPI_"))}
    procs = []
    for pid in range(processes):
        cmd = [sys.executable, __file__, "--worker", "--phase", phase, "--process-id", str(pid),
               "--num-processes", str(processes), "--coordinator", coordinator,
               "--servers", servers, "--config", args.config, "--dataset", args.dataset,
               "--workdir", args.workdir, "--steps", str(args.steps),
               "--more-steps", str(args.more_steps), "--prefetch", str(args.prefetch)]
        if restore:
            cmd.append("--restore")
        log = open(os.path.join(args.workdir, f"{phase}-p{pid}.log"), "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    errors = []
    for pid, (p, log) in enumerate(procs):
        try:
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
            errors.append(f"{phase} process {pid}: no result in {PHASE_TIMEOUT_S} s")
        log.close()
        if rc != 0:
            tail = Path(log.name).read_text(errors="replace")[-1500:]
            errors.append(f"{phase} process {pid} exited with {rc}:\n{tail}")
    results = []
    for pid in range(processes):
        path = Path(args.workdir) / f"{phase}-p{pid}.json"
        if path.exists():
            results.append(json.loads(path.read_text()))
    return results, errors


def check_phase(results, processes, first_cursor_of, offline, errors):
    """The launcher's checks of one phase: every row of every tensor covered once, the same
    cursors on every process, each reference the offline batch. Returns the phase's cursors."""
    if len(results) != processes:
        errors.append(f"{len(results)} of {processes} processes reported")
        return []
    cursors = [tuple(b["cursor"]) for b in results[0]["batches"]]
    for r in results[1:]:
        if [tuple(b["cursor"]) for b in r["batches"]] != cursors:
            errors.append(f"process {r['process']} trained cursors "
                          f"{[b['cursor'] for b in r['batches']]}, process 0 {cursors}")
    for i, cursor in enumerate(cursors):
        want = offline.get(cursor)
        for r in results:
            b = r["batches"][i]
            if b["reference_sha256"] != want:
                errors.append(f"process {r['process']}: the reference batch at {cursor} has "
                              f"sha256 {b['reference_sha256'][:16]}, `conveyor batches` "
                              f"{(want or 'none')[:16]}")
        names = results[0]["batches"][i]["rows"].keys()
        samples = results[0]["batches"][i]["samples"]
        for name in names:
            covered = sorted(tuple(x) for r in results for x in r["batches"][i]["rows"][name])
            pos = 0
            for a, b in covered:
                if a != pos:
                    errors.append(f"cursor {cursor}, tensor {name}: rows {pos}..{a} not held by "
                                  f"any process, or held twice (shards {covered})")
                    break
                pos = b
            else:
                if pos != samples:
                    errors.append(f"cursor {cursor}, tensor {name}: shards end at row {pos} of "
                                  f"{samples}")
    if cursors and first_cursor_of is not None and cursors[0] != first_cursor_of:
        errors.append(f"the first global batch is at {cursors[0]}, expected {first_cursor_of}")
    return cursors


def launcher(args):
    own_workdir = args.workdir is None
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="jax_mp_")
    os.makedirs(args.workdir, exist_ok=True)
    restore_counts = [int(x) for x in args.restore_processes.split(",") if x]
    server = None
    try:
        servers = args.servers
        if not servers:
            ready = Path(args.workdir) / "ready"
            server = subprocess.Popen(
                [args.cli, "serve", args.dataset, "--config", args.config, "--listen",
                 "127.0.0.1:0", "--ready-file", str(ready)],
                stdout=open(Path(args.workdir) / "serve.log", "w"), stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 60
            while not ready.exists() and server.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if not ready.exists():
                raise SystemExit("conveyor serve did not start:\n" +
                                 (Path(args.workdir) / "serve.log").read_text()[-2000:])
            servers = ready.read_text().split()[0]
        offline = offline_lines(args, args.steps + args.more_steps)
        order = sorted(offline)
        summary = {"processes": args.processes, "restore_processes": restore_counts,
                   "devices_per_process": args.devices_per_process, "steps": args.steps,
                   "more_steps": args.more_steps, "standin": bool(args.standin), "phases": []}
        errors = []
        results, errs = run_phase(args, "save", args.processes, False, servers)
        errors += errs
        cursors = check_phase(results, args.processes, order[0], offline, errors)
        summary["phases"].append({"phase": "save", "processes": args.processes,
                                  "cursors": cursors,
                                  "jax": results[0]["jax"] if results else None,
                                  "devices": results[0]["devices"] if results else None})
        for n in restore_counts:
            phase = f"restore{n}"
            results, errs = run_phase(args, phase, n, True, servers)
            errors += errs
            cursors = check_phase(results, n, order[args.steps], offline, errors)
            summary["phases"].append({"phase": phase, "processes": n, "cursors": cursors,
                                      "devices": results[0]["devices"] if results else None})
            if cursors != order[args.steps:args.steps + args.more_steps]:
                errors.append(f"{phase}: cursors {cursors}, the global sequence continues "
                              f"{order[args.steps:args.steps + args.more_steps]}")
        summary["passed"] = not errors
        summary["errors"] = errors
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        if own_workdir and args.json is None:
            shutil.rmtree(args.workdir, ignore_errors=True)
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    for e in errors:
        print(f"jax_multiprocess_check: {e}", file=sys.stderr)
    return 0 if summary["passed"] else 1


def main(argv=None):
    args = parse_args(argv)
    return worker(args) if args.worker else launcher(args)


if __name__ == "__main__":
    sys.exit(main())
