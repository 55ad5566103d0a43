"""Shared by the Python package's tests: the CLI, a synthetic dataset, a real `conveyor serve`, and
the batch digest of `conveyor batches --digest` (tools/batch_line.cc) computed from numpy arrays.

The conveyor binary comes from $CONVEYOR_CLI (ctest sets it), else build/tools/conveyor of this
repository; the package from PYTHONPATH (ctest: build/python).
"""

import faulthandler
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

SOURCE_DIR = Path(os.environ.get("CONVEYOR_SOURCE_DIR", Path(__file__).resolve().parents[2]))
CLI = Path(os.environ.get("CONVEYOR_CLI", SOURCE_DIR / "build" / "tools" / "conveyor"))
PIPELINE_YAML = SOURCE_DIR / "examples" / "pipeline.yaml"

SUBPROCESS_TIMEOUT_S = 180
READY_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
MODULE_TIMEOUT_S = 420  # a watchdog per test module: a hang prints every thread's stack and exits

LINE = re.compile(r"^(\d+):(\d+) consumer (\d+)/(\d+) samples (\d+) ids (\S+) sha256 ([0-9a-f]{64})"
                  r"(?: \[(.*)\])?$")


def start_watchdog():
    faulthandler.dump_traceback_later(MODULE_TIMEOUT_S, exit=True)


def stop_watchdog():
    faulthandler.cancel_dump_traceback_later()


def run(cmd, check=True, **kwargs):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       timeout=kwargs.pop("timeout", SUBPROCESS_TIMEOUT_S), **kwargs)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited with {r.returncode}:\n"
                           f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r


def synth(out, episodes=2, seconds=3):
    run([CLI, "synth", "--out", out, "--episodes", episodes, "--episode-seconds", seconds,
         "--quiet"])
    return out


def _parse_id(text):
    """"E/S" -> (E, S); a mixture's later datasets print "D:E/S" -> (D, E, S)."""
    dataset, _, rest = text.rpartition(":")
    episode, step = rest.split("/")
    return (int(dataset), int(episode), int(step)) if dataset else (int(episode), int(step))


def parse_lines(text):
    """[{cursor: (e, s), consumer, consumers, samples, sha256, ids: [(episode, step), ...]}]."""
    out = []
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        ids = None
        if m.group(8) is not None:
            ids = [_parse_id(p) for p in m.group(8).split()]
        out.append({"cursor": (int(m.group(1)), int(m.group(2))), "consumer": int(m.group(3)),
                    "consumers": int(m.group(4)), "samples": int(m.group(5)),
                    "sha256": m.group(7), "ids": ids})
    return out


def cli_batches(dataset, steps, consumer=0, consumers=1, cursor="0:0", config=PIPELINE_YAML,
                extra=()):
    """What `conveyor batches --digest --ids` says every batch is."""
    r = run([CLI, "batches", dataset, "--config", config, "--steps", steps, "--consumer", consumer,
             "--consumers", consumers, "--cursor", cursor, "--digest", "--ids", *extra])
    lines = parse_lines(r.stdout)
    if len(lines) != steps:
        raise RuntimeError(f"conveyor batches printed {len(lines)} lines, not {steps}:\n{r.stdout}")
    return lines


def cli_fetch(address, steps, consumer=0, consumers=1, cursor="0:0", extra=()):
    r = run([CLI, "fetch", "--servers", address, "--steps", steps, "--consumer", consumer,
             "--consumers", consumers, "--cursor", cursor, "--digest", "--ids", *extra])
    return parse_lines(r.stdout), r.stderr


def digest(batch):
    """SHA-256 over, per tensor in batch order, "name|dtype|d0,d1,...," and the raw bytes: the
    `sha256` field of `conveyor batches --digest` (tools/batch_line.cc). Takes numpy arrays or
    torch tensors; keys starting with "_" are metadata and left out."""
    h = hashlib.sha256()
    for name, array in batch.items():
        if name.startswith("_"):
            continue
        if hasattr(array, "numpy"):  # torch
            array = array.numpy()
        dims = "".join(f"{d}," for d in array.shape)
        h.update(f"{name}|{array.dtype.name}|{dims}".encode())
        h.update(array.tobytes())
    return h.hexdigest()


def summary(batch):
    """The fields of a CLI line, from a Loader batch."""
    ids, datasets = batch["_ids"], batch["_dataset"]
    if hasattr(ids, "numpy"):
        ids, datasets = ids.numpy(), datasets.numpy()
    return {"cursor": tuple(int(x) for x in batch["_cursor"]), "consumer": int(batch["_consumer"]),
            "consumers": int(batch["_consumers"]), "samples": len(ids), "sha256": digest(batch),
            "ids": [(int(d), int(e), int(s)) if d else (int(e), int(s))
                    for (_, e, s), d in zip(ids, datasets)]}


class Server:
    """A real `conveyor serve` on a free loopback port; stop() drains it with SIGTERM."""

    def __init__(self, dataset, workdir, configs=(PIPELINE_YAML,), extra=()):
        workdir = Path(workdir)
        ready = workdir / "ready"
        self.log_path = workdir / "serve.log"
        self.log = open(self.log_path, "w+")
        cmd = [str(CLI), "serve", str(dataset)]
        for c in configs:
            cmd += ["--config", str(c)]
        cmd += ["--listen", "127.0.0.1:0", "--ready-file", str(ready), *map(str, extra)]
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"conveyor serve exited with {self.process.returncode} before "
                                   f"it was ready:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"conveyor serve not ready after {READY_TIMEOUT_S} s:\n"
                                   f"{self.tail()}")
            time.sleep(0.05)
        self.address = ready.read_text().split()[0]

    def tail(self):
        self.log.flush()
        return self.log_path.read_text()[-4000:]

    def stop(self):
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
                    print(f"conveyor serve ignored SIGTERM for {STOP_TIMEOUT_S} s; killed",
                          file=sys.stderr)
        finally:
            self.log.close()
