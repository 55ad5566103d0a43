"""tools/jax_multiprocess_check.py against the stand-in jax (python/tests/jax_standin) and a real
`conveyor serve`: 2 processes of 2 CPU devices each stream their consumer slices into global
arrays equal to the offline global batch, an Orbax checkpoint (the stand-in's) taken at 2
processes restores at 4 and at 1 and continues the same global sequence; and a mesh whose device
order is not the processes' fails the check. Its own ctest (jax_multiprocess_check_test); with
the GPU image's real jax, tools/device_check.sh runs the same script.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import conveyor_test_support as support

TOOL = support.SOURCE_DIR / "tools" / "jax_multiprocess_check.py"
STANDIN = Path(__file__).resolve().parent / "jax_standin"
ENV = {}


def setUpModule():
    support.start_watchdog()
    d = Path(tempfile.mkdtemp(prefix="conveyor_jax_mp_"))
    ENV["dir"] = d
    support.synth(d / "ds", episodes=2, seconds=3)


def tearDownModule():
    shutil.rmtree(ENV["dir"], ignore_errors=True)
    support.stop_watchdog()


def run_check(name, *extra, env=None):
    out = ENV["dir"] / f"{name}.json"
    r = subprocess.run([sys.executable, TOOL, "--dataset", ENV["dir"] / "ds", "--cli",
                        support.CLI, "--standin", STANDIN, "--workdir", ENV["dir"] / name,
                        "--json", out, *map(str, extra)],
                       capture_output=True, text=True, timeout=400,
                       env=dict(os.environ, **(env or {})))
    return r, json.loads(out.read_text())


class JaxMultiprocessCheckTest(unittest.TestCase):
    def test_two_processes_then_restored_at_four_and_one(self):
        r, summary = run_check("ok")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertTrue(summary["passed"], summary["errors"])
        self.assertEqual([(p["phase"], p["processes"], p["devices"]) for p in summary["phases"]],
                         [("save", 2, 4), ("restore4", 4, 8), ("restore1", 1, 2)])
        self.assertEqual([p["cursors"] for p in summary["phases"]],
                         [[[0, 0], [0, 1], [0, 2]], [[0, 3], [0, 4], [0, 5]],
                          [[0, 3], [0, 4], [0, 5]]])

    def test_a_mesh_out_of_process_order_fails(self):
        r, summary = run_check("reversed", "--restore-processes", "",
                               env={"JAX_STANDIN_DEVICES_REVERSED": "1"})
        self.assertEqual(r.returncode, 1)
        self.assertFalse(summary["passed"])
        self.assertRegex("\n".join(summary["errors"]),
                         r"differs from those rows of the global batch")


if __name__ == "__main__":
    unittest.main()
