"""libconveyor_c (capi/include/conveyor/conveyor_c.h) loaded with ctypes: the one native part of
the package, compiled against no Python, so the package works in any CPython 3.9+. It links the
client only; libconveyor_video.so.1 (DeviceFrames, which carries the data path) is loaded by
conveyor.video when it is used, through load_library below.

Where the library is looked for, first found wins:
  1. $CONVEYOR_LIBRARY, a path to libconveyor_c.so.1;
  2. conveyor/lib/ inside this package (a wheel, `pip install ./python`, the build tree);
  3. the dynamic loader's path (the Debian package installs it in /usr/lib/x86_64-linux-gnu).
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

_SONAME = "libconveyor_c.so.1"
ABI_VERSION = 1

# absl/gRPC status codes: ConveyorError.code is the name.
CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}
DEADLINE_EXCEEDED = 4


class ConveyorError(RuntimeError):
    """An error from the Conveyor client or a data server; `.code` is the status code name
    (INVALID_ARGUMENT, UNAVAILABLE, ...)."""

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor)))]


class TensorInfo(ctypes.Structure):  # conveyor_tensor
    _fields_ = [("size", ctypes.c_uint32), ("name", ctypes.c_char_p), ("dtype", ctypes.c_int32),
                ("role", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p),
                ("bytes", ctypes.c_uint64), ("device_data", ctypes.c_void_p)]


class BatchInfo(ctypes.Structure):  # conveyor_batch_info
    _fields_ = [("size", ctypes.c_uint32), ("epoch", ctypes.c_uint64), ("step", ctypes.c_uint64),
                ("next_epoch", ctypes.c_uint64), ("next_step", ctypes.c_uint64),
                ("consumer", ctypes.c_uint32), ("consumers", ctypes.c_uint32),
                ("samples", ctypes.c_uint64), ("tensors", ctypes.c_uint32),
                ("packed_sequences", ctypes.c_uint32), ("fill_ratio", ctypes.c_double),
                ("server", ctypes.c_char_p), ("device", ctypes.c_int32),
                ("payload", ctypes.c_void_p), ("payload_bytes", ctypes.c_uint64),
                ("position", ctypes.c_uint64), ("next_position", ctypes.c_uint64)]


NO_POSITION = (1 << 64) - 1  # CONVEYOR_NO_POSITION: a server that predates position cursors


def _preload_system_runtime() -> None:
    """The interpreter's own C++ runtime, loaded by name before the library: the library's
    $ORIGIN path (the device bundle, docs/device.md) carries an older libstdc++ that must not
    shadow the one torch or jax need once its soname is taken."""
    for name in ("libstdc++.so.6", "libgcc_s.so.1"):
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass


def load_library(soname: str, env_var: str,
                 beside: Optional[str] = None) -> Tuple[ctypes.CDLL, str]:
    """(ctypes.CDLL, path) of `soname`: $env_var, else beside the library at path `beside`, else
    conveyor/lib/, else the dynamic loader's path. OSError listing every place tried."""
    _preload_system_runtime()
    tried: List[str] = []
    # Resolved: the library finds its dependencies through $ORIGIN, the directory it really is in.
    candidates: List[str] = [str(Path(os.environ[env_var]).resolve())] if os.environ.get(env_var) else []
    dirs = [Path(beside).parent] if beside and os.sep in beside else []
    dirs.append(Path(__file__).resolve().parent / "lib")
    unversioned = soname[:soname.index(".so") + 3]
    for directory in dict.fromkeys(dirs):
        found = [directory / n for n in (soname, unversioned) if (directory / n).exists()]
        candidates += [str(f.resolve()) for f in found]
        if not found:
            tried.append(f"{directory}/: no {soname}")
    candidates.append(soname)  # the dynamic loader's path
    for candidate in dict.fromkeys(candidates):
        try:
            return ctypes.CDLL(candidate), candidate
        except OSError as e:
            tried.append(f"{candidate}: {e}")
    raise OSError(f"cannot load {soname}; tried\n  " + "\n  ".join(tried))


def _load() -> Tuple[ctypes.CDLL, str]:
    try:
        return load_library(_SONAME, "CONVEYOR_LIBRARY")
    except OSError as e:
        raise ImportError(f"conveyor: {e}\nBuild it (`./run build` puts it "
                          "in build/python/conveyor/lib/), install the package (pip install "
                          "./python, or the Debian package), or set CONVEYOR_LIBRARY to its "
                          "path.") from None


lib, path = _load()

