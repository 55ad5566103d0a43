"""conveyor.Loader: the batches of one training rank, over conveyor.Client (one stream per
iteration), with the cursor, the data it pins and the coverage ledger kept across iterations, and
a state_dict() that resumes exactly. Imported as `from conveyor import Loader`; docs/python.md.
"""

from __future__ import annotations

import os
import warnings
from typing import (TYPE_CHECKING, Any, Dict, Generator, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, Union)

from ._client import (
    METADATA_KEYS,
    Batch,
    Client,
    Cursor,
    Servers,
    Start,
    Tensor,
    check_device,
    client_defaults,
    parse_cursor,
    resolve_launch,
    servers_text,
)

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

_HAVE_TORCH: bool
if TYPE_CHECKING:
    # torch is not type-checked here (python/pyproject.toml [tool.mypy]): to the checker the base
    # is a plain object, which is also what it is without torch.
    _Base = object
else:
    # A torch IterableDataset when torch is there, so DataLoader and Stateful loaders accept it.
    try:
        from torch.utils.data import IterableDataset as _Base
        _HAVE_TORCH = True
    except ImportError:  # pragma: no cover - numpy-only installs
        _Base = object
        _HAVE_TORCH = False


def _cursor_pair(value: Sequence[int]) -> Cursor:
    """(epoch, step) from a saved pair ([epoch, step] in a state, a batch's "_next")."""
    epoch, step = value
    epoch, step = int(epoch), int(step)
    if epoch < 0 or step < 0:
        raise ValueError(f"cursor {value!r}: epoch and step must be >= 0")
    return (epoch, step)


def _parse_start(start: Optional[Start]) -> Tuple[Cursor, Optional[int]]:
    """((epoch, step), position or None) from None (0:0), (epoch, step), or the cursor's text
    "EPOCH:STEP" or "EPOCH@POSITION" (the C library's parser: ValueError naming the text)."""
    if start is None:
        return (0, 0), None
    if isinstance(start, str):
        return parse_cursor(start)
    return _cursor_pair(start), None


def _parse_device(device: Any) -> int:
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
                return int(torch.cuda.current_device())
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise ValueError(f"device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")


def _torch_from_device(tensor: Tensor) -> Any:
    """A conveyor.Tensor on the GPU as a torch tensor, through DLPack: torch passes its current
    stream, which the export orders after the batch's copy (no host wait)."""
    import torch
    if tensor.dtype == "bool":  # torch 1.x reads no DLPack bool: the bytes as uint8, viewed
        return torch.from_dlpack(tensor.as_uint8()).view(torch.bool)
    return torch.from_dlpack(tensor)


def _read_config(config: Union[str, os.PathLike[str], None]) -> str:
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


class Loader(_Base):
    """The batches of one training rank, from one or more data servers.

    Arguments (job, max_batches, prefetch, prefetch_bytes and reconnect_timeout_s left None take
    the C client's defaults, conveyor.client_defaults(): job "default", max_batches 0, prefetch
    its prefetch_batches, ...):
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
        versions"; 3 also decodes audio in chunks, 4 also cuts video crops in the decoder); None:
        the config's. load_state_dict() sets the one the state was saved under.
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

    def __init__(self, servers: Optional[Servers] = None, job: Optional[str] = None,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 config: Union[str, os.PathLike[str], None] = None,
                 config_name: Optional[str] = None, start: Optional[Start] = None,
                 max_batches: Optional[int] = None, prefetch: Optional[int] = None,
                 auth_token: Optional[str] = None, reconnect_timeout_s: Optional[float] = None,
                 prefetch_bytes: Optional[int] = None, schedule_version: Optional[int] = None,
                 device: Any = "cpu", _from_jax: bool = False, **client_options: Any) -> None:
        super().__init__()
        # Left None: the C client's defaults (client_defaults()), kept here as the values this
        # Loader sends, so that its attributes and repr say what is in force.
        defaults = client_defaults()
        # Checked first, here rather than at the first batch: a job on the wrong machine or
        # build fails at once, with the device and the reason in the message.
        self._device_index = _parse_device(device)
        self.device = "cpu" if self._device_index < 0 else f"cuda:{self._device_index}"
        if self._device_index >= 0:
            if not _HAVE_TORCH:
                raise ImportError(f"conveyor.Loader(device={self.device!r}) yields torch "
                                  "tensors: torch is not installed")
            check_device(self._device_index)
        launch = resolve_launch(rank=None if rank is None else int(rank),
                                 world_size=None if world_size is None else int(world_size),
                                servers=servers_text(servers), from_jax=_from_jax)
        self.servers: List[str] = launch["servers"]
        self.job = str(defaults["job"] if job is None else job)
        self.rank: int = launch["rank"]
        self.world_size: int = launch["world_size"]
        self.launch_source: str = launch["source"]
        if config is not None and config_name is not None:
            raise ValueError("give config or config_name, not both")
        self.config_yaml = _read_config(config)
        self.config_name = config_name or ""
        self.max_batches = int(defaults["max_batches"] if max_batches is None else max_batches)
        self.prefetch = max(1, int(defaults["prefetch_batches"] if prefetch is None else prefetch))
        self.prefetch_bytes = int(defaults["prefetch_bytes"] if prefetch_bytes is None
                                  else prefetch_bytes)
        self.auth_token = auth_token or ""
        self.reconnect_timeout_s = float(defaults["reconnect_timeout_s"]
                                         if reconnect_timeout_s is None else reconnect_timeout_s)
        self.client_options = client_options
        self._cursor, self._position = _parse_start(start)
        self._global_batch_size = 0  # the server's, from the first batch (or a loaded state)
        self._schedule_version = 0 if schedule_version is None else int(schedule_version)
        if self._schedule_version not in _SCHEDULE_VERSIONS:
            raise ValueError(f"schedule_version {schedule_version!r}: expected 1 to 4")
        # The running iteration's generator, closed by the next one, and its client (stats()).
        self._iterator: Optional[Generator[Batch, None, None]] = None
        self._client: Optional[Client] = None
        self._last_stats: Dict[str, Any] = {}
        self._coverage: List[Dict[str, Any]] = []  # the ledgers of iterations that ended
        # What the job trains on: the served dataset's fingerprint and config digest, from the
        # first batch, or pinned by a loaded state so that a server of other data is refused.
        self._data: Dict[str, Optional[str]] = {"dataset_fingerprint": None,
                                                "order_digest": None}
        self._pinned = False
        self._data_change_allowed = False

    # --- iteration -------------------------------------------------------------------------

    def _make_client(self) -> Client:
        return Client(servers=self.servers, job=self.job, consumer=self.rank,
                      consumers=self.world_size, start=self._start(), config_yaml=self.config_yaml,
                      config_name=self.config_name, max_batches=self.max_batches,
                      prefetch_batches=self.prefetch, prefetch_bytes=self.prefetch_bytes,
                      auth_token=self.auth_token, reconnect_timeout_s=self.reconnect_timeout_s,
                      schedule_version=self._schedule_version, device=self._device_index,
                      **self._pin_options(), **self.client_options)

    def _pin_options(self) -> Dict[str, Any]:
        if self._data_change_allowed:
            return {"pin_from_environment": False}
        if not self._pinned:
            return {}
        return {"expect_dataset_fingerprint": self._data["dataset_fingerprint"] or "",
                "expect_order_digest": self._data["order_digest"] or ""}

    def _start(self) -> Start:
        if self._position is None:
            return self._cursor
        return f"{self._cursor[0]}@{self._position}"

    def __iter__(self) -> Iterator[Batch]:
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

    def _generate(self, client: Client) -> Generator[Batch, None, None]:
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

    def close(self) -> None:
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

    def stats(self) -> Dict[str, Any]:
        """The C++ client's counters for the current (or last) iteration: batches, bytes,
        messages, reconnects, wait_seconds (time next() waited), server, transport
        ("shared_memory" or "grpc"), shared_memory_batches, shared_memory_refused."""
        if self._client is None or self._client.closed:
            return dict(self._last_stats)
        return self._client.stats()

    def coverage(self) -> List[Dict[str, Any]]:
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
    def cursor(self) -> Cursor:
        """(epoch, step) after the last batch yielded: where the next iteration starts."""
        return self._cursor

    @property
    def position(self) -> Optional[int]:
        """The sample position in its epoch of the next batch (None when not known: before the
        first batch from an (epoch, step) start, or from a server that predates positions)."""
        return self._position

    @property
    def schedule_version(self) -> int:
        """The order's GOP schedule version (0 until the first batch, unless given)."""
        return self._schedule_version

    def state_dict(self, after: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
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
            cursor, position = _cursor_pair(after["_next"]), after.get("_next_position")
        return {"version": STATE_VERSION, "cursor": [int(cursor[0]), int(cursor[1])],
                "position": None if position is None else int(position),
                "global_batch_size": int(self._global_batch_size),
                "schedule_version": int(self._schedule_version),
                "job": self.job, "rank": self.rank, "world_size": self.world_size,
                "dataset_fingerprint": self._data["dataset_fingerprint"],
                "order_digest": self._data["order_digest"]}

    def load_state_dict(self, state_dict: Mapping[str, Any],
                        allow_data_change: bool = False) -> None:
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
        cursor = _cursor_pair(state_dict["cursor"])
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

    def __getstate__(self) -> Dict[str, Any]:  # a copy (pickle, DataLoader worker) gets the settings and cursor
        state = dict(self.__dict__)
        state["_iterator"] = None
        state["_client"] = None
        return state

    def __repr__(self) -> str:
        return (f"conveyor.Loader(servers={self.servers!r}, job={self.job!r}, rank={self.rank}, "
                f"world_size={self.world_size}, cursor={self._start()!r}, "
                f"device={self.device!r})")

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass
