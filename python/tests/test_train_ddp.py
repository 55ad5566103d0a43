"""python/examples/train_ddp.py: 2 DDP ranks (gloo, CPU) trained from a real `conveyor serve`.

  - 6 steps: both ranks finish, every loss is finite, rank r sees consumer r of 2 at cursors
    0:0 .. 0:5;
  - resume: 3 steps saving a checkpoint, then --resume for 3 more: the cursors continue at 0:3,
    and the losses are those of the 6-step run (model, optimizer and data position restored).

Ranks are started with torch.multiprocessing.spawn (the script's --nproc): Debian 12's
`torch.distributed.run` (torch 1.13) fails under Python 3.11.
"""

import math
import os
import re
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

import conveyor_test_support as support

try:
    import torch  # noqa: F401
    import torch.distributed as dist
    HAVE_DDP = dist.is_available() and dist.is_gloo_available()
except ImportError:  # pragma: no cover
    HAVE_DDP = False

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train_ddp.py"
STEP = re.compile(r"^rank (\d+) step (\d+) cursor (\d+):(\d+) consumer (\d+)/(\d+) samples (\d+) "
                  r"loss (\S+) data_wait_ms (\S+) step_ms (\S+)$")
DONE = re.compile(r"^rank (\d+) done steps (\d+) cursor (\d+):(\d+)")
ENV = {}


def setUpModule():
    if not HAVE_DDP:
        return
    support.start_watchdog()
    d = Path(tempfile.mkdtemp(prefix="conveyor_pyddp_"))
    unittest.addModuleCleanup(shutil.rmtree, d, ignore_errors=True)
    dataset = support.synth(d / "ds")
    server = support.Server(dataset, d)
    unittest.addModuleCleanup(server.stop)
    ENV.update(dir=d, server=server)


def tearDownModule():
    support.stop_watchdog()


@unittest.skipUnless(HAVE_DDP, "torch with gloo is not installed (Debian: python3-torch)")
class TrainDdpTest(unittest.TestCase):
    def train(self, *args):
        env = dict(os.environ, CONVEYOR_SERVERS=ENV["server"].address, OMP_NUM_THREADS="1")
        for k in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"]:
            env.pop(k, None)
        r = support.run([sys.executable, SCRIPT, "--nproc", 2, "--device", "cpu", *args],
                        check=False, env=env, timeout=240)
        self.assertEqual(r.returncode, 0, f"train_ddp.py failed:\n{r.stdout[-3000:]}\n"
                                          f"{r.stderr[-5000:]}")
        steps = {0: [], 1: []}
        done = {}
        for line in r.stdout.splitlines():
            m = STEP.match(line)
            if m:
                rank = int(m.group(1))
                steps[rank].append({"step": int(m.group(2)),
                                    "cursor": (int(m.group(3)), int(m.group(4))),
                                    "consumer": (int(m.group(5)), int(m.group(6))),
                                    "samples": int(m.group(7)), "loss": float(m.group(8)),
                                    "wait_ms": float(m.group(9))})
            m = DONE.match(line)
            if m:
                done[int(m.group(1))] = (int(m.group(2)), (int(m.group(3)), int(m.group(4))))
        return steps, done, r.stdout

    def check(self, steps, done, first_step, count, out):
        for rank in (0, 1):
            s = steps[rank]
            self.assertEqual([x["step"] for x in s], list(range(first_step + 1,
                                                               first_step + count + 1)), out)
            self.assertEqual([x["cursor"] for x in s],
                             [(0, k) for k in range(first_step, first_step + count)], out)
            self.assertTrue(all(x["consumer"] == (rank, 2) for x in s), out)
            self.assertTrue(all(x["samples"] == 16 for x in s), out)
            self.assertTrue(all(math.isfinite(x["loss"]) for x in s), out)
            self.assertEqual(done[rank], (first_step + count, (0, first_step + count)), out)

    def test_six_steps_and_resume(self):
        """6 steps in one run; then 3 steps saving a checkpoint and 3 more resumed from it: the
        resumed run continues the cursors at 0:3 and, model, optimizer and data all restored,
        repeats the uninterrupted run's losses."""
        steps, done, out = self.train("--steps", 6)
        self.check(steps, done, 0, 6, out)
        straight = {r: [x["loss"] for x in steps[r]] for r in (0, 1)}
        print(f"\n  losses rank 0: {straight[0]}", file=sys.stderr)

        ckpt = ENV["dir"] / "ckpt.pt"
        steps, done, out = self.train("--steps", 3, "--checkpoint", ckpt)
        self.check(steps, done, 0, 3, out)
        self.assertTrue(ckpt.exists())
        first = {r: [x["loss"] for x in steps[r]] for r in (0, 1)}
        steps, done, out = self.train("--steps", 3, "--checkpoint", ckpt, "--resume")
        self.check(steps, done, 3, 3, out)
        self.assertIn("starts at cursor 0:3 (step 3)", out)
        for r in (0, 1):
            resumed = first[r] + [x["loss"] for x in steps[r]]
            for a, b in zip(resumed, straight[r]):
                self.assertAlmostEqual(a, b, delta=1e-4 * max(1.0, abs(b)),
                                       msg=f"rank {r}: {resumed} vs {straight[r]}")

if __name__ == "__main__":
    unittest.main()
