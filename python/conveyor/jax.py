"""JAX helper: each process's slice of a batch as global jax.Arrays, on the devices, ahead of the
step; the loader's state saved beside the model with Orbax.

    import jax, conveyor.jax as cj
    mesh = jax.sharding.Mesh(jax.devices(), ("data",))
    batches = cj.loader(config="python/examples/policy.yaml")   # rank = jax.process_index()
    for g in cj.prefetch_to_device(batches, mesh, jax.sharding.PartitionSpec("data")):
        state, loss = train_step(state, g)                       # g: {name: global jax.Array}
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                            loader=cj.orbax_save_args(batches)))

Shapes are static: every batch of a config has the same tensors and shapes (the global batch
size is fixed, the remainder of an epoch is not served), so a jitted step compiles once.

jax (and orbax) are imported when a helper is called, so `import conveyor` never needs them.
"""

from __future__ import annotations

import collections
from typing import (TYPE_CHECKING, Any, Deque, Dict, Iterable, Iterator, List, Mapping, Optional,
                    Tuple, Union)

if TYPE_CHECKING:
    from ._loader import Loader

# Which batch a global batch is, and where the next starts (its sample position: a restored job
# may resume at another global batch size and process count).
_CURSOR_KEYS = ("_cursor", "_next", "_position", "_next_position")

__all__ = ["loader", "make_global_batch", "prefetch_to_device", "orbax_save_args",
           "orbax_restore_args", "restore_loader"]


def loader(**kwargs: Any) -> Loader:
    """conveyor.Loader with this process's slice: consumer jax.process_index() of
    jax.process_count() (call jax.distributed.initialize() first). The C++ launch function checks
    the count against the SLURM or Open MPI variables jax.distributed.initialize() reads itself
    and raises ValueError, naming them, when they disagree (docs/launch.md)."""
    import jax  # lazy: an optional dependency

    from . import Loader

    return Loader(rank=jax.process_index(), world_size=jax.process_count(), _from_jax=True,
                  **kwargs)


def _is_device_tensor(value: Any) -> bool:
    from . import Tensor

    return isinstance(value, Tensor) and value.__dlpack_device__()[0] == 2


# NamedSharding per (mesh, spec), made once: building one per tensor per batch was part of the
# per-batch host cost make_global_batch adds to a step (bench/jax_global_batch_bench.py).
_SHARDINGS: Dict[Tuple[Any, Any], Any] = {}


def _sharding(mesh: Any, spec: Any) -> Any:
    key = (mesh, spec)
    s = _SHARDINGS.get(key)
    if s is None:
        from jax.sharding import NamedSharding

        if len(_SHARDINGS) > 64:  # a job uses a few; a caller making meshes per batch stays bounded
            _SHARDINGS.clear()
        s = _SHARDINGS[key] = NamedSharding(mesh, spec)
    return s


def make_global_batch(local_batch: Mapping[str, Any], mesh: Any,
                      pspec: Union[Any, Mapping[str, Any]]) -> Dict[str, Any]:
    """{name: jax.Array} from one process's batch (a conveyor.Loader dict with this process as
    consumer jax.process_index() of jax.process_count()).

    Each tensor becomes a global array sharded over `mesh` by `pspec` (a PartitionSpec, or a dict
    name -> PartitionSpec): the leading (batch) dimension of the global array is the
    concatenation of every process's slice in process order, which is how Conveyor's consumer
    slices make up the global batch. The "_" metadata keys are left out.

    Host batches (numpy views) are copied to the devices asynchronously (jax keeps the numpy
    view, and so the received batch, alive until its copy is done): in one process, the whole
    batch in one jax.device_put (one dispatch for every tensor, where one
    make_array_from_process_local_data per tensor cost a dispatch each); across processes, one
    jax.make_array_from_process_local_data per tensor. Batches a Client with device delivery made
    (conveyor.Tensor on a GPU, one device per process) are taken without a copy through
    jax.dlpack, ordered after the client's upload on the stream jax gives, and assembled with
    jax.make_array_from_single_device_arrays.
    """
    import jax  # lazy: an optional dependency
    from jax.sharding import PartitionSpec

    from . import METADATA_KEYS

    out: Dict[str, Any] = {}
    host_names: List[str] = []
    host_arrays: List[Any] = []
    host_shardings: List[Any] = []
    for name, array in local_batch.items():
        if name in METADATA_KEYS:
            continue
        spec = pspec.get(name, PartitionSpec()) if isinstance(pspec, Mapping) else pspec
        sharding = _sharding(mesh, spec)
        if _is_device_tensor(array):
            local = jax.dlpack.from_dlpack(array)
            global_shape = (local.shape[0] * jax.process_count(),) + tuple(local.shape[1:])
            out[name] = jax.make_array_from_single_device_arrays(global_shape, sharding, [local])
        else:
            host_names.append(name)
            host_arrays.append(array)
            host_shardings.append(sharding)
    if host_arrays:
        if jax.process_count() == 1:  # this process's slice is the global batch
            arrays = jax.device_put(host_arrays, host_shardings)
        else:
            arrays = [jax.make_array_from_process_local_data(s, a)
                      for a, s in zip(host_arrays, host_shardings)]
        out.update(zip(host_names, arrays))
    return {name: out[name] for name in local_batch if name in out}  # the batch's order


def prefetch_to_device(batches: Iterable[Mapping[str, Any]], mesh: Any,
                       pspec: Union[Any, Mapping[str, Any]],
                       size: int = 2) -> Iterator[Dict[str, Any]]:
    """Global batches `size` steps ahead of the consumer: each batch's copies to the devices are
    started (make_global_batch, asynchronous) while the step before runs, so host-to-device time
    overlaps compute, as flax's prefetch_to_device does. `batches` is any iterable of Loader
    dicts (a conveyor.Loader); yields what make_global_batch returns plus the batch's "_cursor",
    "_next", "_position" and "_next_position" (pop them before a jitted step): the loader's
    cursor is `size` batches ahead of the one being trained, so save loader.state_dict(after=g)
    for the last trained batch g."""
    queue: Deque[Dict[str, Any]] = collections.deque()
    it = iter(batches)
    for batch in it:
        g = make_global_batch(batch, mesh, pspec)
        for key in _CURSOR_KEYS:  # which batch this is: Loader.state_dict(after=g)
            if key in batch:
                g[key] = batch[key]
        queue.append(g)
        del batch
        if len(queue) > size:
            yield queue.popleft()
    while queue:
        yield queue.popleft()


def orbax_save_args(loader: Loader, after: Optional[Mapping[str, Any]] = None) -> Any:
    """The loader's state_dict(after=...) as an Orbax checkpoint item (ocp.args.JsonSave), to save
    beside the model in a Composite, so a restored job resumes the data exactly after the batch
    the model last trained on (`after`, with prefetch_to_device; else the last one yielded)."""
    import orbax.checkpoint as ocp  # lazy: an optional dependency

    return ocp.args.JsonSave(loader.state_dict(after=after))


def orbax_restore_args() -> Any:
    """The restore counterpart of orbax_save_args (ocp.args.JsonRestore)."""
    import orbax.checkpoint as ocp  # lazy: an optional dependency

    return ocp.args.JsonRestore()


def restore_loader(loader: Loader, state: Union[Mapping[str, Any], str, bytes]) -> Loader:
    """loader.load_state_dict(state) for the item Orbax restored (a dict, or JSON text)."""
    import json

    loaded: Mapping[str, Any] = json.loads(state) if isinstance(state, (str, bytes)) else state
    loader.load_state_dict(dict(loaded))
    return loader
