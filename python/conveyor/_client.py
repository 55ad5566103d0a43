"""conveyor.Client: one stream of batches through the C ABI (capi/include/conveyor/conveyor_c.h),
without copying batch data.

Client.next() waits for a batch with the GIL released (ctypes releases it around every call) and
returns a dict: one numpy array per tensor, in batch order, each a view of the block the C++
client received the batch into (client/client.h), then the metadata keys (METADATA_KEYS). All
arrays of a batch are views of one array over that block whose base owns the batch handle, so
the bytes live as long as any array of the batch does, after the Client is gone too. The arrays
are writable: the buffer belongs to this batch alone.

With device delivery (device >= 0: the C++ client copies each batch to that CUDA device as it
arrives, device/upload.h), or dlpack=True on the host, the tensors are `Tensor` objects instead:
DLPack exporters (__dlpack__, __dlpack_device__) for torch.from_dlpack, jax.dlpack and any other
consumer, each export holding the batch. __dlpack__(stream=S) orders S after the batch's copy on
the GPU (cudaStreamWaitEvent; the host never waits) and the C library remembers S: once the
batch and its exports are gone, its device buffer is not reused before the work queued on S is
done (as torch's record_stream).

Errors are ConveyorError (a RuntimeError) with the status code name in `.code`; the end of the
stream is StopIteration, and OUT_OF_RANGE (a cursor past the end of the data) is an error like
any other.

What the C library already knows is asked of it, not restated here: the options' defaults
(conveyor_client_defaults: an option left None is left out, and the library's default applies),
the cursor's text (conveyor_parse_cursor, the parser `conveyor_client_create` itself uses), and
the info's 64-bit integers (numbers in conveyor_get_info's JSON).
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from typing import (TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    Union)

import numpy as np

if TYPE_CHECKING:  # annotations only: numpy.typing needs numpy 1.21, the package runs on older
    import numpy.typing as npt

from . import _lib
from ._lib import ConveyorError, lib

__version__ = _lib.VERSION

METADATA_KEYS = ("_cursor", "_next", "_position", "_next_position", "_consumer", "_consumers",
                 "_ids", "_dataset", "_server", "_packed_sequences", "_fill_ratio")

# A batch: tensor name -> numpy array (or Tensor, or a torch tensor from a Loader on a GPU), then
# the METADATA_KEYS' values (tuples, ints, str, numpy arrays): one dict of mixed values.
Batch = Dict[str, Any]
# (epoch, step): a cursor in steps of the global batch size.
Cursor = Tuple[int, int]
# Where a stream starts: (epoch, step), or the cursor's text "EPOCH:STEP" or "EPOCH@POSITION".
Start = Union[str, Sequence[int]]
# Server addresses: a list, or one comma-separated string.
Servers = Union[str, Sequence[str]]


def _bfloat16() -> np.dtype[Any]:
    """numpy's dtype for bfloat16 tensors: ml_dtypes.bfloat16 where ml_dtypes imports (JAX
    ships it), else uint16, the raw bits (numpy has no bfloat16; Debian 12 packages no
    ml_dtypes). to_torch() and the DLPack exports give torch.bfloat16 either way."""
    try:
        import ml_dtypes
    except ImportError:
        return np.dtype(np.uint16)
    return np.dtype(ml_dtypes.bfloat16)


# By the C ABI's element type codes (CONVEYOR_UINT8 = 0, ...; conveyor_c.h).
_NUMPY = {0: np.dtype(np.uint8), 1: np.dtype(np.bool_), 2: np.dtype(np.float32),
          3: np.dtype(np.int32), 4: np.dtype(np.float16), 5: _bfloat16()}
_BFLOAT16 = 5
_DL_CPU, _DL_CUDA = 1, 2


def protocol_version() -> int:
    """The conveyor.v1 protocol version spoken."""
    return int(lib.conveyor_protocol_version())


def device_supported() -> bool:
    """Whether device delivery can work here: built with CUDA and a usable GPU."""
    return bool(lib.conveyor_device_supported())


def check_device(index: int) -> None:
    """Raises ConveyorError (FAILED_PRECONDITION: no usable GPU, and why; INVALID_ARGUMENT: no
    such device) unless device delivery to CUDA device `index` can work here."""
    _lib.check(lib.conveyor_check_device(int(index)))


def _read_defaults() -> Dict[str, Any]:
    out = ctypes.c_void_p()
    _lib.check(lib.conveyor_client_defaults(ctypes.byref(out)))
    defaults: Dict[str, Any] = json.loads(_lib.take_string(out))
    return defaults


_DEFAULTS = _read_defaults()


def client_defaults() -> Dict[str, Any]:
    """Every option of conveyor.Client (and so of Loader's client_options) at the value the C
    library gives it when left out (client/client.h ClientOptions): {"job": "default",
    "prefetch_batches": ..., "reconnect_timeout_s": ..., "start": "0:0", "device": -1, ...}."""
    return dict(_DEFAULTS)


def parse_cursor(text: str) -> Tuple[Cursor, Optional[int]]:
    """((epoch, step), position or None) from "EPOCH:STEP" or "EPOCH@POSITION", read by the C
    library's parser (base/types.h Cursor::Parse, what the client does with a text start):
    ValueError naming the text otherwise. From EPOCH@POSITION, step is 0."""
    epoch, step, position = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
    code = lib.conveyor_parse_cursor(str(text).encode(), ctypes.byref(epoch), ctypes.byref(step),
                                     ctypes.byref(position))
    if code != 0:
        raise ValueError(str(_lib.error(code)).split(": ", 1)[-1])
    return ((epoch.value, step.value),
            None if position.value == _lib.NO_POSITION else position.value)


def servers_text(servers: Optional[Servers]) -> str:
    if servers is None:
        return ""
    if isinstance(servers, str):
        return servers
    return ",".join(str(s) for s in servers)


def resolve_launch(rank: Optional[int] = None, world_size: Optional[int] = None,
                   servers: str = "", servers_required: bool = True,
                   from_jax: bool = False) -> Dict[str, Any]:
    """Rank, world size, local rank and servers (client/launch_env.h, docs/launch.md):
    ValueError when the arguments or launcher variables are inconsistent."""
    request = {"rank": rank, "world_size": world_size, "servers": servers,
               "servers_required": servers_required, "from_jax": from_jax}
    try:
        result: Dict[str, Any] = _lib.call_json(lib.conveyor_resolve_launch, request)
        return result
    except ConveyorError as e:
        if e.code == "INVALID_ARGUMENT":  # bad arguments or variables: the caller's ValueError
            raise ValueError(str(e).split(": ", 1)[-1]) from None
        raise


def parse_servers(servers: Optional[Servers] = None) -> List[str]:
    """A list of addresses from a list, a comma-separated string, or $CONVEYOR_SERVERS."""
    parsed: List[str] = resolve_launch(servers=servers_text(servers))["servers"]
    return parsed


def launch_env(rank: Optional[int] = None, world_size: Optional[int] = None,
               servers: Optional[Servers] = None,
               servers_required: bool = False) -> Dict[str, Any]:
    """Where this process stands in its job, as the C++ client and the CLI see it: a dict with
    rank, world_size, local_rank, local_world_size, source (the names of what was read, e.g.
    "RANK, WORLD_SIZE"), servers and servers_source. The arguments given win; the rest comes from
    torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), else Open MPI (OMPI_COMM_WORLD_*),
    else SLURM (SLURM_PROCID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_LOCALID), else 0 of 1;
    servers from $CONVEYOR_SERVERS. ValueError, naming the variables, when they disagree (a RANK
    without WORLD_SIZE, a rank not below the world size, ...). See docs/launch.md."""
    return resolve_launch(rank=rank, world_size=world_size, servers=servers_text(servers),
                          servers_required=servers_required)


def info(servers: Optional[Servers] = None, auth_token: Optional[str] = None) -> Dict[str, Any]:
    """What the first server that answers serves: conveyor.v1.InfoResponse as a dict (dataset
    name and fingerprint, episodes, streams, and per config its digest, samples_per_epoch,
    steps_per_epoch, global_batch_size); 64-bit integers are ints."""
    result: Dict[str, Any] = _lib.call_json(
        lib.conveyor_get_info, {"servers": parse_servers(servers), "auth_token": auth_token or ""})
    return result


def tensors(batch: Mapping[str, Any]) -> Dict[str, Any]:
    """The tensors of a batch, without the "_" metadata keys."""
    return {k: v for k, v in batch.items() if k not in METADATA_KEYS}


def to_torch(batch: Mapping[str, Any], device: Any = None,
             non_blocking: bool = True) -> Dict[str, Any]:
    """The tensors of a batch as torch tensors sharing the numpy arrays' memory (torch.from_numpy,
    no copy), moved to `device` when given (a copy then; non_blocking from pinned memory only).
    Metadata keys pass through unchanged."""
    import torch

    out = {}
    for k, v in batch.items():
        if k in METADATA_KEYS:
            out[k] = v
            continue
        if v.dtype == _NUMPY[_BFLOAT16]:  # torch reads neither uint16 nor ml_dtypes: the bits
            t = torch.from_numpy(v.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(v)
        out[k] = t if device is None else t.to(device, non_blocking=non_blocking)
    return out


class _Batch:
    """Owns one batch handle; numpy sees the batch's host block through __array_interface__."""

    __slots__ = ("handle", "info", "__array_interface__", "__weakref__")

    def __init__(self, handle: ctypes.c_void_p) -> None:
        self.handle: Optional[ctypes.c_void_p] = handle
        info = _lib.BatchInfo(size=ctypes.sizeof(_lib.BatchInfo), position=_lib.NO_POSITION,
                              next_position=_lib.NO_POSITION)
        _lib.check(lib.conveyor_batch_info_get(handle, ctypes.byref(info)))
        self.info = info
        self.__array_interface__ = {"version": 3, "shape": (info.payload_bytes,),
                                    "typestr": "|u1", "data": (info.payload or 0, False)}

    def tensor(self, index: int) -> _lib.TensorInfo:
        t = _lib.TensorInfo(size=ctypes.sizeof(_lib.TensorInfo))
        _lib.check(lib.conveyor_batch_tensor(self.handle, index, ctypes.byref(t)))
        return t

    def __del__(self) -> None:
        handle, self.handle = self.handle, None
        if handle and lib is not None:  # lib is None at interpreter shutdown
            lib.conveyor_batch_free(handle)