_c = ctypes
_P = ctypes.POINTER
_FUNCTIONS: Dict[str, Tuple[Optional[type], List[type]]] = {
    "conveyor_abi_version": (_c.c_uint32, []),
    "conveyor_version": (_c.c_char_p, []),
    "conveyor_protocol_version": (_c.c_uint32, []),
    "conveyor_last_error": (_c.c_char_p, []),
    "conveyor_string_free": (None, [_c.c_void_p]),
    "conveyor_device_supported": (_c.c_int, []),
    "conveyor_check_device": (_c.c_int, [_c.c_int]),
    "conveyor_resolve_launch": (_c.c_int, [_c.c_char_p, _P(_c.c_void_p)]),
    "conveyor_get_info": (_c.c_int, [_c.c_char_p, _P(_c.c_void_p)]),
    "conveyor_client_create": (_c.c_int, [_c.c_char_p, _P(_c.c_void_p)]),
    "conveyor_client_next": (_c.c_int, [_c.c_void_p, _c.c_double, _P(_c.c_void_p)]),
    "conveyor_client_cancel": (None, [_c.c_void_p]),
    "conveyor_client_cursor": (None, [_c.c_void_p, _P(_c.c_uint64), _P(_c.c_uint64)]),
    "conveyor_client_schedule_version": (_c.c_uint32, [_c.c_void_p]),
    "conveyor_client_global_batch_size": (_c.c_uint64, [_c.c_void_p]),
    "conveyor_client_coverage": (_c.c_int, [_c.c_void_p, _P(_c.c_void_p)]),
    "conveyor_client_stats": (_c.c_int, [_c.c_void_p, _P(_c.c_void_p)]),
    "conveyor_client_destroy": (None, [_c.c_void_p]),
    "conveyor_client_abandon": (None, [_c.c_void_p]),
    "conveyor_batch_info_get": (_c.c_int, [_c.c_void_p, _P(BatchInfo)]),
    "conveyor_batch_tensor": (_c.c_int, [_c.c_void_p, _c.c_uint32, _P(TensorInfo)]),
    "conveyor_batch_ids": (_c.c_int, [_c.c_void_p, _c.c_void_p, _c.c_void_p]),
    "conveyor_batch_layout": (_c.c_uint64, [_c.c_void_p]),
    "conveyor_batch_wait_on_stream": (_c.c_int, [_c.c_void_p, _c.c_void_p]),
    "conveyor_batch_wait_device": (_c.c_int, [_c.c_void_p]),
    "conveyor_batch_dlpack": (_c.c_int, [_c.c_void_p, _c.c_uint32, _c.c_int, _c.c_int,
                                         _P(_P(DLManagedTensor))]),
    "conveyor_batch_free": (None, [_c.c_void_p]),
    "conveyor_parse_cursor": (_c.c_int, [_c.c_char_p, _P(_c.c_uint64), _P(_c.c_uint64),
                                         _P(_c.c_uint64)]),
    "conveyor_client_defaults": (_c.c_int, [_P(_c.c_void_p)]),
}
for _name, (_restype, _argtypes) in _FUNCTIONS.items():
    _f = getattr(lib, _name)  # AttributeError names a symbol an older library lacks
    _f.restype = _restype
    _f.argtypes = _argtypes

if lib.conveyor_abi_version() != ABI_VERSION:
    raise ImportError(f"conveyor: {path} speaks C ABI {lib.conveyor_abi_version()}, this package "
                      f"{ABI_VERSION}: install matching versions")

VERSION: str = lib.conveyor_version().decode()


def error(code: int, last_error: Optional[Callable[[], bytes]] = None) -> ConveyorError:
    """The ConveyorError for a failed call's status code, with the thread's last message (from
    `last_error`, the library's *_last_error function; default libconveyor_c's)."""
    name = CODE_NAMES.get(code, str(code))
    last_error = last_error or lib.conveyor_last_error
    message = last_error().decode(errors="replace") or name
    return ConveyorError(message, name)


def check(code: int) -> None:
    if code != 0:
        raise error(code)


def take_string(pointer: ctypes.c_void_p, free: Optional[Callable[[ctypes.c_void_p], None]] = None) -> str:
    """A char* a library returned, as str; freed with `free` (default libconveyor_c's
    conveyor_string_free)."""
    try:
        return ctypes.string_at(pointer.value or 0).decode()
    finally:
        (free or lib.conveyor_string_free)(pointer)


def call_json(function: Callable[..., int], request: Dict[str, Any]) -> Any:
    """function(request JSON, &result JSON) -> the result, parsed (JSON's types: the caller
    knows the shape)."""
    out = ctypes.c_void_p()
    check(function(json.dumps(request).encode(), ctypes.byref(out)))
    return json.loads(take_string(out))


# PyCapsules for DLPack, made through the interpreter's C API (ctypes.pythonapi): every CPython
# has it. The destructor takes the capsule as a plain pointer: it runs while the capsule is being
# freed, when no new reference to it may be taken.
_CAPSULE_NAME = ctypes.create_string_buffer(b"dltensor")
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_py = ctypes.pythonapi
_py.PyCapsule_New.restype = ctypes.py_object
_py.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_void_p, _CapsuleDestructor]
_py.PyCapsule_IsValid.restype = ctypes.c_int
_py.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
_py.PyCapsule_GetPointer.restype = ctypes.c_void_p
_py.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_void_p]


def _free_unconsumed(capsule: int) -> None:
    # A consumer renames the capsule "used_dltensor" and calls the deleter itself when done; a
    # capsule nobody consumed still owns its tensor.
    if _py.PyCapsule_IsValid(capsule, ctypes.addressof(_CAPSULE_NAME)):
        pointer = _py.PyCapsule_GetPointer(capsule, ctypes.addressof(_CAPSULE_NAME))
        managed = ctypes.cast(pointer, ctypes.POINTER(DLManagedTensor))
        managed.contents.deleter(managed)


# Wrapped by a call rather than used as a decorator: typeshed types a CFUNCTYPE class as no
# decorator, which would leave the function untyped. Kept at module level for the process's life:
# a capsule may run it at any time.
_free_unconsumed_capsule = _CapsuleDestructor(_free_unconsumed)


def dlpack_capsule(managed: Any) -> object:
    """A "dltensor" PyCapsule owning `managed` (a POINTER(DLManagedTensor))."""
    capsule: object = _py.PyCapsule_New(ctypes.cast(managed, ctypes.c_void_p),
                                        ctypes.addressof(_CAPSULE_NAME), _free_unconsumed_capsule)
    return capsule
