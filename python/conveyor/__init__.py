"""Conveyor for Python: batches from `conveyor serve` as numpy arrays, without copies.

    import conveyor
    loader = conveyor.Loader(servers="10.0.0.5:7070", config="examples/pipeline.yaml")
    for batch in loader:            # dict: tensor name -> numpy array, plus "_" metadata keys
        frames = batch["cam0"]      # uint8 [B, T, H, W, 3], a view of the received batch
        ...
        checkpoint["loader"] = loader.state_dict()

The C++ client (client/client.h) receives and prefetches batches on its own thread; this package
reaches it through its C ABI (libconveyor_c.so.1, loaded with ctypes: conveyor/_lib.py), so it
works in any CPython 3.9+ and Python only wraps the received buffers into numpy arrays. See
docs/python.md.

Each yielded batch is a dict with, in this order:
  - one numpy array per tensor, in the server's batch order (e.g. "cam0", "cam0_is_pad",
    "observation.state", "action", "action_is_pad", ...): C-contiguous, 64-byte aligned views
    of the block the C++ client received the batch into (no copy in Python), writable, kept
    alive by their `base` (a capsule owning the batch's storage) for as long as any array of the
    batch lives, after the Loader is gone too;
  - "_cursor": (epoch, step) of this batch; "_next": (epoch, step) right after it;
    "_position", "_next_position": their sample positions in the epoch's order (None from a
    server that predates them): what state_dict() saves, so a job resumes at any batch size;
  - "_consumer", "_consumers": the slice this rank got (rank, world size);
  - "_ids": int64 array [n, 3] of (dataset sample index, episode, anchor step) per sample;
  - "_dataset": int32 array [n]: each sample's dataset in a mixture (docs/mixtures.md), else 0;
  - "_server": the address that sent it; "_packed_sequences", "_fill_ratio": packing (0 else).

With Loader(device="cuda:N") the tensors are torch tensors on that GPU instead: the C++ client
copies each batch there as it arrives (one asynchronous copy from pinned memory, on its own
stream, into a reused device buffer: device/upload.h), and each tensor comes through DLPack,
ordered on torch's current stream after that copy without a host synchronisation (docs/python.md
"GPU delivery").

The package is typed (py.typed; checked with mypy --strict by python_mypy_test). Its modules:
_lib (the library through ctypes), _client (Client, Tensor and the functions over the library),
_loader (Loader), jax and video (optional, imported by name); everything public is imported here.
"""



from ._client import (
    METADATA_KEYS,
    Client,
    Tensor,
    __version__,
    client_defaults,
    device_supported,
    info,
    launch_env,
    parse_servers,
    protocol_version,
    tensors,
    to_torch,
)
from ._lib import ConveyorError
from ._loader import STATE_VERSION, Loader

__all__ = ["Loader", "Client", "ConveyorError", "Tensor", "METADATA_KEYS", "tensors", "to_torch", "info",
           "parse_servers", "launch_env", "STATE_VERSION", "__version__", "device_supported",
           "protocol_version", "client_defaults"]