# One tensor's place in a batch: (name, dtype, shape, offset in the payload or None when empty).
_Entry = Tuple[str, "np.dtype[Any]", Tuple[int, ...], Optional[int]]


def _shape(t: _lib.TensorInfo) -> Tuple[int, ...]:
    return tuple(t.shape[i] for i in range(t.ndim))


def _host_array(flat: npt.NDArray[np.uint8], payload: int,
                t: _lib.TensorInfo) -> npt.NDArray[Any]:
    """The tensor as a view of `flat` (one array over the batch's block)."""
    dtype = _NUMPY[t.dtype]
    shape = _shape(t)
    if not t.data:
        return np.empty(shape, dtype)  # an empty tensor has no bytes in the block
    offset = t.data - payload
    return flat[offset:offset + t.bytes].view(dtype).reshape(shape)


def _describe(batch: _Batch) -> Tuple[_Entry, ...]:
    """The batch's layout: (name, dtype, shape, offset in the payload or None when empty) per
    tensor, in batch order; refuses duplicate names and names that collide with metadata."""
    entries: List[_Entry] = []
    seen = set()
    payload = batch.info.payload
    for i in range(batch.info.tensors):
        t = batch.tensor(i)
        name = t.name.decode()
        if name in seen:
            raise _duplicate(batch, name)
        if name in METADATA_KEYS:
            raise ConveyorError(f"INVALID_ARGUMENT: batch tensor '{name}' collides with the "
                                "metadata key of that name", "INVALID_ARGUMENT")
        seen.add(name)
        entries.append((name, _NUMPY[t.dtype], _shape(t), t.data - payload if t.data else None))
    return tuple(entries)


