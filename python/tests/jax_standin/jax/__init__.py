"""A stand-in for jax over numpy: see ../README.md for what it implements and why."""

import os
import re

import numpy as _np

from . import distributed, sharding  # noqa: F401  (jax.distributed, jax.sharding)

__version__ = "0.0-standin"
_BLOCKS = [0]


class Device:
    """One CPU device; ids are process-major, as jax numbers CPU devices of several processes."""

    platform = "cpu"
    device_kind = "stand-in cpu"

    def __init__(self, id, process_index):
        self.id = id
        self.process_index = process_index

    def __repr__(self):
        return f"StandinCpuDevice(id={self.id}, process_index={self.process_index})"


def _local_device_count():
    m = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(m.group(1)) if m else 1


def process_index():
    return distributed._STATE["process_id"]


def process_count():
    return distributed._STATE["num_processes"]


def devices():
    n = _local_device_count()
    out = [Device(p * n + i, p) for p in range(process_count()) for i in range(n)]
    # A test's knob: devices listed last process first, as a mesh built in another order than
    # the processes' would be; the global array's rows then are not the consumer slices' order.
    if os.environ.get("JAX_STANDIN_DEVICES_REVERSED") == "1":
        out.reverse()
    return out


def local_devices():
    return [d for d in devices() if d.process_index == process_index()]


def device_count():
    return len(devices())


def local_device_count():
    return len(local_devices())


class Shard:
    def __init__(self, device, index, data):
        self.device, self.index, self.data = device, index, data


class Array:
    """A global array of which this process holds its devices' shards."""

    def __init__(self, shape, dtype, shards, sharding):
        self.shape, self.dtype, self.sharding = tuple(shape), _np.dtype(dtype), sharding
        self.addressable_shards = shards
        self.ndim = len(self.shape)

    @property
    def is_fully_addressable(self):
        return all(d.process_index == process_index() for d in self.sharding.mesh.devices.flat)

    def block_until_ready(self):
        _BLOCKS[0] += 1
        return self

    def __array__(self, dtype=None, copy=None):
        if not self.is_fully_addressable:  # as jax: the other processes' shards are not here
            raise RuntimeError("Fetching value for `jax.Array` that spans non-addressable "
                               "(non process local) devices is not possible.")
        out = _np.empty(self.shape, self.dtype)
        for s in self.addressable_shards:
            out[s.index] = s.data
        return out if dtype is None else out.astype(dtype)

    def __float__(self):  # reading a scalar waits for it, as jax's does
        self.block_until_ready()
        return float(_np.asarray(self))


def standin_blocks():
    """How many times a value was waited for (block_until_ready, float()): what the tests check
    a trainer's asynchronous dispatch against."""
    return _BLOCKS[0]


def block_until_ready(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            block_until_ready(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            block_until_ready(v)
    elif isinstance(tree, Array):
        tree.block_until_ready()
    return tree


def _shard_rows(sharding, n_global):
    """(device, slice of dim 0) for every device of the mesh, in mesh order."""
    mesh, spec = sharding.mesh, sharding.spec
    devs = list(mesh.devices.flat)
    axis = spec[0] if len(spec) else None
    if axis is None:
        return [(d, slice(0, n_global)) for d in devs]
    if axis not in mesh.axis_names or mesh.devices.ndim != 1:
        raise ValueError(f"stand-in jax shards dim 0 over a 1-D mesh only, not {spec} of "
                         f"{mesh.axis_names}")
    if n_global % len(devs):
        raise ValueError(f"dim 0 of size {n_global} does not split over {len(devs)} devices")
    per = n_global // len(devs)
    return [(d, slice(i * per, (i + 1) * per)) for i, d in enumerate(devs)]


def make_array_from_process_local_data(sharding, local_data, global_shape=None):
    """This process's rows of the global array (dim 0 sharded over a 1-D mesh, or replicated)."""
    local_data = _np.asarray(local_data)
    spec = sharding.spec
    sharded = len(spec) > 0 and spec[0] is not None
    mine = [d for d in sharding.mesh.devices.flat if d.process_index == process_index()]
    n_dev = sharding.mesh.devices.size
    if global_shape is None:
        rows = local_data.shape[0] * n_dev // len(mine) if sharded else local_data.shape[0]
        global_shape = (rows,) + local_data.shape[1:]
    shards, first = [], None
    for d, rows in _shard_rows(sharding, global_shape[0]):
        if d.process_index != process_index():
            continue
        if first is None:
            first = rows.start
        local = slice(rows.start - first, rows.stop - first) if sharded else rows
        data = local_data[local]
        if data.shape[0] != rows.stop - rows.start:
            raise ValueError(f"local data of shape {local_data.shape} does not hold rows "
                             f"{rows.start}..{rows.stop} of the global {tuple(global_shape)}")
        shards.append(Shard(d, (rows,) + (slice(None),) * (len(global_shape) - 1), data.copy()))
    return Array(global_shape, local_data.dtype, shards, sharding)


def device_put(x, shardings):
    """Host arrays (a list, or one) onto their shardings: in one process, the whole array."""
    if isinstance(x, (list, tuple)):
        if not isinstance(shardings, (list, tuple)):
            shardings = [shardings] * len(x)
        return [device_put(a, s) for a, s in zip(x, shardings)]
    if not all(d.process_index == process_index() for d in shardings.mesh.devices.flat):
        raise ValueError("device_put of host data onto devices of other processes: use "
                         "make_array_from_process_local_data")
    return make_array_from_process_local_data(shardings, x)
