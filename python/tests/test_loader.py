"""conveyor.Loader and conveyor.Client against a real `conveyor serve` on a synthetic dataset.

  CONVEYOR_CLI=build/tools/conveyor PYTHONPATH=build/python \
      /usr/bin/python3 -m unittest discover -s python/tests -v

Checks: batches equal `conveyor batches --digest` and `conveyor fetch --digest` (same SHA-256 over
the numpy arrays); arrays are views of the received buffers (no copy), also through torch
(from_numpy, from_dlpack, DataLoader); arrays outlive the loader; state_dict() resumes exactly;
DataLoader(batch_size=None); next() releases the GIL; RANK/WORLD_SIZE pick the consumer slice;
errors carry the server's message; device="cpu" is the default and unchanged, device="cuda:N"
without a usable GPU is an error naming the device and why, tensors exported through DLPack
(dlpack=True) are the received bytes, and, on a GPU, device batches equal the CLI's.
"""

import gc
import importlib.util
import json
import os
import re
import shutil
import socket
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings
from pathlib import Path
from unittest import mock

import numpy as np

import conveyor
import conveyor_test_support as support

try:
    import torch
    import torch.utils.data
except ImportError:  # pragma: no cover
    torch = None

REF_STEPS = 6
ENV = {}  # filled by setUpModule: dir, dataset, server, address, ref, ref_1of2


def setUpModule():
    support.start_watchdog()
    d = Path(tempfile.mkdtemp(prefix="conveyor_pyloader_"))
    unittest.addModuleCleanup(shutil.rmtree, d, ignore_errors=True)
    dataset = support.synth(d / "ds")
    server = support.Server(dataset, d)
    unittest.addModuleCleanup(server.stop)
    ENV.update(dir=d, dataset=dataset, server=server, address=server.address,
               ref=support.cli_batches(dataset, REF_STEPS),
               ref_1of2=support.cli_batches(dataset, 2, consumer=1, consumers=2))


def tearDownModule():
    support.stop_watchdog()


def loader(**kwargs):
    kwargs.setdefault("servers", [ENV["address"]])
    kwargs.setdefault("reconnect_timeout_s", 30)
    return conveyor.Loader(**kwargs)


def round_up(n, to=64):
    return (n + to - 1) // to * to


class BatchesTest(unittest.TestCase):
    def test_batches_equal_cli_digests(self):
        """(a) The Loader's batches hash to what `conveyor batches` and `conveyor fetch` print."""
        want = ENV["ref"][:4]
        fetched, _ = support.cli_fetch(ENV["address"], 4)
        self.assertEqual(fetched, want, "conveyor fetch --digest == conveyor batches --digest")
        got = [support.summary(b) for b in loader(max_batches=4)]
        self.assertEqual(got, want)
        # The same config sent inline (a path, read and sent as YAML), and servers from a string.
        got = [support.summary(b) for b in conveyor.Loader(
            servers=f" {ENV['address']} ,", config=str(support.PIPELINE_YAML), max_batches=2)]
        self.assertEqual(got, want[:2])
        # Payloads striped over two more connections (docs/serving.md "Striped payloads").
        striped = loader(max_batches=3, shared_memory=False, payload_streams=2, max_message_bytes=1 << 20)
        self.assertEqual([support.summary(b) for b in striped], want[:3])
        self.assertEqual(striped.stats()["transport"], "grpc_striped")

    def test_batch_layout_and_metadata(self):
        b = next(iter(loader(max_batches=1)))
        names = [k for k in b if k not in conveyor.METADATA_KEYS]
        self.assertEqual(list(b)[:len(names)], names, "tensors first, in batch order")
        self.assertEqual(b["_cursor"], (0, 0))
        self.assertEqual(b["_next"], (0, 1))
        self.assertEqual((b["_consumer"], b["_consumers"]), (0, 1))
        self.assertEqual(b["_server"], ENV["address"])
        self.assertEqual(b["_ids"].dtype, np.int64)
        self.assertEqual(b["_ids"].shape, (32, 3))
        self.assertEqual(b["cam0"].dtype, np.uint8)
        self.assertEqual(b["cam0"].shape, (32, 2, 224, 224, 3))
        self.assertEqual(b["action"].dtype, np.float32)
        self.assertEqual(b["action_is_pad"].dtype, np.bool_)
        for name in names:
            self.assertTrue(b[name].flags.c_contiguous, name)
            self.assertTrue(b[name].flags.aligned, name)
            self.assertTrue(b[name].flags.writeable, name)

    def test_start_cursor(self):
        for start in [(0, 5), "0:5"]:
            b = next(iter(loader(start=start, max_batches=1)))
            self.assertEqual(support.summary(b), ENV["ref"][5], start)
        with self.assertRaises(ValueError):
            loader(start="5")

    def test_end_of_stream_and_client(self):
        self.assertEqual(len(list(loader(max_batches=2))), 2)
        c = conveyor.Client(servers=[ENV["address"]], max_batches=2, start=(0, 1))
        self.assertEqual(c.cursor(), (0, 1))
        self.assertEqual(support.summary(c.next()), ENV["ref"][1])
        self.assertEqual(support.summary(next(c)), ENV["ref"][2])
        self.assertEqual(c.cursor(), (0, 3))
        with self.assertRaises(StopIteration):
            c.next()
        s = c.stats()
        self.assertEqual(s["batches"], 2)
        self.assertEqual(s["server"], ENV["address"])
        self.assertGreater(s["bytes"], 0)
        c.close()
        self.assertTrue(c.closed)
        with self.assertRaises(conveyor.ConveyorError) as e:
            c.next()
        self.assertEqual(e.exception.code, "FAILED_PRECONDITION")

    def test_info(self):
        info = conveyor.info([ENV["address"]])
        self.assertEqual(info["episodes"], 2)
        self.assertEqual(info["configs"][0]["global_batch_size"], 32)
        self.assertEqual(info["configs"][0]["name"], "pipeline")
        # 64-bit fields are ints as the library writes them (no list of them kept in Python).
        self.assertIsInstance(info["max_message_bytes"], int)
        self.assertIsInstance(info["configs"][0]["samples_per_epoch"], int)
        self.assertTrue(all(isinstance(d, int) for s in info["streams"] for d in s["shape"]))


class TypedPackageTest(unittest.TestCase):
    """The package's layout and what it takes from the C library instead of restating it."""

    def test_layout_and_py_typed(self):
        from conveyor import Client, ConveyorError, Loader, Tensor  # noqa: F401  (documented)
        self.assertEqual(Loader.__module__, "conveyor._loader")
        self.assertIs(conveyor.Loader, Loader)
        for name in conveyor.__all__:
            self.assertTrue(hasattr(conveyor, name), name)
        self.assertTrue((Path(conveyor.__file__).parent / "py.typed").is_file(),
                        "py.typed beside the package (PEP 561)")

    def test_defaults_come_from_the_library(self):
        import inspect
        defaults = conveyor.client_defaults()
        self.assertEqual(defaults["job"], "default")
        self.assertEqual(defaults["device"], -1)
        self.assertIsInstance(defaults["reconnect_timeout_s"], float)
        # Every option Client names is one the library has a default for (dlpack is Python's).
        named = [p.name for p in inspect.signature(conveyor.Client).parameters.values()
                 if p.kind == p.KEYWORD_ONLY]
        self.assertEqual([n for n in named if n not in defaults], ["dlpack"])
        # A Loader given none of them holds the library's values.
        l = conveyor.Loader(servers=[ENV["address"]])
        self.assertEqual((l.job, l.max_batches, l.prefetch, l.prefetch_bytes,
                          l.reconnect_timeout_s),
                         (defaults["job"], defaults["max_batches"], defaults["prefetch_batches"],
                          defaults["prefetch_bytes"], defaults["reconnect_timeout_s"]))
        # The whole object is accepted back as options, and streams (a numpy integer coerced).
        options = dict(defaults, servers=[ENV["address"]], max_batches=np.int64(1))
        with conveyor.Client(**options) as c:
            self.assertEqual(support.summary(c.next()), ENV["ref"][0])

    def test_cursor_text_is_the_librarys_parser(self):
        l = loader(start="0@64")
        self.assertEqual((l.cursor, l.position), ((0, 0), 64))
        l = loader(start="1:2")
        self.assertEqual((l.cursor, l.position), ((1, 2), None))
        # 20 digits overflow 64 bits: refused here as by `conveyor batches --cursor`.
        for bad in ("0:10000000000000000000", "0:1:2", "+1:0", "1@"):
            with self.assertRaisesRegex(ValueError, f"cursor '{re.escape(bad)}'"):
                loader(start=bad)


class ZeroCopyTest(unittest.TestCase):
    def test_views_of_received_buffers(self):
        """(b) Arrays are views of the batch block the C++ client received the payload into: no
        copy in Python, the tensors where the payload puts them, whether the server sent the batch
        in one message, split into many, or wrote it into the client's shared-memory ring."""
        # One message per batch; the server's 4 MiB messages; the same-host ring (one header
        # message, the payload viewed in the region the server handed the client).
        for max_message, shm in [(64 << 20, False), (0, False), (0, True)]:
            l = loader(max_batches=1, max_message_bytes=max_message, shared_memory=shm)
            batch = next(iter(l))
            stats = l.stats()
            messages = stats["messages"]
            self.assertEqual(stats["transport"], "shared_memory" if shm else "grpc")
            self.assertEqual(stats["shared_memory_batches"], 1 if shm else 0)
            if max_message or shm:
                self.assertEqual(messages, 1)
            else:
                self.assertGreater(messages, 1)
            arrays = conveyor.tensors(batch)
            bases = {id(a.base) for a in arrays.values()}
            self.assertEqual(len(bases), 1, "one owner (the batch's storage) for all arrays")
            for name, a in arrays.items():
                self.assertFalse(a.flags.owndata, name)
                # The base is one array over the received block, whose own base holds the
                # C library's batch handle (freed with the last view).
                self.assertIsInstance(a.base, np.ndarray, name)
                self.assertEqual(type(a.base.base).__name__, "_Batch", name)
                self.assertEqual(a.ctypes.data % 64, 0, name)
            # The tensors lie in one buffer exactly as in the batch payload (64-byte aligned
            # offsets, in order): the received batch, viewed in place.
            items = list(arrays.items())
            for (name, a), (next_name, b) in zip(items, items[1:]):
                self.assertEqual(b.ctypes.data - a.ctypes.data, round_up(a.nbytes),
                                 f"{next_name} follows {name} in the received payload")
            self.assertEqual(support.digest(batch), ENV["ref"][0]["sha256"])
        if torch is None:
            self.skipTest("torch is not installed")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. torch's warning about non-writable arrays
            for name, a in arrays.items():
                self.assertEqual(torch.from_numpy(a).data_ptr(), a.ctypes.data, name)
                # numpy 1.24 exports no bool through DLPack: view the bytes, then as bool.
                dl = torch.from_dlpack(a.view(np.uint8) if a.dtype == np.bool_ else a)
                self.assertEqual(dl.data_ptr(), a.ctypes.data, name)
            t = conveyor.to_torch(batch)
            self.assertEqual(t["cam1"].data_ptr(), arrays["cam1"].ctypes.data)
            self.assertEqual(t["_cursor"], (0, 0))
        # Shared, not copied: a write through torch shows in numpy.
        a = arrays["action"]
        before = float(a[0, 0, 0])
        torch.from_dlpack(a)[0, 0, 0] += 1.0
        self.assertEqual(float(a[0, 0, 0]), before + 1.0)

    def test_arrays_outlive_the_loader(self):
        """(c) The storage lives as long as any array: delete the loader, collect, churn memory."""
        for max_message in [0, 64 << 20]:
            l = loader(max_batches=3, max_message_bytes=max_message)
            it = iter(l)
            batch = next(it)
            next(it)  # the client has moved on, and may reuse its buffers
            kept = {"cam2": batch["cam2"], "action": batch["action"],
                    "audio_is_pad": batch["audio_is_pad"]}
            want = support.digest(kept)
            del it, l, batch
            gc.collect()
            churn = [np.full(16 << 20, i, dtype=np.uint8) for i in range(8)]
            other = [support.digest(b) for b in loader(max_batches=2, start=(0, 4))]
            del churn
            gc.collect()
            self.assertEqual(support.digest(kept), want, f"max_message_bytes {max_message}")
            self.assertEqual(other, [r["sha256"] for r in ENV["ref"][4:6]])


