"""python/examples/train_torch_policy.py and train_jax_policy.py against a real `conveyor serve`
(python/examples/policy.yaml: two cameras, the state, a 50-step action chunk).

Here (no GPU) the PyTorch example runs its loop on the CPU with a tiny model: it trains, writes
its JSON (per-step attribution, samples/s and frames/s, the loader's state after the last step),
and its samples and frames agree with the config. The JAX example needs jax, flax and optax
(Debian 12 packages none): it runs where they are installed (the GPU machine, through
tools/device_check.sh) and is skipped here, saying so; its training loop (train_jax_policy.train,
where it waits for the device and how it times the loader) runs here against the stand-in jax of
python/tests/jax_standin with a stand-in step. The GPU figures come from tools/device_check.sh on
the GPU machine.
"""

import contextlib
import importlib
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import time
import unittest
from pathlib import Path
from unittest import mock

import conveyor
import conveyor_test_support as support
import numpy as np

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
POLICY_YAML = EXAMPLES / "policy.yaml"
STANDIN = Path(__file__).resolve().parent / "jax_standin"
TINY = ["--width", "4", "--blocks", "1,1", "--crop", "64", "--hidden", "32"]
ENV = {}

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_JAX = all(importlib.util.find_spec(m) is not None for m in ("jax", "flax", "optax"))


def setUpModule():
    support.start_watchdog()
    d = Path(tempfile.mkdtemp(prefix="conveyor_policy_"))
    unittest.addModuleCleanup(shutil.rmtree, d, ignore_errors=True)
    support.run([support.CLI, "synth", "--out", d / "ds", "--episodes", 2, "--cameras", 2,
                 "--episode-seconds", 4, "--quiet"])
    server = support.Server(d / "ds", d, configs=(POLICY_YAML,))
    unittest.addModuleCleanup(server.stop)
    ENV.update(dir=d, server=server)


def tearDownModule():
    support.stop_watchdog()


@contextlib.contextmanager
def standin_jax():
    """(the stand-in jax, the train_jax_policy module) imported from python/tests/jax_standin;
    sys.modules and sys.path are as they were afterwards."""
    with mock.patch.dict(sys.modules), \
            mock.patch.object(sys, "path", [str(STANDIN), str(EXAMPLES)] + sys.path):
        for name in [m for m in sys.modules
                     if m.split(".")[0] in ("jax", "orbax", "train_jax_policy")]:
            del sys.modules[name]
        yield importlib.import_module("jax"), importlib.import_module("train_jax_policy")


def run_example(script, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"]:
        env.pop(k, None)
    return support.run([sys.executable, EXAMPLES / script, "--servers", ENV["server"].address,
                        *args], env=env, timeout=300)


class PolicyExamplesTest(unittest.TestCase):
    @unittest.skipUnless(HAVE_TORCH, "torch is not installed (Debian: python3-torch)")
    def test_torch_policy_trains_and_attributes_its_steps(self):
        out = ENV["dir"] / "torch.json"
        run_example("train_torch_policy.py", "--device", "cpu", "--steps", 5, "--warmup", 1,
                    "--json", out, *TINY)
        report = json.loads(out.read_text())
        steps, summary = report["steps"], report["summary"]
        self.assertEqual([s["step"] for s in steps], [0, 1, 2, 3, 4])
        batch = 64  # policy.yaml's global batch, one rank
        for s in steps:
            self.assertTrue(math.isfinite(s["loss"]), s)
            self.assertEqual(s["samples"], batch)
            self.assertEqual(s["frames"], 2 * batch)  # two cameras, one frame each
            for key in ("data_wait_ms", "h2d_ms", "compute_ms", "step_ms"):
                self.assertGreaterEqual(s[key], 0.0, key)
            self.assertLessEqual(s["data_wait_ms"] + s["compute_ms"], s["step_ms"] + 1.0)
        self.assertEqual(summary["delivery"], "host")  # no GPU here
        self.assertEqual(summary["state"]["cursor"], [0, 5])
        self.assertGreater(summary["frames_per_s"], 0)
        self.assertAlmostEqual(summary["frames_per_s"], 2 * summary["samples_per_s"], places=6)
        self.assertGreater(summary["loader"]["batches"], 0)

    def test_jax_policy_loop_waits_for_the_device_only_where_a_trainer_does(self):
        """train_jax_policy.train against the stand-in jax and a real server: the steps are
        dispatched without waiting, the host waits (reads the loss) at every log_every-th step,
        the warm-up's last and the last; data_wait is the host's time in the loader's next()
        (a loader slowed by 30 ms shows it), make_global_batch's host time is apart from it, and
        the state after the last trained batch (prefetched batches ahead of it) resumes after
        it."""
        with standin_jax() as (jax, example):
            import conveyor.jax as cj

            mesh = jax.sharding.Mesh(jax.devices(), ("data",))
            replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            seen = []

            def step(carry, g):  # a step dispatched: its loss is a device value, not yet read
                seen.append({k: v.shape for k, v in g.items()})
                loss = jax.make_array_from_process_local_data(
                    replicated, np.array([carry], np.float32))
                return carry + 1, loss

            batches = cj.loader(servers=[ENV["server"].address], job="jax-loop")
            slow_from = 4

            def slowed():  # the loader running dry from the 5th batch on
                for n, b in enumerate(batches):
                    if n >= slow_from:
                        time.sleep(0.03)
                    yield b

            blocks = jax.standin_blocks()
            logged = []
            carry, records, last, secs = example.train(
                slowed(), mesh, jax.sharding.PartitionSpec("data"), step, 0, steps=7, warmup=2,
                log_every=3, prefetch=2, frames_per_sample=2, log=logged.append)
            self.assertEqual(carry, 7)
            self.assertEqual(jax.standin_blocks() - blocks, 4)
            self.assertEqual([r["step"] for r in records if "loss" in r], [1, 2, 5, 6])
            self.assertEqual(logged, [r for r in records if "loss" in r])
            self.assertEqual([r["loss"] for r in logged], [1.0, 2.0, 5.0, 6.0])
            for shapes in seen:  # global arrays, the metadata left out
                self.assertEqual(sorted(shapes), sorted(k for k in shapes if not k.startswith("_")))
                self.assertEqual(shapes["action"][0], 64)
                self.assertEqual(shapes["cam0"][:2], (64, 1))
            for r in records:
                self.assertEqual((r["samples"], r["frames"]), (64, 128))
                for key in ("data_wait_ms", "make_global_batch_ms", "dispatch_ms", "step_ms"):
                    self.assertGreaterEqual(r[key], 0.0, key)
                self.assertLessEqual(r["data_wait_ms"] + r["make_global_batch_ms"]
                                     + r["dispatch_ms"], r["step_ms"] + 0.5)
            # Step 0 takes batches 0..2 (two ahead); step i >= 1 takes batch i + 2; batches from
            # slow_from on waited 30 ms each in the loader.
            for r in records[1:]:
                if r["step"] + 2 >= slow_from:
                    self.assertGreaterEqual(r["data_wait_ms"], 30.0, r)
            # Resumed after the last trained batch (the loader itself is two batches further):
            # the 8th batch of the job's sequence.
            state = batches.state_dict(after=last)
            self.assertNotEqual(tuple(state["cursor"]), tuple(batches.cursor))
            want = list(conveyor.Loader(servers=[ENV["server"].address], job="jax-loop-ref",
                                        max_batches=8))[7]
            resumed = conveyor.Loader(servers=[ENV["server"].address], job="jax-loop-resumed",
                                      max_batches=1)
            resumed.load_state_dict(state)
            got = next(iter(resumed))
            np.testing.assert_array_equal(got["_ids"], want["_ids"])
            summary = example.summarize(records, 2, secs, len(jax.devices()))
            self.assertEqual((summary["steps"], summary["measured_steps"], summary["blocks"]),
                             (7, 5, 3))
            self.assertGreater(summary["frames_per_s_per_gpu"], 0)
            self.assertAlmostEqual(summary["frames_per_s_per_gpu"],
                                   2 * summary["samples_per_s_per_gpu"], places=6)
            self.assertGreater(summary["data_wait_fraction"], 0)
            self.assertLessEqual(summary["data_wait_fraction"], 1.0)
            batches.close()
            cj._SHARDINGS.clear()

    @unittest.skipUnless(HAVE_JAX, "jax, flax and optax are not installed (Debian 12 packages "
                         "none): the JAX example runs on the GPU machine (tools/device_check.sh)")
    def test_jax_policy_trains(self):  # pragma: no cover - not on Debian 12
        out = ENV["dir"] / "jax.json"
        run_example("train_jax_policy.py", "--steps", 4, "--warmup", 1, "--json", out, *TINY)
        report = json.loads(out.read_text())
        self.assertEqual(len(report["steps"]), 4)
        self.assertTrue(all(math.isfinite(s["loss"]) for s in report["steps"] if "loss" in s))
        self.assertIn("loss", report["steps"][-1])
        self.assertEqual(report["summary"]["state"]["cursor"], [0, 4])


if __name__ == "__main__":
    unittest.main()