class _Layouts:
    """Layouts by conveyor_batch_layout's key: a stream's batches share one, so each tensor's name,
    type and shape are read from the library once, and later batches only get views placed."""

    def __init__(self, limit: int = 64) -> None:
        self._by_key: Dict[int, Tuple[_Entry, ...]] = {}
        self._limit = limit

    def get(self, batch: _Batch) -> Tuple[_Entry, ...]:
        key = int(lib.conveyor_batch_layout(batch.handle))
        layout = self._by_key.get(key)
        if layout is None or len(layout) != batch.info.tensors:
            layout = _describe(batch)
            if len(self._by_key) >= self._limit:
                self._by_key.clear()
            self._by_key[key] = layout
        return layout


def _metadata(batch: _Batch, out: Batch) -> Batch:
    info = batch.info
    ids = np.empty((info.samples, 3), np.int64)
    dataset = np.empty(info.samples, np.int32)
    _lib.check(lib.conveyor_batch_ids(batch.handle, ids.ctypes.data, dataset.ctypes.data))
    out["_cursor"] = (info.epoch, info.step)
    out["_next"] = (info.next_epoch, info.next_step)
    # Sample positions in the epoch of "_cursor" and "_next" (None from a server that predates
    # them): "_next" with "_next_position" resumes at any global batch size.
    out["_position"] = None if info.position == _lib.NO_POSITION else info.position
    out["_next_position"] = None if info.next_position == _lib.NO_POSITION else info.next_position
    out["_consumer"] = info.consumer
    out["_consumers"] = info.consumers
    out["_ids"] = ids
    out["_dataset"] = dataset
    out["_server"] = info.server.decode()
    out["_packed_sequences"] = info.packed_sequences
    out["_fill_ratio"] = info.fill_ratio
    return out


def _duplicate(batch: _Batch, name: str) -> ConveyorError:
    info = batch.info
    return ConveyorError(f"DATA_LOSS: batch {info.epoch}:{info.step} has two tensors named "
                         f"'{name}'", "DATA_LOSS")


def _to_dict(batch: _Batch, layout: Tuple[_Entry, ...]) -> Batch:
    """Tensors as numpy views (batch order), then metadata."""
    flat = np.asarray(batch)  # base: the _Batch, which frees the handle with the last view
    out: Batch = {}
    for name, dtype, shape, offset in layout:
        if offset is None:  # an empty tensor has no bytes in the block
            out[name] = np.empty(shape, dtype)
        else:
            out[name] = np.ndarray(shape, dtype, buffer=flat, offset=offset)
    return _metadata(batch, out)


def _to_tensor_dict(batch: _Batch, layout: Tuple[_Entry, ...], on_device: bool) -> Batch:
    """Tensors as DLPack exporters (batch order), then metadata."""
    out: Batch = {}
    for i, (name, dtype, shape, _) in enumerate(layout):
        out[name] = Tensor(batch, i, name, shape, dtype, on_device)
    return _metadata(batch, out)


class Tensor:
    """One tensor of a batch as a DLPack exporter (torch.from_dlpack, numpy.from_dlpack,
    jax.dlpack.from_dlpack, ...): on the GPU with device delivery, else the host bytes. Keeps its
    batch alive."""

    __slots__ = ("_batch", "_index", "name", "shape", "_dtype", "_on_device", "_as_uint8")

    def __init__(self, batch: _Batch, index: int, name: str, shape: Tuple[int, ...],
                 dtype: np.dtype[Any], on_device: bool, as_uint8: bool = False) -> None:
        self._batch = batch
        self._index = index
        self.name = name
        self.shape = shape
        self._dtype = dtype
        self._on_device = on_device
        self._as_uint8 = as_uint8

    @property
    def dtype(self) -> str:
        """The element type's name: the numpy dtype's, and "bfloat16" for bfloat16 (the DLPack
        export's type, whatever numpy's host view holds; see _bfloat16)."""
        if self._as_uint8:
            return "uint8"
        return "bfloat16" if self._dtype == _NUMPY[_BFLOAT16] else self._dtype.name

    @property
    def host(self) -> npt.NDArray[Any]:
        """A numpy view of the host bytes the batch arrived in (the device copy's source)."""
        t = self._batch.tensor(self._index)
        a = _host_array(np.asarray(self._batch), self._batch.info.payload or 0, t)
        return a.view(np.uint8) if self._as_uint8 else a

    def as_uint8(self) -> Tensor:
        """The same bytes exported as uint8 (for consumers that lack DLPack's bool)."""
        return Tensor(self._batch, self._index, self.name, self.shape, self._dtype,
                      self._on_device, True)

    def _device_id(self) -> int:
        return int(self._batch.info.device) if self._on_device else 0

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (_DL_CUDA if self._on_device else _DL_CPU, self._device_id())

    def __dlpack__(self, *, stream: Optional[int] = None,
                   max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None,
                   copy: Optional[bool] = None) -> object:
        """A DLPack capsule of this tensor. stream (CUDA): None is the legacy default stream,
        -1 asks for no ordering, 1 and 2 are cudaStreamLegacy and cudaStreamPerThread, anything
        else a cudaStream_t; it is ordered after the batch's copy without a host wait. Views
        only: copy=True is refused (BufferError), as is a dl_device other than this tensor's."""
        if copy:
            raise BufferError("conveyor tensors are exported as views: copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"conveyor tensor '{self.name}' lives on another device")
        if self._on_device:
            s = 1 if stream is None else int(stream)
            if s == 0:
                raise ValueError("__dlpack__(stream=0) is ambiguous for CUDA: pass 1 for the "
                                 "legacy default stream, 2 for the per-thread one, or a stream")
            if s != -1:
                _lib.check(lib.conveyor_batch_wait_on_stream(self._batch.handle,
                                                             ctypes.c_void_p(s)))
        managed = ctypes.POINTER(_lib.DLManagedTensor)()
        _lib.check(lib.conveyor_batch_dlpack(self._batch.handle, self._index,
                                             int(self._on_device), int(self._as_uint8),
                                             ctypes.byref(managed)))
        return _lib.dlpack_capsule(managed)

    def __repr__(self) -> str:
        return (f"conveyor.Tensor(name={self.name}, shape={self.shape}, dtype={self.dtype}, "
                f"device={self.__dlpack_device__()})")


def _coerce(key: str, value: Any) -> Any:
    """An option given as the JSON type of its default (a numpy integer as int, an int timeout as
    float): what the library's typed reads accept. An option without a default passes as is, and
    the library names it if it is unknown."""
    default = _DEFAULTS.get(key)
    if isinstance(default, bool):
        return bool(value)
    if isinstance(default, int):
        return int(value)
    if isinstance(default, float):
        return float(value)
    return value


def _options(servers: Servers, start: Optional[Start], given: Mapping[str, Any]) -> Dict[str, Any]:
    """conveyor_client_create's JSON: the options given (None: left out, so the library's default
    applies), servers and start."""
    options = {key: _coerce(key, value) for key, value in given.items() if value is not None}
    options["servers"] = servers if isinstance(servers, str) else [str(s) for s in servers]
    if isinstance(start, str):  # "EPOCH:STEP" or "EPOCH@POSITION", parsed by the C++ client
        options["start"] = start
    elif start is not None:
        epoch, step = start
        options["start"] = [int(epoch), int(step)]
    return options


class Client:
    """One stream of batches (client/client.h). next() returns a dict of numpy views plus
    metadata; StopIteration at the end of the stream.

    The options are client/client.h's ClientOptions (capi/include/conveyor/conveyor_c.h lists
    them); one left None takes the C library's default, which client_defaults() returns. dlpack
    (this binding's own): the tensors as Tensor (DLPack exporters) instead of numpy views."""

    def __init__(self, *, servers: Servers, job: Optional[str] = None,
                 consumer: Optional[int] = None, consumers: Optional[int] = None,
                 start: Optional[Start] = None, config_yaml: Optional[str] = None,
                 config_name: Optional[str] = None, max_batches: Optional[int] = None,
                 prefetch_batches: Optional[int] = None, prefetch_bytes: Optional[int] = None,
                 max_message_bytes: Optional[int] = None, auth_token: Optional[str] = None,
                 reconnect_timeout_s: Optional[float] = None, dataset: Optional[str] = None,
                 tls: Optional[bool] = None, tls_ca_pem: Optional[str] = None,
                 tls_cert_pem: Optional[str] = None, tls_key_pem: Optional[str] = None,
                 tls_server_name: Optional[str] = None, schedule_version: Optional[int] = None,
                 shared_memory: Optional[bool] = None, shared_memory_bytes: Optional[int] = None,
                 device: Optional[int] = None, device_buffers: Optional[int] = None,
                 dlpack: bool = False, **more: Any) -> None:
        self._handle: Optional[ctypes.c_void_p] = None
        self._pid = os.getpid()
        self._calls = 0  # calls into the handle in flight: close() destroys it after them
        self._layouts = _Layouts()
        self._idle = threading.Condition()
        self._on_device = int(_DEFAULTS["device"] if device is None else device) >= 0
        self._dlpack = bool(dlpack) or self._on_device
        options = _options(servers, start, dict(
            job=job, consumer=consumer, consumers=consumers, config_yaml=config_yaml,
            config_name=config_name, max_batches=max_batches, prefetch_batches=prefetch_batches,
            prefetch_bytes=prefetch_bytes, max_message_bytes=max_message_bytes,
            auth_token=auth_token, reconnect_timeout_s=reconnect_timeout_s, dataset=dataset,
            tls=tls, tls_ca_pem=tls_ca_pem, tls_cert_pem=tls_cert_pem, tls_key_pem=tls_key_pem,
            tls_server_name=tls_server_name, schedule_version=schedule_version,
            shared_memory=shared_memory, shared_memory_bytes=shared_memory_bytes, device=device,
            device_buffers=device_buffers, **more))
        handle = ctypes.c_void_p()
        _lib.check(lib.conveyor_client_create(json.dumps(options).encode(),
                                              ctypes.byref(handle)))
        self._handle = handle

    def _get(self) -> ctypes.c_void_p:
        handle = self._handle
        if handle is None:
            raise ConveyorError("FAILED_PRECONDITION: the client is closed", "FAILED_PRECONDITION")
        return handle

    def _begin(self) -> ctypes.c_void_p:
        with self._idle:
            handle = self._get()
            self._calls += 1
            return handle

    def _end(self) -> None:
        with self._idle:
            self._calls -= 1
            self._idle.notify_all()

    def next(self) -> Batch:
        """The next batch: {tensor name: numpy view, ..., '_cursor': (epoch, step), '_next':
        (epoch, step), '_position', '_next_position' (their sample positions), '_consumer', '_consumers', '_ids': int64 [n, 3] (index, episode, step),
        '_dataset', '_server', '_packed_sequences', '_fill_ratio'}. Waits with the GIL released,
        in slices of 0.1 s so that Ctrl-C (KeyboardInterrupt) gets through."""
        out = ctypes.c_void_p()
        waited = False
        while True:
            if waited and self._handle is None:  # closed by another thread while we waited
                raise ConveyorError("CANCELLED: the client was closed", "CANCELLED")
            waited = True
            handle = self._begin()
            try:
                code = lib.conveyor_client_next(handle, 0.1, ctypes.byref(out))
                if code != _lib.DEADLINE_EXCEEDED:
                    _lib.check(code)
                    break
            finally:
                self._end()
        if not out.value:
            raise StopIteration("end of the stream")
        batch = _Batch(out)
        layout = self._layouts.get(batch)
        if self._dlpack:
            return _to_tensor_dict(batch, layout, self._on_device)
        return _to_dict(batch, layout)

    __next__ = next

    def __iter__(self) -> Iterator[Batch]:
        return self

    def cursor(self) -> Cursor:
        """(epoch, step) right after the last batch next() returned: resume from it."""
        epoch, step = ctypes.c_uint64(), ctypes.c_uint64()
        handle = self._begin()
        try:
            lib.conveyor_client_cursor(handle, ctypes.byref(epoch), ctypes.byref(step))
        finally:
            self._end()
        return (epoch.value, step.value)

    def schedule_version(self) -> int:
        """The order's schedule version from the server (0 before the first batch): save it
        with the cursor."""
        handle = self._begin()
        try:
            return int(lib.conveyor_client_schedule_version(handle))
        finally:
            self._end()

    def global_batch_size(self) -> int:
        """The job's global batch size from the server (0 before the first batch): what an
        (epoch, step) cursor counts steps of."""
        handle = self._begin()
        try:
            return int(lib.conveyor_client_global_batch_size(handle))
        finally:
            self._end()

    def stats(self) -> Dict[str, Any]:
        """The client's counters (conveyor_client_stats): batches, bytes, messages, reconnects,
        wait_seconds, server, transport, shared_memory_batches, the served dataset's
        fingerprint and the config's digests."""
        out = ctypes.c_void_p()
        handle = self._begin()
        try:
            _lib.check(lib.conveyor_client_stats(handle, ctypes.byref(out)))
        finally:
            self._end()
        stats: Dict[str, Any] = json.loads(_lib.take_string(out))
        return stats

    def coverage(self) -> List[Dict[str, Any]]:
        """The coverage ledger of what next() returned: a list of {"epoch", "consumer",
        "consumers", "global_batch_size", "samples", "digest", "first_position", "end_position",
        "batches"} per epoch and consumer slice (docs/pipeline.md "Coverage ledger")."""
        out = ctypes.c_void_p()
        handle = self._begin()
        try:
            _lib.check(lib.conveyor_client_coverage(handle, ctypes.byref(out)))
        finally:
            self._end()
        slices: List[Dict[str, Any]] = json.loads(_lib.take_string(out))["coverage"]
        return slices

    def close(self) -> None:
        """Cancels the stream and joins the client's thread; arrays already returned stay
        valid. A next() waiting in another thread returns at once with an error."""
        with self._idle:
            handle, self._handle = self._handle, None
        if handle is None or lib is None:
            return
        if os.getpid() != self._pid:
            # A forked child (a DataLoader worker) closing a copy of its parent's client: the
            # client's threads exist only in the parent; joining them here would abort the child.
            lib.conveyor_client_abandon(handle)
            return
        lib.conveyor_client_cancel(handle)  # wakes a next() waiting in another thread
        with self._idle:
            while self._calls:
                self._idle.wait()
        lib.conveyor_client_destroy(handle)

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass
