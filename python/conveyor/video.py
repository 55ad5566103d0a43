"""Video decoded on the GPU's NVDEC engines in the trainer's own process (docs/nvdec.md).

For 720p video models, where decoding is the whole cost: the data server serves everything else
of the sample (captions, actions, ``<stream>_is_pad``, the order, the resume cursor) and each
batch's sample ids; ``DeviceFrames`` opens the same dataset and a config naming the video
streams, and decodes those samples' frames on NVDEC straight into a torch tensor on the GPU. No
frame passes through host memory or the transport::

    frames = conveyor.video.DeviceFrames("/data/clips", "video_gpu.yaml", device="cuda:0")
    for batch in conveyor.Loader(servers=..., config="captions.yaml"):
        clips = frames.decode(batch)["cam0"]   # torch.uint8 [B, T, H, W, 3] on cuda:0

The frames are picked by the CPU path's code from each sample's (episode, anchor step), so frame
selection equals what the server would have decoded; pixels are within the tolerance
docs/nvdec.md measures. The config's video streams need a ``size`` and no ``augment``; uint8 hwc
or float32 chw (normalised on the GPU).
"""

from __future__ import annotations

import ctypes
import json
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import _lib
from ._lib import ConveyorError

VIDEO_SONAME = "libconveyor_video.so.1"

_c = ctypes
_P = ctypes.POINTER
_FUNCTIONS = {
    "conveyor_video_last_error": (_c.c_char_p, []),
    "conveyor_video_string_free": (None, [_c.c_void_p]),
    "conveyor_device_frames_create": (_c.c_int, [_c.c_char_p, _P(_c.c_void_p)]),
    "conveyor_device_frames_describe": (_c.c_int, [_c.c_void_p, _P(_c.c_void_p)]),
    "conveyor_device_frames_decode": (_c.c_int, [_c.c_void_p, _c.c_uint32, _c.c_void_p,
                                                 _c.c_void_p, _c.c_uint64, _c.c_void_p,
                                                 _c.c_void_p, _c.c_void_p]),
    "conveyor_device_frames_stats": (_c.c_int, [_c.c_void_p, _P(_c.c_void_p)]),
    "conveyor_device_frames_destroy": (None, [_c.c_void_p]),
}
_video: Optional[ctypes.CDLL] = None
_video_lock = threading.Lock()


def _library() -> ctypes.CDLL:
    """libconveyor_video.so.1 (capi/include/conveyor/conveyor_video.h), loaded on first use: it
    carries the data path (datasets, FFmpeg, NVDEC, the CUDA runtime), which `import conveyor`
    does not load. Looked for in $CONVEYOR_VIDEO_LIBRARY, beside libconveyor_c.so.1, in
    conveyor/lib/, then on the dynamic loader's path."""
    global _video
    with _video_lock:
        if _video is None:
            try:
                video, where = _lib.load_library(VIDEO_SONAME, "CONVEYOR_VIDEO_LIBRARY",
                                                 beside=_lib.path)
            except OSError as e:
                raise ConveyorError(f"conveyor.video: {e}\nDeviceFrames needs it beside "
                                    f"{_lib.path} (the build, the wheel and the Debian package "
                                    "install it there), or CONVEYOR_VIDEO_LIBRARY set to its "
                                    "path", "FAILED_PRECONDITION") from None
            for name, (restype, argtypes) in _FUNCTIONS.items():
                f = getattr(video, name, None)
                if f is None:
                    raise ConveyorError(f"{where} has no {name}: install matching versions",
                                        "FAILED_PRECONDITION")
                f.restype = restype
                f.argtypes = argtypes
            _video = video
        return _video


def _check(code: int) -> None:
    if code != 0:
        raise _lib.error(code, _library().conveyor_video_last_error)


def _take_string(pointer: ctypes.c_void_p) -> str:
    return _lib.take_string(pointer, _library().conveyor_video_string_free)


def _device_index(device: Any) -> int:
    text = str(device)
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    if isinstance(device, int) and device >= 0:
        return device
    raise ValueError(f"device {device!r}: expected 'cuda', 'cuda:N' or an ordinal")


class DeviceFrames:
    """NVDEC decoding of a config's video streams for the samples of served batches.

    Args:
      dataset: the dataset (path, URL or mixture file) the server serves.
      config: a YAML config (docs/sampling.md) whose video streams are decoded here; its anchor
        must be the served config's, so that (episode, step) means the same anchor time.
      streams: the video streams of ``config`` to decode (default: every one).
      device: "cuda:N".
      sessions: NVDEC sessions, one thread each; the driver spreads them over the engines
        (an H100 or H200 has 7).
      cache_bytes: device memory keeping decoded frames across batches (clips of one GOP window
        overlap, so each frame is decoded once while it stays); 0 for none.
    """

    def __init__(self, dataset: Any, config: Any, streams: Union[str, Sequence[str], None] = None,
                 device: Any = "cuda:0", sessions: int = 7, cache_bytes: int = 1 << 30) -> None:
        self.device_index = _device_index(device)
        self.device = f"cuda:{self.device_index}"
        options: Dict[str, Any] = {"dataset": str(dataset), "config": str(config),
                                   "device": self.device_index, "sessions": int(sessions),
                                   "cache_bytes": int(cache_bytes)}
        if streams is not None:
            options["streams"] = [streams] if isinstance(streams, str) else list(streams)
        lib = _library()
        handle = ctypes.c_void_p()
        _check(lib.conveyor_device_frames_create(json.dumps(options).encode(),
                                                 ctypes.byref(handle)))
        self._handle: Optional[ctypes.c_void_p] = handle
        out = ctypes.c_void_p()
        _check(lib.conveyor_device_frames_describe(self._handle, ctypes.byref(out)))
        self.tensors: List[Dict[str, Any]] = json.loads(_take_string(out))
        self._side_stream: Any = None

    def _stream(self, torch: Any) -> Any:
        # The frames are written on a side stream of our own, so that decoding never waits for
        # the model's queued work; the caller's stream takes them with record_stream.
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(device=self.device)
        return self._side_stream

    def decode(self, batch: Any, out: Optional[Mapping[str, Any]] = None,
               stream: Any = None) -> Dict[str, Any]:
        """The video streams of ``batch`` (a Loader's dict, or an (N, 3) int64 array of sample
        ids: index, episode, step) as torch tensors on the device: {name: tensor [N, T, ...]},
        plus {name + "_is_pad": bool [N, T]} on the host.

        ``out`` ({name: tensor}) gives the destinations instead of new tensors (C-contiguous,
        on this device, the right dtype and shape); they are written after the work queued on
        ``stream`` (default: the current stream). New tensors are made on a side stream and
        recorded on ``stream`` for the allocator."""
        import torch

        if isinstance(batch, dict):
            ids = np.ascontiguousarray(batch["_ids"], np.int64)
            datasets = batch.get("_dataset")
        else:
            ids, datasets = np.ascontiguousarray(batch, np.int64), None
        if ids.ndim != 2 or ids.shape[1] != 3:
            raise ValueError(f"ids of shape {ids.shape}; expected (N, 3): index, episode, step")
        if datasets is not None:
            datasets = np.ascontiguousarray(datasets, np.int32)
        n = ids.shape[0]
        consumer = stream if stream is not None else torch.cuda.current_stream(self.device)
        result: Dict[str, Any] = {}
        for i, t in enumerate(self.tensors):
            dtype = torch.uint8 if t["dtype"] == "uint8" else torch.float32
            shape = (n, *t["sample_shape"])
            if out is not None and t["name"] in out:
                dst = out[t["name"]]
                if (tuple(dst.shape) != shape or dst.dtype != dtype or not dst.is_contiguous()
                        or dst.device != torch.device(self.device)):
                    raise ValueError(f"out['{t['name']}']: {tuple(dst.shape)} {dst.dtype} on "
                                     f"{dst.device}; expected {shape} {dtype} on {self.device}, "
                                     "contiguous")
                write_stream = consumer
            else:
                write_stream = self._stream(torch)
                with torch.cuda.stream(write_stream):
                    dst = torch.empty(shape, dtype=dtype, device=self.device)
            pads = np.zeros((n, t["frames_per_sample"]), np.uint8)
            _check(_library().conveyor_device_frames_decode(
                self._handle, i, ids.ctypes.data,
                datasets.ctypes.data if datasets is not None else None, n, dst.data_ptr(),
                pads.ctypes.data, ctypes.c_void_p(write_stream.cuda_stream)))
            if write_stream is not consumer:
                dst.record_stream(consumer)
            result[t["name"]] = dst
            result[t["name"] + "_is_pad"] = pads.astype(bool)
        return result

    def stats(self) -> Dict[str, Any]:
        """{calls, samples, frames, frames_decoded, seeks, cache_hits, frames_cached, seconds}
        since creation."""
        out = ctypes.c_void_p()
        _check(_library().conveyor_device_frames_stats(self._handle, ctypes.byref(out)))
        stats: Dict[str, Any] = json.loads(_take_string(out))
        return stats

    def close(self) -> None:
        if getattr(self, "_handle", None):
            _library().conveyor_device_frames_destroy(self._handle)
            self._handle = None

    def __enter__(self) -> DeviceFrames:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
