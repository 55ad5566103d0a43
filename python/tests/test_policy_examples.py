"""python/examples/train_torch_policy.py and train_jax_policy.py against a real `conveyor serve`
(python/examples/policy.yaml: two cameras, the state, a 50-step action chunk).

Here (no GPU) the PyTorch example runs its loop on the CPU with a tiny model: it trains, writes
its JSON (per-step attribution, samples/s and frames/s, the loader's state after the last step),
and its samples and frames agree with the config. The JAX example needs jax, flax and optax
(Debian 12 packages none): it runs where they are installed (the GPU machine, through
tools/device_check.sh) and is skipped here, saying so. The GPU figures come from
tools/device_check.sh on the GPU machine.
"""

import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

import conveyor_test_support as support

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
POLICY_YAML = EXAMPLES / "policy.yaml"
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

    @unittest.skipUnless(HAVE_JAX, "jax, flax and optax are not installed (Debian 12 packages "
                         "none): the JAX example runs on the GPU machine (tools/device_check.sh)")
    def test_jax_policy_trains(self):  # pragma: no cover - not on Debian 12
        out = ENV["dir"] / "jax.json"
        run_example("train_jax_policy.py", "--steps", 4, "--warmup", 1, "--json", out, *TINY)
        report = json.loads(out.read_text())
        self.assertEqual(len(report["steps"]), 4)
        self.assertTrue(all(math.isfinite(s["loss"]) for s in report["steps"]))
        self.assertEqual(report["summary"]["state"]["cursor"], [0, 4])


if __name__ == "__main__":
    unittest.main()
