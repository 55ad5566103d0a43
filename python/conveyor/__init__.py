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
"""

import os
import warnings

from ._client import (  # noqa: F401  (re-exported)
    METADATA_KEYS,
    Client,
    ConveyorError,
    Tensor,
    __version__,
    check_device as _check_device,
    device_supported,
    get_info as _get_info,
    protocol_version,
    resolve_launch as _resolve_launch,
)

__all__ = ["Loader", "Client", "ConveyorError", "Tensor", "METADATA_KEYS", "tensors", "to_torch", "info",
           "parse_servers", "launch_env", "STATE_VERSION", "__version__", "device_supported",
           "protocol_version"]

# state_dict() format; load_state_dict() reads this one and the earlier ones. 2 adds
# "schedule_version" (the order's GOP schedule version); a version-1 state has none and was saved
# under schedule version 1, so it resumes under that. 3 adds "position" (the sample position of the
# next batch in its epoch: resumes at any global batch size) and "global_batch_size" (the one the
# cursor was recorded at); a version-1 or 2 state resumes its (epoch, step) at the config's batch
# size, as before (set "global_batch_size" in it to resume it at another one).
STATE_VERSION = 3
# Schedule versions this Loader can ask for (0: the config's); the server refuses ones it does not
# know. 3 is version 2's order with audio decoded in chunks (docs/pipeline.md "Schedule versions").
_SCHEDULE_VERSIONS = (0, 1, 2, 3, 4)

try:  # A torch IterableDataset when torch is there, so DataLoader and Stateful loaders accept it.
    from torch.utils.data import IterableDataset as _Base
    _HAVE_TORCH = True
except ImportError:  # pragma: no cover - numpy-only installs
    _Base = object
    _HAVE_TORCH = False


def _servers_text(servers):
    if servers is None:
        return ""
    if isinstance(servers, str):
        return servers
    return ",".join(str(s) for s in servers)


def parse_servers(servers=None):
    """A list of addresses from a list, a comma-separated string, or $CONVEYOR_SERVERS."""
    return _resolve_launch(servers=_servers_text(servers))["servers"]


def launch_env(rank=None, world_size=None, servers=None, servers_required=False):
    """Where this process stands in its job, as the C++ client and the CLI see it: a dict with
    rank, world_size, local_rank, local_world_size, source (the names of what was read, e.g.
    "RANK, WORLD_SIZE"), servers and servers_source. The arguments given win; the rest comes from
    torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), else Open MPI (OMPI_COMM_WORLD_*),
    else SLURM (SLURM_PROCID, SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_LOCALID), else 0 of 1;
    servers from $CONVEYOR_SERVERS. ValueError, naming the variables, when they disagree (a RANK
    without WORLD_SIZE, a rank not below the world size, ...). See docs/launch.md."""
    return _resolve_launch(rank=rank, world_size=world_size, servers=_servers_text(servers),
                           servers_required=servers_required)


def _parse_start(start):
    """((epoch, step), position or None) from (epoch, step), "EPOCH:STEP" or "EPOCH@POSITION"."""
    if isinstance(start, str) and "@" in start:
        parts = start.split("@")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"cursor {start!r}: expected 'EPOCH@POSITION', e.g. '0@640'")
        return (int(parts[0]), 0), int(parts[1])
    return _parse_cursor(start), None


def _parse_cursor(start):
    if start is None:
        return (0, 0)
    if isinstance(start, str):
        parts = start.split(":")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"cursor {start!r}: expected 'EPOCH:STEP' or 'EPOCH@POSITION', "
                             "e.g. '0:0' or '0@640'")
        return (int(parts[0]), int(parts[1]))
    epoch, step = start
    epoch, step = int(epoch), int(step)
    if epoch < 0 or step < 0:
        raise ValueError(f"cursor {start!r}: epoch and step must be >= 0")
    return (epoch, step)


def _parse_device(device):
    """-1 for the host ("cpu", None), else the CUDA ordinal of "cuda", "cuda:N" or a torch.device
    (plain "cuda": torch's current device, else 0)."""
    if device is None:
        return -1
    text = str(device)  # a torch.device prints as "cuda:0" or "cpu"
    if text == "cpu":
        return -1
    if text == "cuda":
        if _HAVE_TORCH:
            import torch
            if torch.cuda.is_available():
                return torch.cuda.current_device()
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise ValueError(f"device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")


def _torch_from_device(tensor):
    """A conveyor.Tensor on the GPU as a torch tensor, through DLPack: torch passes its current
    stream, which the export orders after the batch's copy (no host wait)."""
    import torch
    if tensor.dtype == "bool":  # torch 1.x reads no DLPack bool: the bytes as uint8, viewed
        return torch.from_dlpack(tensor.as_uint8()).view(torch.bool)
    return torch.from_dlpack(tensor)


def _read_config(config):
    """YAML text from a path (str or os.PathLike) or the text itself.

    A str is a path when it has no newline and names an existing file or ends in .yaml/.yml (a
    missing file is then an error here, not a YAML error from the server); otherwise it is YAML.
    """
    if config is None:
        return ""
    if isinstance(config, os.PathLike) or (
            isinstance(config, str) and "\n" not in config
            and (os.path.isfile(config) or config.endswith((".yaml", ".yml")))):
        with open(config, encoding="utf-8") as f:
            return f.read()
    if isinstance(config, str):
        return config
    raise TypeError(f"config must be a path or YAML text, not {type(config).__name__}")


def tensors(batch):
    """The tensors of a batch, without the "_" metadata keys."""
    return {k: v for k, v in batch.items() if k not in METADATA_KEYS}


def to_torch(batch, device=None, non_blocking=True):
    """The tensors of a batch as torch tensors sharing the numpy arrays' memory (torch.from_numpy,
    no copy), moved to `device` when given (a copy then; non_blocking from pinned memory only).
    Metadata keys pass through unchanged."""
    import torch

    out = {}
    for k, v in batch.items():
        if k in METADATA_KEYS:
            out[k] = v
            continue
        t = torch.from_numpy(v)
        out[k] = t if device is None else t.to(device, non_blocking=non_blocking)
    return out


# 64-bit integer fields of conveyor.v1.InfoResponse, which the proto3 JSON mapping writes as
# strings.
_INFO_INT_FIELDS = {"episodes", "max_message_bytes", "active_streams", "samples_per_epoch",
                    "steps_per_epoch", "global_batch_size", "shape"}


def _info_ints(value, key=None):
    if isinstance(value, dict):
        return {k: _info_ints(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_info_ints(v, key) for v in value]
    if key in _INFO_INT_FIELDS and isinstance(value, str):
        return int(value)
    return value


def info(servers=None, auth_token=None):
    """What the first server that answers serves: conveyor.v1.InfoResponse as a dict (dataset
    name and fingerprint, episodes, streams, and per config its digest, samples_per_epoch,
    steps_per_epoch, global_batch_size)."""
    import json

    text = _get_info(servers=parse_servers(servers), auth_token=auth_token or "")
    return _info_ints(json.loads(text))


class Loader(_Base):
    """The batches of one training rank, from one or more data servers.

    Arguments:
      servers: list of "HOST:PORT" (any gRPC target) or a comma-separated string; default
        $CONVEYOR_SERVERS. The client fails over between them (same dataset and config on each).
      job: job name, for the server's logs and metrics.
      rank, world_size: this rank's consumer slice; default: what the launcher set, read by the
        C++ client's one function (launch_env(): torchrun's RANK and WORLD_SIZE, else Open MPI's,
        else SLURM's SLURM_PROCID and task count), else 0 and 1; inconsistent variables are a
        ValueError naming them. Not $LOCAL_RANK: that picks the GPU of a process on its node,
        while the consumer slice is global. The global batch size of the config must be a
        multiple of world_size. With JAX, conveyor.jax.loader() passes jax.process_index() and
        jax.process_count().
      config: a path to a YAML config, or YAML text, sent to the server; config_name: one of the
        configs the server was started with. Neither: the server's default (first) config.
      start: cursor (epoch, step) or "EPOCH:STEP" to begin at (steps of the config's global
        batch size), or "EPOCH@POSITION" (a sample position in the epoch's order, at any batch
        size); default 0:0. load_state_dict() replaces it.
      max_batches: stop each iteration after this many batches (0: until the server's
        max_epochs, or forever).
      prefetch: batches the C++ client keeps received ahead of the trainer (its own thread; no
        DataLoader workers needed). prefetch_bytes bounds them in bytes.
      auth_token: bearer token, when the server asks for one (--auth-token-file).
      reconnect_timeout_s: give up after this long without a batch from any server.
      schedule_version: the order's schedule version, 1 to 4 (docs/pipeline.md "Schedule
        versions"; 3 also decodes audio in chunks, 4 also cuts video crops in the decoder); None: the config's. load_state_dict() sets the one the state was saved under.
      device: "cpu" (default): numpy arrays as described in the module's doc. "cuda:N" (or
        "cuda", a torch.device): torch tensors on that GPU (needs torch and a CUDA build of
        conveyor with a usable GPU; otherwise ConveyorError FAILED_PRECONDITION here, naming the
        device and why). Each batch is copied once, as it arrives, into one of device_buffers
        reused device buffers (client option; default prefetch + 2), and each tensor is ordered
        on torch's current stream after that copy, with no host synchronisation. Keep at most
        two batches when asking for the next; a trainer that holds them all gets
        RESOURCE_EXHAUSTED. Use the tensors on the stream that was current when the batch was
        yielded (or record_stream them): once a batch's tensors are freed, its buffer is
        refilled after the work already queued on that stream.
      **client_options: passed on to conveyor.Client (dataset, tls, tls_ca_pem, tls_cert_pem,
        tls_key_pem, tls_server_name, max_message_bytes, shared_memory, shared_memory_bytes:
        a server on this host builds batches in a region it hands the client, on by default;
        docs/serving.md "Same-host transport"; payload_streams: above 1, payloads striped over
        that many more connections, docs/serving.md "Striped payloads"; device_buffers).

    Iterating yields dicts (see the module's doc). Every iteration starts a stream at the cursor
    after the last batch yielded so far (or `start`), so iterating again continues where the last
    iteration stopped, and after load_state_dict() it resumes exactly there. One iteration at a
    time: starting a new one closes the previous iterator.

    Use it directly, or through torch.utils.data.DataLoader(loader, batch_size=None,
    num_workers=0) (or torchdata's StatefulDataLoader, which calls state_dict()). DataLoader
    workers would each stream the same slice and keep the cursor in another process, so they are
    refused: the prefetch already runs in the C++ client.
    """

    def __init__(self, servers=None, job="default", rank=None, world_size=None, config=None,
                 config_name=None, start=None, max_batches=0, prefetch=4, auth_token=None,
                 reconnect_timeout_s=60.0, prefetch_bytes=1 << 30, schedule_version=None,
                 device="cpu", _from_jax=False, **client_options):
        super().__init__()
        # Checked first, here rather than at the first batch: a job on the wrong machine or
        # build fails at once, with the device and the reason in the message.
        self._device_index = _parse_device(device)
        self.device = "cpu" if self._device_index < 0 else f"cuda:{self._device_index}"
        if self._device_index >= 0:
            if not _HAVE_TORCH:
                raise ImportError(f"conveyor.Loader(device={self.device!r}) yields torch "
                                  "tensors: torch is not installed")
            _check_device(self._device_index)
        launch = _resolve_launch(rank=None if rank is None else int(rank),
                                 world_size=None if world_size is None else int(world_size),
                                 servers=_servers_text(servers), from_jax=_from_jax)
        self.servers = launch["servers"]
        self.job = str(job)
        self.rank = launch["rank"]
        self.world_size = launch["world_size"]
        self.launch_source = launch["source"]
        if config is not None and config_name is not None:
            raise ValueError("give config or config_name, not both")
        self.config_yaml = _read_config(config)
        self.config_name = config_name or ""
        self.max_batches = int(max_batches)
        self.prefetch = max(1, int(prefetch))
        self.prefetch_bytes = int(prefetch_bytes)
        self.auth_token = auth_token or ""
        self.reconnect_timeout_s = float(reconnect_timeout_s)
        self.client_options = client_options
        self._cursor, self._position = _parse_start(start)
        self._global_batch_size = 0  # the server's, from the first batch (or a loaded state)
        self._schedule_version = 0 if schedule_version is None else int(schedule_version)
        if self._schedule_version not in _SCHEDULE_VERSIONS:
            raise ValueError(f"schedule_version {schedule_version!r}: expected 1 to 4")
        self._iterator = None   # the running iteration's generator, closed by the next one
        self._client = None     # its client, for stats()
        self._last_stats = {}
        self._coverage = []     # the ledgers of iterations that ended
        # What the job trains on: the served dataset's fingerprint and config digest, from the
        # first batch, or pinned by a loaded state so that a server of other data is refused.
        self._data = {"dataset_fingerprint": None, "order_digest": None}
        self._pinned = False
        self._data_change_allowed = False

    # --- iteration -------------------------------------------------------------------------

    def _make_client(self):
        return Client(servers=self.servers, job=self.job, consumer=self.rank,
                      consumers=self.world_size, start=self._start(), config_yaml=self.config_yaml,
                      config_name=self.config_name, max_batches=self.max_batches,
                      prefetch_batches=self.prefetch, prefetch_bytes=self.prefetch_bytes,
                      auth_token=self.auth_token, reconnect_timeout_s=self.reconnect_timeout_s,
                      schedule_version=self._schedule_version, device=self._device_index,
                      **self._pin_options(), **self.client_options)

    def _pin_options(self):
        if self._data_change_allowed:
            return {"pin_from_environment": False}
        if not self._pinned:
            return {}
        return {"expect_dataset_fingerprint": self._data["dataset_fingerprint"] or "",
                "expect_order_digest": self._data["order_digest"] or ""}

    def _start(self):
        if self._position is None:
            return self._cursor
        return f"{self._cursor[0]}@{self._position}"

    def __iter__(self):
        if _HAVE_TORCH:
            from torch.utils.data import get_worker_info
            if get_worker_info() is not None:
                raise RuntimeError(
                    "conveyor.Loader runs in the main process: use DataLoader(loader, "
                    "batch_size=None, num_workers=0). The C++ client already prefetches on its "
                    "own thread; in workers every worker would stream the same slice and the "
                    "cursor (state_dict) would live in another process.")
        self.close()
        self._iterator = self._generate(self._make_client())
        return self._iterator

    def _generate(self, client):
        self._client = client
        first = True
        try:
            while True:
                try:
                    batch = client.next()
                except StopIteration:
                    return
                # The cursor after the last batch handed out, set before the trainer sees it:
                # a state_dict() taken while it holds this batch resumes after it. The schedule
                # version is pinned from the first batch on, so later iterations keep the order.
                self._cursor = batch["_next"]
                self._position = batch["_next_position"]
                if not self._schedule_version:
                    self._schedule_version = client.schedule_version()
                if first:  # the batch size this stream's steps count (maybe not a loaded state's)
                    first = False
                    self._global_batch_size = client.global_batch_size()
                    served = client.stats()
                    self._data = {"dataset_fingerprint": served.get("dataset_fingerprint") or None,
                                  "order_digest": served.get("order_digest") or None}
                if self._device_index >= 0:
                    batch = {k: (v if k in METADATA_KEYS else _torch_from_device(v))
                             for k, v in batch.items()}
                yield batch
                del batch  # the trainer's references decide when the batch's block is released
        finally:
            if not client.closed:
                self._last_stats = client.stats()
                self._coverage += client.coverage()
            client.close()

    def close(self):
        """Ends the running iteration (its stream); yielded arrays stay valid. Thread-safe: a
        next() waiting in another thread raises ConveyorError (code CANCELLED) at once."""
        client = self._client
        if client is not None and not client.closed:
            self._coverage += client.coverage()
            client.close()
        it, self._iterator = self._iterator, None
        if it is not None:
            try:
                it.close()
            except ValueError:
                pass  # running in another thread: it ends there with the cancellation

    def stats(self):
        """The C++ client's counters for the current (or last) iteration: batches, bytes,
        messages, reconnects, wait_seconds (time next() waited), server, transport
        ("shared_memory" or "grpc"), shared_memory_batches, shared_memory_refused."""
        if self._client is None or self._client.closed:
            return dict(self._last_stats)
        return self._client.stats()

    def coverage(self):
        """The coverage ledger of every batch this loader yielded, per epoch and consumer slice
        (one entry per slice and iteration; `conveyor audit` adds them up): write it as
        {"coverage": loader.coverage()} to a JSON file, and `conveyor audit DATASET --config F
        --epoch E --trainer-json FILE ...` checks the ranks' files against the order
        (docs/pipeline.md "Coverage ledger")."""
        client = self._client
        current = client.coverage() if client is not None and not client.closed else []
        return list(self._coverage) + current

    # --- state -------------------------------------------------------------------------------

    @property
    def cursor(self):
        """(epoch, step) after the last batch yielded: where the next iteration starts."""
        return self._cursor

    @property
    def position(self):
        """The sample position in its epoch of the next batch (None when not known: before the
        first batch from an (epoch, step) start, or from a server that predates positions)."""
        return self._position

    @property
    def schedule_version(self):
        """The order's GOP schedule version (0 until the first batch, unless given)."""
        return self._schedule_version

    def state_dict(self, after=None):
        """{"version", "cursor": [epoch, step], "position", "global_batch_size",
        "schedule_version", "job", "rank", "world_size", "dataset_fingerprint",
        "order_digest"}; plain JSON types.

        dataset_fingerprint and order_digest pin what the job trained on (None before the
        first batch): load_state_dict() refuses a server of other data (docs/python.md "What a
        job pins").

        The cursor is global, the same on every rank: "position" is the next batch's sample
        position in the epoch's order, so a job may resume it with another world_size and another
        global batch size (a multiple of the world size) and continue the same global sample
        sequence (docs/python.md "State"). "cursor" is (epoch, step) at "global_batch_size", the
        batch size it was recorded at (what "position" is None without: a server that predates
        positions). schedule_version is the order's (0 when no batch was received yet and none
        was given).

        after: a batch (any dict with its "_next" key) to resume right after, instead of after
        the last batch yielded: for a trainer that holds batches ahead of its step
        (conveyor.jax.prefetch_to_device), the state of the last batch it trained on.
        """
        if after is None:
            cursor, position = self._cursor, self._position
        else:
            cursor, position = _parse_cursor(after["_next"]), after.get("_next_position")
        return {"version": STATE_VERSION, "cursor": [int(cursor[0]), int(cursor[1])],
                "position": None if position is None else int(position),
                "global_batch_size": int(self._global_batch_size),
                "schedule_version": int(self._schedule_version),
                "job": self.job, "rank": self.rank, "world_size": self.world_size,
                "dataset_fingerprint": self._data["dataset_fingerprint"],
                "order_digest": self._data["order_digest"]}

    def load_state_dict(self, state_dict, allow_data_change=False):
        """Resume: the next iteration starts at the saved cursor, in the saved order's schedule
        version (a version-1 state, saved before schedule versions existed, resumes under
        schedule version 1). A state with a position resumes there at any global batch size
        and world size; one without (versions 1 and 2, or from an older server) resumes its
        (epoch, step) at its "global_batch_size" when it has one, else at the config's.

        The state pins the data: a server whose dataset fingerprint or config digest differs
        from the state's fails the next iteration with ConveyorError (FAILED_PRECONDITION)
        naming both, since the cursor names other samples there. allow_data_change=True
        continues on purpose (episodes appended, an augmentation changed): the position is then
        read in the new data's order, so the job neither repeats nor skips exactly what it would
        have (docs/python.md "What a job pins")."""
        version = state_dict.get("version")
        if version not in (1, 2, STATE_VERSION):
            raise ValueError(f"conveyor.Loader state version {version!r}, this release reads "
                             f"1 to {STATE_VERSION}")
        if state_dict.get("job", self.job) != self.job:
            warnings.warn(f"conveyor.Loader: state of job {state_dict['job']!r} loaded into job "
                          f"{self.job!r}", stacklevel=2)
        self.close()
        cursor = _parse_cursor(state_dict["cursor"])
        position = state_dict.get("position")
        batch_size = int(state_dict.get("global_batch_size") or 0)
        if position is not None:
            position = int(position)
            if position < 0:
                raise ValueError(f"conveyor.Loader state: position {position!r} must be >= 0")
        elif batch_size > 0:
            position = cursor[1] * batch_size  # the step at the batch size it was recorded at
        self._cursor, self._position = cursor, position
        self._global_batch_size = batch_size
        schedule = 1 if version == 1 else int(state_dict.get("schedule_version", 0))
        if schedule not in _SCHEDULE_VERSIONS:
            raise ValueError(f"conveyor.Loader state: schedule_version {schedule!r}, expected 1 to 4")
        self._schedule_version = schedule
        fingerprint, digest = state_dict.get("dataset_fingerprint"), state_dict.get("order_digest")
        self._data = {"dataset_fingerprint": fingerprint, "order_digest": digest}
        self._pinned = not allow_data_change and bool(fingerprint or digest)
        self._data_change_allowed = bool(allow_data_change)
        if allow_data_change and (fingerprint or digest):
            warnings.warn("conveyor.Loader: resuming without checking the data it was saved on "
                          f"(fingerprint {fingerprint}, config {str(digest)[:12]}): the saved "
                          "position is read in the order of whatever the server serves now",
                          stacklevel=2)

    def __getstate__(self):  # a copy (pickle, DataLoader worker) gets the settings and cursor
        state = dict(self.__dict__)
        state["_iterator"] = None
        state["_client"] = None
        return state

    def __repr__(self):
        return (f"conveyor.Loader(servers={self.servers!r}, job={self.job!r}, rank={self.rank}, "
                f"world_size={self.world_size}, cursor={self._start()!r}, "
                f"device={self.device!r})")

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass
