"""float16 and bfloat16 tensors through the C ABI and the Python package (docs/python.md,
docs/sampling.md "Tensor dtypes"), from a real `conveyor serve` of the shard that
tests/fixtures/tensor_dtype/make_tensor_dtype.py writes (its reference bits: numpy's
`astype(np.float16)`, torch's `.to(torch.bfloat16)`).

Checks: numpy arrays of dtype float16, and bfloat16 as ml_dtypes.bfloat16 or (without ml_dtypes,
as on Debian 12) uint16 bits; the bytes are the references'; the batch's digest, with bfloat16
named as the C library names it, equals `conveyor batches --digest`; to_torch() and the DLPack
exports give torch.float16 and torch.bfloat16 with the same bits; the C ABI's codes are 4 and 5.
"""

import ctypes
import hashlib
import importlib.util
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

import numpy as np

import conveyor
import conveyor_test_support as support
from conveyor import _lib

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

STEPS = 3
CONFIG = """anchor: f32.npy
streams:
  f32.npy: {shape: stored, dtype: bfloat16}
  f16.npy: {shape: stored, dtype: stored}
  f64.npy: {dtype: float16}
pipeline:
  global_batch_size: 2
  seed: 3
"""
ENV = {}


def setUpModule():
    support.start_watchdog()
    d = Path(tempfile.mkdtemp(prefix="conveyor_pydtypes_"))
    unittest.addModuleCleanup(shutil.rmtree, d, ignore_errors=True)
    subprocess.run(["/usr/bin/python3",
                    str(support.SOURCE_DIR / "tests/fixtures/tensor_dtype/make_tensor_dtype.py"),
                    str(d / "fx")], check=True, timeout=support.SUBPROCESS_TIMEOUT_S)
    config = d / "half.yaml"
    config.write_text(CONFIG)
    dataset = d / "fx" / "wds"
    server = support.Server(dataset, d, configs=(config,), extra=("--threads", "1"))
    unittest.addModuleCleanup(server.stop)
    ENV.update(dir=d, address=server.address,
               ref=support.cli_batches(dataset, STEPS, config=config))


def tearDownModule():
    support.stop_watchdog()


def expected(episode, kind):
    return (ENV["dir"] / "fx" / "expected" / f"{episode}.{kind}").read_bytes()


def digest(batch, names):
    """The CLI's digest (conveyor_test_support.digest) with each tensor's dtype named as the C
    library names it (`names`: bfloat16 has no numpy name of its own)."""
    h = hashlib.sha256()
    for name, array in batch.items():
        if name.startswith("_"):
            continue
        dims = "".join(f"{d}," for d in array.shape)
        h.update(f"{name}|{names.get(name, array.dtype.name)}|{dims}".encode())
        h.update(array.tobytes())
    return h.hexdigest()


class DTypeTest(unittest.TestCase):
    def test_numpy_arrays_hold_the_reference_bits(self):
        has_ml_dtypes = importlib.util.find_spec("ml_dtypes") is not None
        with conveyor.Client(servers=[ENV["address"]], max_batches=STEPS) as c:
            for want in ENV["ref"]:
                batch = c.next()
                self.assertEqual(batch["_cursor"], want["cursor"])
                f16, f32, f64 = batch["f16.npy"], batch["f32.npy"], batch["f64.npy"]
                self.assertEqual(f16.dtype, np.float16)
                self.assertEqual(f64.dtype, np.float16)
                self.assertEqual(f32.dtype.name, "bfloat16" if has_ml_dtypes else "uint16")
                self.assertEqual(f16.shape, (2, 4, 8))
                self.assertEqual(f32.shape, (2, 4, 8))
                for k, (_, episode, _) in enumerate(batch["_ids"]):
                    self.assertEqual(f16[k].tobytes(), expected(episode, "f16.bits"))
                    self.assertEqual(f32[k].tobytes(), expected(episode, "f32.bf16"))
                self.assertEqual(digest(batch, {"f32.npy": "bfloat16"}), want["sha256"])

    @unittest.skipIf(torch is None, "needs python3-torch")
    def test_torch_and_dlpack_read_float16_and_bfloat16(self):
        with conveyor.Client(servers=[ENV["address"]], max_batches=1) as c:
            batch = c.next()
            t = conveyor.to_torch(batch)
            self.assertEqual(t["f32.npy"].dtype, torch.bfloat16)
            self.assertEqual(t["f16.npy"].dtype, torch.float16)
            self.assertEqual(t["f32.npy"].data_ptr(), batch["f32.npy"].ctypes.data)  # no copy
            episode = int(batch["_ids"][0][1])
            want = torch.from_numpy(np.frombuffer(expected(episode, "f32.f32"), np.float32)
                                    .reshape(4, 8).copy()).to(torch.bfloat16)
            self.assertTrue(torch.equal(t["f32.npy"][0].view(torch.int16), want.view(torch.int16)))
        with conveyor.Client(servers=[ENV["address"]], max_batches=1, dlpack=True) as c:
            batch = c.next()
            tensors = {k: v for k, v in batch.items() if not k.startswith("_")}
            self.assertEqual(tensors["f32.npy"].dtype, "bfloat16")
            self.assertEqual(tensors["f16.npy"].dtype, "float16")
            # The C ABI's element type codes (conveyor_c.h CONVEYOR_FLOAT16, CONVEYOR_BFLOAT16).
            names = list(tensors)
            info = tensors["f32.npy"]._batch.tensor(names.index("f32.npy"))
            self.assertEqual(info.dtype, 5)
            self.assertEqual(tensors["f16.npy"]._batch.tensor(names.index("f16.npy")).dtype, 4)
            bf16 = torch.from_dlpack(tensors["f32.npy"])
            f16 = torch.from_dlpack(tensors["f16.npy"])
            self.assertEqual(bf16.dtype, torch.bfloat16)
            self.assertEqual(f16.dtype, torch.float16)
            for k, (_, episode, _) in enumerate(batch["_ids"]):
                self.assertEqual(bf16[k].view(torch.int16).numpy().tobytes(),
                                 expected(episode, "f32.bf16"))
                self.assertEqual(f16[k].numpy().tobytes(), expected(episode, "f16.bits"))


if __name__ == "__main__":
    unittest.main()