class DeviceTest(unittest.TestCase):
    def test_cpu_is_the_default_and_unchanged(self):
        for device in [None, "cpu"] + ([torch.device("cpu")] if torch is not None else []):
            kwargs = {} if device is None else {"device": device}
            l = loader(max_batches=2, **kwargs)
            self.assertEqual(l.device, "cpu")
            batches = list(l)
            self.assertEqual([support.summary(b) for b in batches], ENV["ref"][:2], device)
            self.assertIsInstance(batches[0]["cam0"], np.ndarray)
        for bad in ["gpu", "cuda:x", "cuda:-1", 3]:
            with self.assertRaises(ValueError, msg=repr(bad)):
                loader(device=bad)

    def test_cuda_without_a_usable_gpu_is_a_clear_error(self):
        if conveyor.device_supported():
            self.skipTest("a GPU is usable here: DeviceTest.test_cuda_batches checks it")
        for device, name in [("cuda:0", "cuda:0"), ("cuda:3", "cuda:3"), ("cuda", "cuda:0")]:
            with self.assertRaises(conveyor.ConveyorError) as e:
                loader(device=device)
            self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
            message = str(e.exception)
            self.assertIn(name, message)
            self.assertIn("no usable GPU", message)
            # Why: the build (CONVEYOR_CUDA=OFF) or the CUDA runtime's own error.
            self.assertTrue("built without CUDA" in message or "cudaGetDeviceCount" in message,
                            message)
        with self.assertRaises(conveyor.ConveyorError) as e:  # the Client refuses the same way
            conveyor.Client(servers=[ENV["address"]], device=0)
        self.assertEqual(e.exception.code, "FAILED_PRECONDITION")

    def test_dlpack_exports_of_host_batches(self):
        """dlpack=True: each tensor a conveyor.Tensor whose DLPack export is the received bytes
        (no copy), readable by numpy and torch, alive as long as any export is."""
        c = conveyor.Client(servers=[ENV["address"]], max_batches=2, dlpack=True)
        batch = c.next()
        tensors = conveyor.tensors(batch)
        self.assertEqual(list(batch)[:len(tensors)], list(tensors), "tensors first, in order")
        hosts = {}
        for name, t in tensors.items():
            self.assertIsInstance(t, conveyor.Tensor)
            self.assertEqual(t.name, name)
            self.assertEqual(t.__dlpack_device__(), (1, 0))  # kDLCPU
            h = t.host
            self.assertEqual(h.shape, t.shape)
            self.assertEqual(h.dtype.name, t.dtype)
            hosts[name] = h
            exported = t.as_uint8() if t.dtype == "bool" else t
            a = np.from_dlpack(exported)
            self.assertEqual(a.ctypes.data, h.ctypes.data, name)
            self.assertTrue(np.array_equal(a, h.view(np.uint8) if t.dtype == "bool" else h), name)
        self.assertEqual(support.summary(dict(batch, **hosts)), ENV["ref"][0])
        with self.assertRaises(BufferError):
            tensors["action"].__dlpack__(copy=True)
        with self.assertRaises(BufferError):
            tensors["action"].__dlpack__(dl_device=(2, 0))
        tensors["action"].__dlpack__()  # a capsule nobody consumes frees its reference
        if torch is None:
            c.close()
            return
        kept = {}
        for name, t in tensors.items():
            x = torch.from_dlpack(t.as_uint8() if t.dtype == "bool" else t)
            self.assertEqual(x.data_ptr(), hosts[name].ctypes.data, name)
            kept[name] = x.view(torch.bool) if t.dtype == "bool" else x
        want = support.digest(hosts)
        del batch, tensors, hosts, t, a, h, exported
        c.next()  # the client moves on and may reuse its blocks
        c.close()
        del c
        gc.collect()
        churn = [np.full(16 << 20, i, dtype=np.uint8) for i in range(8)]
        del churn
        self.assertEqual(support.digest(kept), want, "torch's DLPack tensors keep the batch")

    def test_cuda_batches(self):
        """On a GPU: Loader(device="cuda:0") yields torch tensors on it, equal to the CLI's
        batches, ordered on torch's current stream."""
        if not conveyor.device_supported():
            self.skipTest("no usable GPU here (conveyor.device_supported() is false): "
                          "device delivery is checked on the GPU machine")
        if torch is None or not torch.cuda.is_available():
            self.skipTest("torch without CUDA")
        l = loader(max_batches=4, device="cuda:0")
        got = []
        for b in l:
            for name, t in conveyor.tensors(b).items():
                self.assertTrue(t.is_cuda, name)
                self.assertEqual(t.device, torch.device("cuda:0"), name)
            self.assertEqual(b["action_is_pad"].dtype, torch.bool)
            got.append(support.summary({k: (v.cpu() if k not in conveyor.METADATA_KEYS else v)
                                        for k, v in b.items()}))
        self.assertEqual(got, ENV["ref"][:4])


class DeviceFramesTest(unittest.TestCase):
    """conveyor.video.DeviceFrames: the served batches' video decoded on NVDEC in this process.
    Everywhere: the config's refusals and, without NVDEC, why. On a GPU: the frames of served
    batches, on the device, equal the served CPU frames within docs/nvdec.md's tolerance, with
    the same padding flags."""

    # examples/pipeline.yaml's cam0, which the module's server serves decoded on the CPU.
    CONFIG = ("anchor: action\nstreams:\n  cam0:\n    delta_timestamps: [-0.1, 0.0]\n"
              "    size: [224, 224]\n")

    def config(self, name, text):
        path = ENV["dir"] / name
        path.write_text(text)
        return path

    def test_refusals_name_the_stream_and_why(self):
        from conveyor import video
        bad = self.config("frames_bad.yaml", self.CONFIG + "    augment:\n      hflip: 0.5\n")
        with self.assertRaises(conveyor.ConveyorError) as e:
            video.DeviceFrames(ENV["dataset"], bad)
        self.assertEqual(e.exception.code, "UNIMPLEMENTED")
        self.assertIn("cam0", str(e.exception))
        self.assertIn("augment", str(e.exception))
        with self.assertRaises(ValueError):
            video.DeviceFrames(ENV["dataset"], bad, device="cpu")
        good = self.config("frames.yaml", self.CONFIG)
        with self.assertRaises(conveyor.ConveyorError) as e:
            video.DeviceFrames(ENV["dataset"], good, streams=["cam9"])
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        try:
            video.DeviceFrames(ENV["dataset"], good).close()
        except conveyor.ConveyorError as e:
            self.assertEqual(e.code, "FAILED_PRECONDITION")
            self.assertIn("NVDEC cannot be used on device 0", str(e))

    # What libconveyor_c.so.1 must not bring into a trainer (tests/capi_needed_test.sh reads the
    # same from the library's DT_NEEDED); here, what the process really maps.
    DATA_PATH = ("libconveyor_video", "libavcodec", "libavformat", "libswscale", "libturbojpeg",
                 "libcurl", "libyaml-cpp", "libcudart")

    def test_import_conveyor_loads_only_the_client(self):
        # torch is kept out: `import conveyor` imports it where it is installed (a torch
        # IterableDataset), and Debian's torch itself maps FFmpeg and curl.
        script = ("import sys\n"
                  "sys.modules['torch'] = None\n"
                  "import conveyor\n"
                  "print(open('/proc/self/maps').read())\n"
                  "print('=====')\n"
                  "from conveyor import video\n"
                  "video._library()\n"
                  "print(open('/proc/self/maps').read())\n")
        out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                             text=True, timeout=120).stdout
        after_import, after_video = out.split("=====")
        for name in self.DATA_PATH:
            self.assertNotIn(name, after_import, f"import conveyor mapped {name}")
        self.assertIn("libconveyor_video.so.1", after_video)

    def test_without_the_video_library_says_where_it_looked(self):
        package = Path(conveyor.__file__).resolve().parent
        with tempfile.TemporaryDirectory() as d:
            shutil.copytree(package, Path(d) / "conveyor", symlinks=False,
                            ignore=shutil.ignore_patterns("libconveyor_video*", "__pycache__"))
            script = ("import conveyor\n"
                      "from conveyor import video\n"
                      "try:\n"
                      "    video.DeviceFrames('ds', 'c.yaml')\n"
                      "except conveyor.ConveyorError as e:\n"
                      "    print(e.code); print(e)\n")
            env = {k: v for k, v in os.environ.items()
                   if k not in ("CONVEYOR_LIBRARY", "CONVEYOR_VIDEO_LIBRARY")}
            env["PYTHONPATH"] = d
            # In `d`: the working directory comes first on sys.path, and ctest's holds the build
            # tree's package.
            out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                                 text=True, timeout=120, env=env, cwd=d).stdout
        if not out.startswith("FAILED_PRECONDITION"):
            self.skipTest(f"libconveyor_video.so.1 is on this machine's loader path: {out[:200]}")
        self.assertIn("cannot load libconveyor_video.so.1", out)
        self.assertIn(str(Path(d).resolve() / "conveyor" / "lib"), out)

    def test_served_batches_decoded_on_the_device(self):
        from conveyor import video
        if torch is None or not torch.cuda.is_available():
            self.skipTest("torch without CUDA")
        try:
            frames = video.DeviceFrames(ENV["dataset"], self.config("frames.yaml", self.CONFIG),
                                        device="cuda:0", sessions=4)
        except conveyor.ConveyorError as e:
            self.skipTest(f"no NVDEC here: {e}")
        self.assertEqual(frames.tensors[0]["name"], "cam0")
        worst, n = 99.0, 0
        for b in loader(max_batches=3):
            got = frames.decode(b)
            cam = got["cam0"]
            self.assertTrue(cam.is_cuda)
            self.assertEqual(tuple(cam.shape), b["cam0"].shape)
            self.assertEqual(cam.dtype, torch.uint8)
            np.testing.assert_array_equal(got["cam0_is_pad"], b["cam0_is_pad"])
            host = cam.cpu().numpy().astype(np.float64)
            want = b["cam0"].astype(np.float64)
            for i in range(host.shape[0]):
                mse = np.mean((host[i] - want[i]) ** 2)
                worst = min(worst, 99.0 if mse == 0 else 10 * np.log10(255 ** 2 / mse))
                n += 1
        print(f"DeviceFrames vs served CPU frames: {n} samples, worst PSNR {worst:.1f} dB, "
              f"stats {frames.stats()}")
        self.assertGreater(worst, 35.0)  # full size: docs/nvdec.md measures 45-49 dB
        frames.close()


