"""JAX helper: turn each process's slice of a batch into global jax.Arrays.

    from conveyor.jax import loader, make_global_batch
    mesh = jax.sharding.Mesh(jax.devices(), ("data",))
    batches = loader(config="examples/pipeline.yaml")   # rank = jax.process_index()
    for batch in batches:
        g = make_global_batch(batch, mesh, jax.sharding.PartitionSpec("data"))

jax is imported when the helper is called, so `import conveyor` never needs it.
"""

__all__ = ["loader", "make_global_batch"]


def loader(**kwargs):
    """conveyor.Loader with this process's slice: consumer jax.process_index() of
    jax.process_count() (call jax.distributed.initialize() first). The C++ launch function checks
    the count against the SLURM or Open MPI variables jax.distributed.initialize() reads itself
    and raises ValueError, naming them, when they disagree (docs/launch.md)."""
    import jax  # lazy: an optional dependency

    from . import Loader

    return Loader(rank=jax.process_index(), world_size=jax.process_count(), _from_jax=True,
                  **kwargs)


def make_global_batch(local_batch, mesh, pspec):
    """{name: jax.Array} from one process's batch (a conveyor.Loader dict with this process as
    consumer jax.process_index() of jax.process_count()).

    Each tensor becomes a global array sharded over `mesh` by `pspec` (a PartitionSpec, or a dict
    name -> PartitionSpec), through jax.make_array_from_process_local_data: the leading
    (batch) dimension of the global array is the concatenation of every process's slice in
    process order, which is how Conveyor's consumer slices make up the global batch. The "_"
    metadata keys are left out. jax copies the host arrays to its devices.
    """
    import jax  # lazy: an optional dependency
    from jax.sharding import NamedSharding, PartitionSpec

    from . import METADATA_KEYS

    out = {}
    for name, array in local_batch.items():
        if name in METADATA_KEYS:
            continue
        spec = pspec.get(name, PartitionSpec()) if isinstance(pspec, dict) else pspec
        out[name] = jax.make_array_from_process_local_data(NamedSharding(mesh, spec), array)
    return out