class StateTest(unittest.TestCase):
    def test_state_dict_round_trip(self):
        """(d) Three batches, save, a new Loader loads the state: its first batch is batch 4."""
        l = loader()
        it = iter(l)
        first = [support.summary(next(it)) for _ in range(3)]
        self.assertEqual(first, ENV["ref"][:3])
        state = l.state_dict()
        pinned = {k: state.pop(k) for k in ("dataset_fingerprint", "order_digest")}
        self.assertEqual(state, {"version": conveyor.STATE_VERSION, "cursor": [0, 3],
                                 "position": 96, "global_batch_size": 32,
                                 "schedule_version": 4, "job": "default", "rank": 0,
                                 "world_size": 1})
        self.assertRegex(pinned["dataset_fingerprint"], "^[0-9a-f]{16}$")
        self.assertRegex(pinned["order_digest"], "^[0-9a-f]{64}$")
        state.update(pinned)
        l.close()
        state = json.loads(json.dumps(state))  # plain JSON types
        resumed = loader(max_batches=1)
        resumed.load_state_dict(state)
        self.assertEqual(resumed.cursor, (0, 3))
        self.assertEqual([support.summary(b) for b in resumed], [ENV["ref"][3]])
        self.assertEqual(resumed.state_dict()["cursor"], [0, 4])
        with self.assertRaises(ValueError):
            resumed.load_state_dict({"version": 99, "cursor": [0, 0]})

    def test_a_state_pins_the_data_it_was_taken_on(self):
        """Issue 43: a state taken on dataset A, loaded against a server of dataset B (another
        dataset, or A with an episode appended), fails with FAILED_PRECONDITION naming both
        fingerprints, and trains on nothing; allow_data_change=True continues on purpose, with a
        warning; the same data resumes as before."""
        l = loader(max_batches=2)
        list(l)
        state = json.loads(json.dumps(l.state_dict()))
        l.close()
        grown = support.synth(ENV["dir"] / "grown", episodes=3)  # A's two episodes and a third
        (ENV["dir"] / "grown_run").mkdir(exist_ok=True)
        other = support.Server(grown, ENV["dir"] / "grown_run")
        try:
            stray = loader(servers=[other.address], max_batches=1)
            stray.load_state_dict(state)
            with self.assertRaises(conveyor.ConveyorError) as e:
                next(iter(stray))
            self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
            self.assertIn(state["dataset_fingerprint"], str(e.exception))
            self.assertIn("allow_data_change", str(e.exception))
            stray.close()
            on_purpose = loader(servers=[other.address], max_batches=1)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                on_purpose.load_state_dict(state, allow_data_change=True)
            self.assertTrue(any("without checking" in str(x.message) for x in w))
            self.assertEqual(len(list(on_purpose)), 1)
            self.assertNotEqual(on_purpose.state_dict()["dataset_fingerprint"], state["dataset_fingerprint"])
            on_purpose.close()
        finally:
            other.stop()
        # Another seed is another order: refused too.
        text = support.PIPELINE_YAML.read_text()
        self.assertIn("seed: 0", text)
        reseeded = loader(config=text.replace("seed: 0", "seed: 1"), max_batches=1)
        reseeded.load_state_dict(state)
        with self.assertRaises(conveyor.ConveyorError) as e:
            next(iter(reseeded))
        self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
        reseeded.close()
        same = loader(max_batches=1)
        same.load_state_dict(state)
        self.assertEqual([support.summary(b) for b in same], [ENV["ref"][2]])

    def test_resume_at_another_global_batch_size_and_world_size(self):
        """Issue 30 item 1: a job at B=32 on 2 ranks saves its state after 2 global batches
        (sample position 64); loaded by 3 ranks at B=48, the next global batch holds positions
        64..111 of the epoch's order: the same global sample sequence, nothing lost or repeated.
        The reference is one rank at B=16 (positions 0..111 in 7 batches)."""
        text = support.PIPELINE_YAML.read_text()
        self.assertIn("global_batch_size: 32", text)

        def config(batch):
            return text.replace("global_batch_size: 32", f"global_batch_size: {batch}")

        def ids(batches):
            return [int(i) for b in batches for i in b["_ids"][:, 0]]

        order = ids(loader(config=config(16), max_batches=7))
        self.assertEqual(len(order), 112)
        states, before = [], []
        for rank in range(2):
            l = loader(config=config(32), rank=rank, world_size=2, max_batches=2)
            before.append(list(l))
            states.append(json.loads(json.dumps(l.state_dict())))
        self.assertEqual(states[0]["position"], 64)
        self.assertEqual(states[0]["global_batch_size"], 32)
        self.assertEqual(states[0]["cursor"], [0, 2])
        seen = ids([before[r][s] for s in range(2) for r in range(2)])
        after = []
        for rank in range(3):
            l = loader(config=config(48), rank=rank, world_size=3, max_batches=1)
            l.load_state_dict(states[0])
            self.assertEqual(l.position, 64)
            b = next(iter(l))
            self.assertEqual((b["_cursor"], b["_position"]), ((0, 1), 64))  # step floor(64/48)
            self.assertEqual((b["_next"], b["_next_position"]), ((0, 2), 112))
            after.append(b)
            self.assertEqual(l.state_dict()["global_batch_size"], 48)
        self.assertEqual(seen + ids(after), order)
        # A state saved before positions (version 2) keeps counting steps of the config's batch
        # size, as it always did; given the batch size it was saved at, it resumes at any other.
        l = loader(config=config(48), max_batches=1)
        l.load_state_dict({"version": 2, "cursor": [0, 2], "schedule_version": 3})
        self.assertEqual(ids(l), order[96:112] + ids(loader(config=config(16), start=(0, 7),
                                                            max_batches=2)))
        l.load_state_dict({"version": 2, "cursor": [0, 2], "schedule_version": 3,
                           "global_batch_size": 32})
        self.assertEqual(ids(l), order[64:112])
        self.assertEqual(ids(loader(config=config(48), start="0@64", max_batches=1)),
                         order[64:112])

    def test_coverage_ledgers_audit_exact_and_catch_two_ranks_with_the_same_rank(self):
        """Issue 30 item 2 from Python: each rank writes {"coverage": loader.coverage()}; conveyor
        audit says EXACT for ranks 0 and 1 of 2, and names the missing slice when both ran as 0."""
        def audit(ranks, name):
            files = []
            for i, rank in enumerate(ranks):
                l = loader(rank=rank, world_size=2, max_batches=2, job=name)
                self.assertEqual(len(list(l)), 2)
                self.assertEqual([c["samples"] for c in l.coverage()], [32])
                path = ENV["dir"] / f"{name}-{i}.json"
                path.write_text(json.dumps({"coverage": l.coverage()}))
                files.append(str(path))
            return subprocess.run([str(support.CLI), "audit", str(ENV["dataset"]), "--config",
                                   str(support.PIPELINE_YAML), "--epoch", "0", "--trainer-json",
                                   *files], capture_output=True, text=True, timeout=120)

        r = audit([0, 1], "cov-right")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("EXACT, 64 samples delivered, 64 expected", r.stdout)
        r = audit([0, 0], "cov-same-rank")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("slice 0/2 at global batch 32, positions 0..63: duplicated: delivered 2 times",
                      r.stdout)
        self.assertIn("slice 1/2 at global batch 32, positions 0..63: missing: 0 of 32 samples",
                      r.stdout)

    def test_a_state_saved_before_schedule_versions_resumes_that_order(self):
        """A version-1 state (no schedule_version: saved under GOP schedule 1) resumes schedule 1:
        the batches `conveyor batches --schedule-version 1` computes, which a schedule-2 resume
        would not give; the state it saves next records the version."""
        want = support.cli_batches(ENV["dataset"], 2, cursor="0:3", extra=["--schedule-version", "1"])
        self.assertNotEqual(want, ENV["ref"][3:5], "the config's GOP schedules 1 and 2 coincide")
        resumed = loader(max_batches=2)
        resumed.load_state_dict({"version": 1, "cursor": [0, 3], "job": "default", "rank": 0,
                                 "world_size": 1})
        self.assertEqual(resumed.schedule_version, 1)
        self.assertEqual([support.summary(b) for b in resumed], want)
        self.assertEqual(resumed.state_dict()["schedule_version"], 1)
        self.assertEqual(resumed.state_dict()["cursor"], [0, 5])

    def test_iterating_again_continues(self):
        """Breaking out of a loop and iterating again continues after the last batch yielded;
        a new iteration closes the previous iterator."""
        l = loader()
        seen = []
        for b in l:
            seen.append(support.summary(b))
            if len(seen) == 2:
                break
        for b in l:
            seen.append(support.summary(b))
            break
        self.assertEqual(seen, ENV["ref"][:3])
        first = iter(l)
        self.assertEqual(support.summary(next(first)), ENV["ref"][3])
        second = iter(l)
        with self.assertRaises(StopIteration):
            next(first)  # closed by the new iteration
        self.assertEqual(support.summary(next(second)), ENV["ref"][4])
        l.close()


@unittest.skipIf(torch is None, "torch is not installed (Debian: python3-torch)")
class DataLoaderTest(unittest.TestCase):
    def test_dataloader_batch_size_none(self):
        """(e) DataLoader(loader, batch_size=None) yields the same batches, as torch tensors,
        without warnings."""
        l = loader(max_batches=4)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = list(torch.utils.data.DataLoader(l, batch_size=None))
        self.assertEqual([str(w.message) for w in caught], [])
        self.assertIsInstance(got[0]["cam0"], torch.Tensor)
        self.assertEqual(got[0]["cam0"].dtype, torch.uint8)
        self.assertEqual([support.summary(b) for b in got], ENV["ref"][:4])
        self.assertEqual(l.state_dict()["cursor"], [0, 4])

    def test_dataloader_workers_refused(self):
        l = loader(max_batches=1)
        with self.assertRaisesRegex(RuntimeError, "num_workers=0"):
            list(torch.utils.data.DataLoader(l, batch_size=None, num_workers=1))

    @unittest.skipUnless(importlib.util.find_spec("torchdata"),
                         "torchdata is not installed (Debian 12 packages no torchdata)")
    def test_stateful_dataloader(self):  # pragma: no cover - not on Debian 12
        from torchdata.stateful_dataloader import StatefulDataLoader

        dl = StatefulDataLoader(loader(), batch_size=None)
        it = iter(dl)
        for _ in range(3):
            next(it)
        state = dl.state_dict()
        dl2 = StatefulDataLoader(loader(max_batches=1), batch_size=None)
        dl2.load_state_dict(state)
        self.assertEqual([support.summary(b) for b in dl2], [ENV["ref"][3]])


class InterruptTest(unittest.TestCase):
    """A next() waiting on a server that never answers ends on Ctrl-C and on close()."""

    def dead_address(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return f"127.0.0.1:{s.getsockname()[1]}"

    def test_ctrl_c_interrupts_a_waiting_next(self):
        l = conveyor.Loader(servers=[self.dead_address()], reconnect_timeout_s=30.0)
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        t0 = time.monotonic()
        timer.start()
        with self.assertRaises(KeyboardInterrupt):
            next(iter(l))
        timer.join()
        self.assertLess(time.monotonic() - t0, 5.0, "Ctrl-C waited for the reconnect timeout")

    def test_close_from_another_thread_wakes_next(self):
        l = conveyor.Loader(servers=[self.dead_address()], reconnect_timeout_s=30.0)
        it = iter(l)
        timer = threading.Timer(0.3, l.close)
        t0 = time.monotonic()
        timer.start()
        with self.assertRaises(conveyor.ConveyorError) as e:
            next(it)
        timer.join()
        self.assertEqual(e.exception.code, "CANCELLED")
        self.assertLess(time.monotonic() - t0, 5.0)


class MixtureTest(unittest.TestCase):
    """A server started on a mixture file (docs/mixtures.md): the Loader gets what
    `conveyor batches` computes, each sample's dataset in "_dataset", the weights in every batch."""

    def test_loader_over_a_served_mixture(self):
        d = ENV["dir"]
        other = support.synth(d / "ds_other", seconds=2)
        mix = d / "mix.yaml"
        mix.write_text("mixture:\n"
                       "  name: two\n"
                       "  tag: dataset_id\n"
                       "  datasets:\n"
                       f"    - {{name: first, uri: {ENV['dataset']}, weight: 3}}\n"
                       f"    - {{name: second, uri: {other}, weight: 1, tag: 9}}\n")
        (d / "mix_run").mkdir()
        server = support.Server(mix, d / "mix_run")
        try:
            want = support.cli_batches(mix, 3)
            got = [support.summary(b) for b in conveyor.Loader(
                servers=[server.address], reconnect_timeout_s=30, max_batches=3)]
            self.assertEqual(got, want)
            b = next(iter(conveyor.Loader(servers=[server.address], reconnect_timeout_s=30,
                                          max_batches=1)))
            self.assertEqual(b["_dataset"].shape, (32,))
            self.assertEqual(int((b["_dataset"] == 0).sum()), 24)  # 3:1 of 32, in every batch
            self.assertEqual(int((b["_dataset"] == 1).sum()), 8)
            tags = np.asarray(b["dataset_id"])
            np.testing.assert_array_equal(tags, np.where(np.asarray(b["_dataset"]) == 1, 9, 0))
            self.assertEqual(conveyor.info([server.address])["dataset_name"], "two")
        finally:
            server.stop()


    def test_a_state_of_a_mixture_is_refused_when_a_member_changed(self):
        """Issue 43: a member of a mixture re-made (another episode count at the same path): a
        state saved before is refused by the new server, naming the fingerprints."""
        d = ENV["dir"]
        member = support.synth(d / "ds_member", episodes=2, seconds=2)
        mix = d / "mix_member.yaml"
        mix.write_text("mixture:\n  name: pinned\n  datasets:\n"
                       f"    - {{name: first, uri: {ENV['dataset']}, weight: 1}}\n"
                       f"    - {{name: second, uri: {member}, weight: 1}}\n")
        (d / "mix_member_run").mkdir(exist_ok=True)
        server = support.Server(mix, d / "mix_member_run")
        try:
            l = conveyor.Loader(servers=[server.address], reconnect_timeout_s=30, max_batches=1)
            list(l)
            state = l.state_dict()
        finally:
            server.stop()
        shutil.rmtree(member)
        support.synth(d / "ds_member", episodes=3, seconds=2)
        (d / "mix_member_run2").mkdir(exist_ok=True)
        server = support.Server(mix, d / "mix_member_run2")
        try:
            resumed = conveyor.Loader(servers=[server.address], reconnect_timeout_s=30, max_batches=1)
            resumed.load_state_dict(state)
            with self.assertRaises(conveyor.ConveyorError) as e:
                next(iter(resumed))
            self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
            self.assertIn(state["dataset_fingerprint"], str(e.exception))
            resumed.close()
        finally:
            server.stop()


class LeRobotInPlaceTest(unittest.TestCase):
    """A server started on a LeRobot v3.0 directory read in place (docs/lerobot.md): the Loader
    gets what `conveyor batches` computes on the same directory. The dataset is the C++ tests'
    fixture (tests/fixtures/lerobot/make_lerobot.sh: ffmpeg-encoded AV1 and H.264 cameras,
    parquet-wasm tables), made here if no other test made it first."""

    def test_loader_over_a_served_lerobot_dataset(self):
        npm_dir = os.environ.get("CONVEYOR_PARQUET_NPM_DIR")
        fixtures = os.environ.get("CONVEYOR_LEROBOT_FIXTURE_DIR")
        if not npm_dir or not fixtures or not shutil.which("node") or not shutil.which("npm"):
            self.skipTest("node/npm or the fixture directories are not available")
        support.run(["bash", support.SOURCE_DIR / "tests" / "fixtures" / "lerobot" / "make_lerobot.sh",
                     npm_dir, fixtures])
        d = ENV["dir"] / "lerobot_run"
        d.mkdir()
        config = d / "lerobot.yaml"
        config.write_text("anchor: action\n"
                          "streams:\n"
                          "  observation.images.top: {delta_timestamps: [-0.0333333, 0.0]}\n"
                          "  observation.images.wrist: {delta_timestamps: [0.0]}\n"
                          "  observation.state: {delta_timestamps: [0.0], normalize: mean_std}\n"
                          "  action: {delta_timestamps: {start: 0.0, step: 0.0333333, count: 5}}\n"
                          "  instruction: {}\n"
                          "pipeline: {global_batch_size: 8, seed: 5, schedule: {mode: gop}}\n")
        dataset = Path(fixtures) / "v30"
        os.environ["CONVEYOR_INDEX_CACHE_DIR"] = str(d / "index-cache")  # the CLI runs inherit it
        server = support.Server(dataset, d, configs=(config,))
        try:
            want = support.cli_batches(dataset, 6, config=config)
            got = [support.summary(b) for b in conveyor.Loader(
                servers=[server.address], reconnect_timeout_s=30, max_batches=6)]
            self.assertEqual(got, want)
            b = next(iter(conveyor.Loader(servers=[server.address], reconnect_timeout_s=30,
                                          max_batches=1)))
            self.assertEqual(b["observation.images.top"].shape, (8, 2, 48, 64, 3))
            self.assertEqual(b["observation.images.wrist"].shape, (8, 1, 64, 64, 3))
            self.assertEqual(b["action"].shape, (8, 5, 4))
        finally:
            server.stop()


class GilTest(unittest.TestCase):
    def test_next_releases_the_gil(self):
        """(f) While next() waits (here for a server that is not there, until
        reconnect_timeout_s), other Python threads run: the main thread's loop never stalls."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{s.getsockname()[1]}"  # closed again when the block ends
        l = conveyor.Loader(servers=[dead], reconnect_timeout_s=1.0)
        result = {}

        def wait_for_batch():
            t0 = time.monotonic()
            try:
                next(iter(l))
            except conveyor.ConveyorError as e:
                result["error"] = e
            result["seconds"] = time.monotonic() - t0

        thread = threading.Thread(target=wait_for_batch)
        count, max_gap = 0, 0.0
        thread.start()
        last = time.monotonic()
        while thread.is_alive():
            count += 1
            now = time.monotonic()
            max_gap = max(max_gap, now - last)
            last = now
        thread.join()
        self.assertIn("error", result)
        self.assertEqual(result["error"].code, "UNAVAILABLE")
        self.assertIn(dead, str(result["error"]))
        self.assertGreaterEqual(result["seconds"], 0.9, "next() waited for the reconnect timeout")
        self.assertGreater(count, 10000, "the main thread ran while next() waited")
        self.assertLess(max_gap, result["seconds"] / 3,
                        f"the main thread stalled {max_gap:.3f} s of the {result['seconds']:.3f} "
                        f"s next() waited: the GIL was held")


class RankTest(unittest.TestCase):
    def test_rank_and_world_size_from_env(self):
        """(g) RANK / WORLD_SIZE give consumer / consumers; CONVEYOR_SERVERS the servers."""
        env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
               "CONVEYOR_SERVERS": ENV["address"]}
        with mock.patch.dict(os.environ, env):
            l = conveyor.Loader(max_batches=2)
        self.assertEqual((l.rank, l.world_size, l.servers), (1, 2, [ENV["address"]]))
        got = [support.summary(b) for b in l]
        self.assertEqual(got, ENV["ref_1of2"])
        self.assertEqual(got[0]["samples"], 16)
        self.assertEqual(l.state_dict()["world_size"], 2)
        with mock.patch.dict(os.environ, {"RANK": "0"}):
            os.environ.pop("WORLD_SIZE", None)
            with self.assertRaisesRegex(ValueError, "RANK is set but WORLD_SIZE is not"):
                loader()
        self.assertEqual(loader(rank=0, world_size=4).world_size, 4)

    def test_launchers_through_the_cpp_function(self):
        """(g) The Loader takes the slice from the C++ launch function (client/launch_env.h):
        SLURM's variables in an srun task, torchrun's before them, errors naming the variables."""
        clean = {k: v for k, v in os.environ.items()
                 if not k.startswith(("SLURM_", "OMPI_")) and k not in
                 ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        slurm = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2",
                 "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2",
                 "CONVEYOR_SERVERS": ENV["address"]}
        with mock.patch.dict(os.environ, dict(clean, **slurm), clear=True):
            l = conveyor.Loader(max_batches=2)
            self.assertEqual((l.rank, l.world_size), (1, 2))
            self.assertEqual(l.launch_source, "SLURM_PROCID, SLURM_STEP_NUM_TASKS")
            self.assertEqual([support.summary(b) for b in l], ENV["ref_1of2"])
            e = conveyor.launch_env()
            self.assertEqual((e["local_rank"], e["local_world_size"]), (1, 2))
            # torchrun inside the srun task: its RANK is the slice.
            with mock.patch.dict(os.environ, {"RANK": "3", "WORLD_SIZE": "4"}):
                self.assertEqual((conveyor.Loader().rank, conveyor.Loader().world_size), (3, 4))
            with mock.patch.dict(os.environ, {"SLURM_PROCID": "2"}):
                with self.assertRaisesRegex(
                        ValueError, "SLURM_PROCID is 2 but SLURM_STEP_NUM_TASKS is 2"):
                    conveyor.Loader()
            # What jax.process_count() says is checked against what jax read (SLURM here).
            with self.assertRaisesRegex(ValueError,
                                        "jax.process_count\\(\\) is 4 but SLURM_STEP_NUM_TASKS is 2"):
                conveyor.Loader(rank=1, world_size=4, _from_jax=True)
            # Plain arguments are the caller's choice.
            self.assertEqual(conveyor.Loader(rank=3, world_size=4).world_size, 4)
        with mock.patch.dict(os.environ, clean, clear=True):
            with self.assertRaisesRegex(ValueError, "rank= is 2 but the default world size is 1"):
                conveyor.Loader(servers=[ENV["address"]], rank=2)


class ErrorTest(unittest.TestCase):
    def test_bad_config(self):
        """(h) The server's message reaches Python: file, line, the unknown key."""
        text = support.PIPELINE_YAML.read_text() + "\nbogus_key: 1\n"
        with self.assertRaises(conveyor.ConveyorError) as e:
            next(iter(loader(config=text)))
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIn("bogus_key", str(e.exception))
        self.assertIsInstance(e.exception, RuntimeError)

    def test_other_errors(self):
        with self.assertRaises(conveyor.ConveyorError) as e:
            next(iter(loader(config_name="no_such_config")))
        self.assertEqual(e.exception.code, "NOT_FOUND")
        self.assertIn("no_such_config", str(e.exception))
        with self.assertRaises(conveyor.ConveyorError) as e:
            next(iter(loader(rank=0, world_size=3)))  # 32 is not a multiple of 3
        self.assertIn("multiple", str(e.exception))
        with self.assertRaises(ValueError):
            loader(rank=2, world_size=2)
        with self.assertRaises(ValueError):
            loader(config="a: 1", config_name="pipeline")
        with self.assertRaises(FileNotFoundError):
            loader(config=str(ENV["dir"] / "missing.yaml"))
        with mock.patch.dict(os.environ, {}, clear=True):
            with self.assertRaisesRegex(ValueError, "CONVEYOR_SERVERS"):
                conveyor.Loader()
        with self.assertRaises(conveyor.ConveyorError) as e:
            conveyor.Client(servers=[ENV["address"]], consumer=2, consumers=2)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")

    def test_cursor_past_the_end_is_an_error_not_an_empty_epoch(self):
        """A checkpoint from another dataset resumes nowhere: an exception with the valid range."""
        with self.assertRaises(conveyor.ConveyorError) as e:
            list(loader(start=(0, 99999)))
        self.assertEqual(e.exception.code, "OUT_OF_RANGE")
        self.assertIn("steps (0..", str(e.exception))
        for bad in ("0:-1", "-1:0", "0: 5", "x"):
            with self.assertRaises(ValueError):
                loader(start=bad)


class JaxTest(unittest.TestCase):
    def test_make_global_batch_calls_jax(self):
        """The helper's calls, against a stand-in jax module (the real one is tested below when
        installed): across processes one make_array_from_process_local_data per tensor, in one
        process one device_put for the whole batch; metadata left out, one NamedSharding per
        spec however many batches."""
        import sys
        import types

        import conveyor.jax as cj

        calls, puts, made = [], [], []
        fake = types.ModuleType("jax")
        fake.process_count = lambda: 2
        fake.make_array_from_process_local_data = lambda sharding, a: calls.append(
            (sharding, a)) or ("global", a.shape)
        fake.device_put = lambda arrays, shardings: puts.append((arrays, shardings)) or [
            ("put", a.shape) for a in arrays]
        sharding_mod = types.ModuleType("jax.sharding")
        sharding_mod.NamedSharding = lambda mesh, spec: made.append(spec) or ("named", mesh, spec)
        sharding_mod.PartitionSpec = lambda *axes: ("pspec",) + axes
        fake.sharding = sharding_mod
        batch = {"cam0": np.zeros((4, 2), np.uint8), "action": np.zeros((4, 3), np.float32),
                 "_cursor": (0, 0), "_ids": np.zeros((4, 3), np.int64)}
        cj._SHARDINGS.clear()
        with mock.patch.dict(sys.modules, {"jax": fake, "jax.sharding": sharding_mod}):
            g = cj.make_global_batch(batch, "mesh", ("pspec", "data"))
            self.assertEqual(g, {"cam0": ("global", (4, 2)), "action": ("global", (4, 3))})
            self.assertEqual(list(g), ["cam0", "action"])  # the batch's order
            self.assertEqual([c[0] for c in calls], [("named", "mesh", ("pspec", "data"))] * 2)
            self.assertIs(calls[0][1], batch["cam0"])
            calls.clear()
            g = cj.make_global_batch(batch, "mesh", {"cam0": ("pspec", "data")})
            self.assertEqual([c[0] for c in calls], [("named", "mesh", ("pspec", "data")),
                                                     ("named", "mesh", ("pspec",))])
            self.assertEqual(made, [("pspec", "data"), ("pspec",)])  # made once each, then cached
            fake.process_count = lambda: 1
            calls.clear()
            g = cj.make_global_batch(batch, "mesh", ("pspec", "data"))
            self.assertEqual(calls, [])
            self.assertEqual(len(puts), 1)
            self.assertEqual([a is b for a, b in zip(puts[0][0], (batch["cam0"], batch["action"]))],
                             [True, True])
            self.assertEqual(g, {"cam0": ("put", (4, 2)), "action": ("put", (4, 3))})
        cj._SHARDINGS.clear()

    def test_prefetch_carries_the_position_and_a_restore_takes_another_batch_size(self):
        """prefetch_to_device (a stand-in jax) keeps each global batch's cursor and positions;
        the state after the first trained batch, through the Orbax helpers' JSON, resumes a
        loader at another global batch size at that batch's next position."""
        import sys
        import types

        fake = types.ModuleType("jax")
        fake.process_count = lambda: 2
        fake.make_array_from_process_local_data = lambda sharding, a: a
        sharding_mod = types.ModuleType("jax.sharding")
        sharding_mod.NamedSharding = lambda mesh, spec: ("named", mesh, spec)
        sharding_mod.PartitionSpec = lambda *axes: ("pspec",) + axes
        fake.sharding = sharding_mod
        text = support.PIPELINE_YAML.read_text()
        import conveyor.jax as cj

        cj._SHARDINGS.clear()
        self.addCleanup(cj._SHARDINGS.clear)
        with mock.patch.dict(sys.modules, {"jax": fake, "jax.sharding": sharding_mod}):
            from conveyor.jax import prefetch_to_device, restore_loader

            l = loader(max_batches=4)
            it = prefetch_to_device(l, "mesh", ("pspec", "data"), size=2)
            g = next(it)
            self.assertEqual((g["_cursor"], g["_position"]), ((0, 0), 0))
            self.assertEqual((g["_next"], g["_next_position"]), ((0, 1), 32))
            self.assertEqual(l.position, 96)  # the loader is two batches ahead of the trainer
            state = json.dumps(l.state_dict(after=g))
            it.close()
            l.close()
            resumed = loader(config=text.replace("global_batch_size: 32", "global_batch_size: 48"),
                             max_batches=1)
            restore_loader(resumed, state)
            b = next(iter(resumed))
            self.assertEqual((b["_cursor"], b["_position"]), ((0, 0), 32))
            want = [int(i) for r in loader(start="0@32", max_batches=2) for i in r["_ids"][:, 0]]
            self.assertEqual([int(i) for i in b["_ids"][:, 0]], want[:48])

    def test_loader_takes_the_jax_process_slice(self):
        """conveyor.jax.loader(): consumer jax.process_index() of jax.process_count() (a stand-in
        jax), checked by the C++ launch function against the SLURM variables jax reads."""
        import sys
        import types

        fake = types.ModuleType("jax")
        fake.process_index = lambda: 1
        fake.process_count = lambda: 2
        clean = {k: v for k, v in os.environ.items()
                 if not k.startswith(("SLURM_", "OMPI_")) and k not in ("RANK", "WORLD_SIZE")}
        with mock.patch.dict(sys.modules, {"jax": fake}), \
                mock.patch.dict(os.environ, clean, clear=True):
            from conveyor.jax import loader as jax_loader

            l = jax_loader(servers=[ENV["address"]], max_batches=2)
            self.assertEqual((l.rank, l.world_size), (1, 2))
            self.assertEqual(l.launch_source, "jax.process_index(), jax.process_count()")
            self.assertEqual([support.summary(b) for b in l], ENV["ref_1of2"])
            with mock.patch.dict(os.environ, {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4"}):
                with self.assertRaisesRegex(ValueError, "SLURM_STEP_NUM_TASKS is 4"):
                    jax_loader(servers=[ENV["address"]])

    @unittest.skipUnless(importlib.util.find_spec("jax"),
                         "jax is not installed (Debian 12 packages no jax): "
                         "make_global_batch is tested against a stand-in only")
    def test_make_global_batch(self):  # pragma: no cover - not on Debian 12
        import jax
        from jax.sharding import Mesh, PartitionSpec

        from conveyor.jax import make_global_batch

        batch = next(iter(loader(max_batches=1)))
        mesh = Mesh(np.array(jax.devices()), ("data",))
        g = make_global_batch(batch, mesh, PartitionSpec("data"))
        self.assertNotIn("_cursor", g)
        for name, a in conveyor.tensors(batch).items():
            self.assertEqual(g[name].shape, a.shape, name)
            np.testing.assert_array_equal(np.asarray(g[name]), a)


class TokenizerTest(unittest.TestCase):
    def test_token_ids_of_a_tokenized_text_stream(self):
        """A text stream with a tokenizer arrives as int32 ids with its mask, python3-sentencepiece's."""
        import sentencepiece as spm

        d = ENV["dir"] / "spm"
        d.mkdir(exist_ok=True)
        words = ["pick", "place", "push", "the", "red", "green", "blue", "cube", "ball", "bowl",
                 "drawer", "open", "close", "stack", "blocks", "café", "机器人", "🤖"]
        (d / "corpus.txt").write_text("\n".join(" ".join(words[(i * 7 + k) % len(words)]
                                                             for k in range(6)) for i in range(200)),
                                      encoding="utf-8")
        subprocess.run(["spm_train", f"--input={d / 'corpus.txt'}", f"--model_prefix={d / 'm'}",
                        "--vocab_size=60", "--hard_vocab_limit=false", "--minloglevel=2"],
                       check=True, capture_output=True)
        model = d / "m.model"
        sp = spm.SentencePieceProcessor(model_file=str(model))
        # The same order both times (the seed and schedule decide it); one config sends the
        # instruction's bytes, the other its ids. The model's path is absolute: the config is
        # sent inline, so it has no folder of its own on the server.
        head = "anchor: action\npipeline: {global_batch_size: 8, seed: 2}\nstreams:\n"
        raw = list(loader(config=head + "  instruction: {}\n", max_batches=2))
        tok = list(loader(config=head + f"  instruction: {{tokenizer: {{model: {model}, add_eos: true}}}}\n",
                          max_batches=2))
        self.assertEqual(len(raw), 2)
        self.assertEqual(len(tok), 2)
        for r, t in zip(raw, tok):
            np.testing.assert_array_equal(r["_ids"], t["_ids"])
            ids, mask = t["instruction"], t["instruction_mask"]
            self.assertEqual(ids.dtype, np.int32)
            self.assertEqual(mask.dtype, np.bool_)
            self.assertEqual(ids.shape, mask.shape)
            for row in range(ids.shape[0]):
                text = bytes(r["instruction"][row][r["instruction_mask"][row]]).decode("utf-8")
                self.assertEqual(ids[row][mask[row]].tolist(), sp.encode(text, add_eos=True), text)
        with self.assertRaises(conveyor.ConveyorError) as e:
            next(iter(loader(config=head + "  instruction: {tokenizer: {model: m.model}}\n")))
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIn("absolute path", str(e.exception))


if __name__ == "__main__":
    unittest.main()
