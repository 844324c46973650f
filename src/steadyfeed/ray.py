"""steadyfeed on Ray: workers as Ray actors, and bridges to and from Ray Data.

Imported explicitly (``import steadyfeed.ray``); Ray itself is imported only here and
in ``execution/ray_pool.py``, so the core never needs it (``pip install 'steadyfeed[ray]'``).

* ``Loader(source, batch_size, workers=N, mode="ray")`` runs the epoch's batches on N Ray
  actors (1 CPU each) of the current Ray connection, or of a local cluster started on first
  use. Order, exactly-once, bit-identical batches, retries, timeouts and the quarantine are
  the same as in thread and process mode: the scheduler is the same, only the pool differs.
* ``init(address=None, num_cpus=None)`` connects to a cluster (or starts a local one) with
  steadyfeed's defaults; calling ``ray.init`` yourself works as well.
* Several trainers: each builds its own Loader with ``shard_index=k, shard_count=n``; the
  shards are disjoint and complete, as in any mode (``last_batch="drop"|"pad"`` evens them).
* ``source_from_ray_dataset(ds, key=None)`` indexes a Ray Dataset as a random-access source
  in an order that does not depend on how Ray ran it; ``to_ray_dataset(loader, epoch)``
  streams an epoch's batches out as a Ray Dataset.
"""

from __future__ import annotations

import bisect
import functools
import os
import pickle
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import ray  # absolute import: the Ray package, not this module
from ray.data import Datasource, ReadTask
from ray.data.block import BlockAccessor, BlockMetadata

from .errors import RayClusterLost
from .execution.ray_pool import ray_init_options

if TYPE_CHECKING:
    from ray.client_builder import BaseContext

    from .config import LoaderConfig
    from .loader import Loader

__all__ = ["RayClusterLost", "RayDatasetSource", "init", "source_from_ray_dataset", "to_ray_dataset"]

RESERVED_COLUMNS = ("id",)  # the loader's own key: every batch carries the sample ids under it
INDEXING_IN_FLIGHT = 32  # blocks being converted at once while a dataset is indexed


def init(address: str | None = None, num_cpus: int | None = None, **kwargs: Any) -> BaseContext:
    """Connect to the Ray cluster at ``address`` ("auto", "host:6379", "ray://host:10001") or,
    with no address, to ``RAY_ADDRESS`` when set, else start a new local cluster with
    ``num_cpus`` CPUs (never silently joining whatever ``ray start`` last left on this machine).
    No dashboard; calling it again while connected is a no-op. Returns Ray's context."""
    return ray.init(**ray_init_options(address, num_cpus, **kwargs))


# -- Ray Data -> steadyfeed ---------------------------------------------------------------
class RayDatasetSource:
    """A random-access source over a Ray Dataset indexed by :func:`source_from_ray_dataset`:
    sample ``i`` is row ``i`` of the dataset in its fixed order.

    The rows stay in the Ray object store (one numpy block per Ray Data block, on the nodes
    that made them); this object holds only their references and row offsets, so it pickles
    small and works in ``mode="thread"`` and ``mode="ray"`` (``mode="process"`` is refused:
    plain processes are not Ray workers and cannot fetch object refs). Each reader keeps the
    last block it fetched, so reads in plan order cost one fetch per block; shuffled reads
    can fetch a block per sample, which is slow for large blocks: repartition to small
    blocks first. ``fingerprint()`` digests every row in order, so a saved loader state
    resumes only on the same rows in the same order.
    """

    def __init__(
        self, block_refs: list, offsets: list[int], *, digest: str, address: str, key: str | None = None
    ) -> None:
        self.block_refs, self.offsets = block_refs, offsets  # offsets[k] = first row of block k
        self.digest, self.address, self.key = digest, address, key
        self._cached: tuple[int, dict] | None = None

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} out of range for a Ray dataset of {len(self)} rows")
        k = bisect.bisect_right(self.offsets, i) - 1
        block = self._block(k)
        row = i - self.offsets[k]
        return {key: column[row] for key, column in block.items()}

    def _block(self, k: int) -> dict:
        if self._cached is None or self._cached[0] != k:
            self._cached = (k, ray.get(self.block_refs[k]))
        return self._cached[1]

    def fingerprint(self) -> str:
        return self.digest

    def unsupported(self, mode: str, workers: int) -> str | None:
        """Why a Loader cannot read this source with ``mode`` and ``workers``, and what to use instead."""
        if workers > 0 and mode == "process":
            return (
                "its rows live in Ray's object store, which spawned worker processes cannot read (they are not "
                "Ray workers, and each would start a Ray of its own): use mode='ray' (Ray actors) or "
                "mode='thread'"
            )
        if not ray.is_initialized():
            return (
                f"its rows live in the object store of the Ray session at {self.address}, and this process is "
                "not connected to Ray: build the source again after steadyfeed.ray.init()"
            )
        return None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cached": None}

    def __repr__(self) -> str:
        order = f"ordered by {self.key!r}" if self.key else "in the dataset's order"
        return f"RayDatasetSource({len(self)} rows in {len(self.block_refs)} blocks, {order})"


def source_from_ray_dataset(ds: ray.data.Dataset, key: str | None = None) -> RayDatasetSource:
    """Index ``ds`` (a ``ray.data.Dataset``) as a source: one pass of its pipeline, each block
    converted to numpy where it was made and kept in the object store (spilled to disk by
    Ray when larger than memory); the driver receives only block references, row counts and
    digests, never the rows.

    Row order never depends on how Ray scheduled the pass, so every trainer that builds the
    source gets the same rows at the same indices (their shards are disjoint and complete)
    and a restart resumes the same order:

    * ``key=None``: the dataset's own order, with Ray Data's ``preserve_order`` on for this
      pass (the order its sources and operators define: e.g. the file list, sorted);
    * ``key="column"``: rows sorted by that column (``ds.sort(key)``), whose values must be
      unique (checked: duplicates would leave ties in Ray's order). Use it when the
      dataset's own order is not stable, e.g. files listed differently between runs.

    A column named ``id`` is refused up front (the loader's batches carry the sample ids
    under ``id``): rename it first, e.g. ``ds.rename_columns({"id": "row_id"})``. Columns
    must convert to numpy; strings of different lengths need ``collate="pad"``.
    """
    columns = ds.columns() or []  # None for a dataset without rows
    _check_columns(columns, key)
    if key is not None:
        ds = ds.sort(key)
    refs, infos = _index_blocks(ds, key, preserve_order=key is None)
    blocks = [(ref, info) for ref, info in zip(refs, infos) if info["rows"] > 0]
    if key is not None:
        blocks = _in_key_order(blocks, key)
    offsets, digest = [0], 0
    for _, info in blocks:
        digest = (digest + pow(_BASE, offsets[-1], _MOD) * info["digest"]) % _MOD
        offsets.append(offsets[-1] + info["rows"])
    return RayDatasetSource(
        [ref for ref, _ in blocks],
        offsets,
        digest=f"{offsets[-1]} rows, {digest:016x}",
        address=ray.get_runtime_context().gcs_address,
        key=key,
    )


def _check_columns(columns: list[str], key: str | None) -> None:
    clash = [c for c in RESERVED_COLUMNS if c in columns]
    if clash:
        raise ValueError(
            f"the Ray dataset has a column {clash[0]!r}, which steadyfeed's batches use for the sample id (it would be "
            f"overwritten); rename it first, e.g. ds = ds.rename_columns({{{clash[0]!r}: 'row_id'}})"
        )
    if key is not None and key not in columns:
        raise ValueError(f"key={key!r} is not a column of the Ray dataset (columns: {columns})")


def _index_blocks(ds: ray.data.Dataset, key: str | None, preserve_order: bool) -> tuple[list, list[dict]]:
    """Stream the dataset's blocks into numpy blocks in the object store: (their refs, their infos)."""
    options = ds.context.execution_options
    saved, options.preserve_order = options.preserve_order, options.preserve_order or preserve_order
    refs, info_refs = [], []
    try:
        for bundle in ds.iter_internal_ref_bundles():  # as they are made: nothing waits for the whole pass
            for block in bundle.block_refs:
                # (Any: Ray's stubs type .remote() as one ObjectRef whatever num_returns says)
                arrays, info = cast(Any, _index_block.remote(block, key))
                refs.append(arrays)
                info_refs.append(info)
                if len(info_refs) > INDEXING_IN_FLIGHT:  # bounded, so Ray Data's blocks do not pile up
                    ray.wait(info_refs, num_returns=len(info_refs) - INDEXING_IN_FLIGHT, fetch_local=False)
    finally:
        options.preserve_order = saved  # the caller's dataset is left as it was
    return refs, ray.get(info_refs)


@ray.remote(num_returns=2)
def _index_block(block: Any, key: str | None) -> tuple[dict, dict]:
    """A Ray Data block as numpy columns (kept in the object store), and what indexing needs of it."""
    arrays = cast(dict, BlockAccessor.for_block(block).to_numpy())  # a table's blocks: {column: array}
    rows = len(next(iter(arrays.values()))) if arrays else 0
    info = {"rows": rows, "digest": _digest(arrays, rows)}
    if key is not None and rows:
        values = arrays[key]
        info.update(
            first=_scalar(values[0]), last=_scalar(values[-1]), unique_sorted=bool(np.all(values[:-1] < values[1:]))
        )
    return arrays, info


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


# The digest of a dataset is a polynomial in its rows' hashes, sum(h[i] * BASE**i) mod 2**64:
# each block sums its own rows (i from 0) and the driver shifts each sum by its block's first
# row, so the digest depends on the rows and their order, never on where blocks begin.
_BASE = 0x100000001B3  # odd (FNV's prime), so no power of it vanishes mod 2**64
_MOD = 1 << 64


def _digest(arrays: dict, rows: int) -> int:
    """sum(h[i] * BASE**i) mod 2**64 over this block's rows (uint64 arithmetic wraps: that is the mod)."""
    if rows == 0:
        return 0
    hashes = _row_hashes(arrays, rows)
    powers = np.cumprod(np.full(rows, _BASE, np.uint64))
    powers = np.concatenate([np.ones(1, np.uint64), powers[:-1]])
    return int((hashes * powers).sum(dtype=np.uint64))


def _row_hashes(arrays: dict, rows: int) -> np.ndarray:
    """One uint64 per row over every column's name and values (vectorized for fixed-size values)."""
    hashes = np.zeros(rows, np.uint64)
    for name in sorted(arrays):
        col = arrays[name]
        if col.dtype == object:  # strings, ragged arrays: one by one
            values = np.array([zlib.crc32(pickle.dumps(v, protocol=4)) for v in col], np.uint64)
        else:
            raw = np.ascontiguousarray(col).view(np.uint8).reshape(rows, -1).astype(np.uint64)
            weights = np.random.default_rng(raw.shape[1]).integers(1, 1 << 63, raw.shape[1], dtype=np.uint64)
            values = (raw * weights).sum(axis=1, dtype=np.uint64)
        tag = np.uint64(zlib.crc32(f"{name}\0{col.dtype.str}\0{col.shape[1:]}".encode()))
        hashes = hashes * np.uint64(_BASE) + (values ^ tag)
    return hashes


def _in_key_order(blocks: list, key: str) -> list:
    """Blocks of a sorted dataset in key order whatever order they came in, checking that the
    key is unique (so no row's place is left to Ray: ties would be)."""
    blocks = sorted(blocks, key=lambda b: b[1]["first"])
    for (_, a), (_, b) in zip(blocks, blocks[1:]):
        if not a["last"] < b["first"]:
            raise ValueError(
                f"key={key!r} is not unique: {a['last']!r} appears more than once, so the order of those "
                "rows would be Ray's; name a column with one value per row"
            )
    for _, info in blocks:
        if not info["unique_sorted"]:
            raise ValueError(
                f"key={key!r} is not unique (a value repeats within a block); name a column with one value per row"
            )
    return blocks


# -- steadyfeed -> Ray Data ---------------------------------------------------------------
def to_ray_dataset(loader: Loader, epoch: int = 0, *, block_bytes: int | None = None) -> ray.data.Dataset:
    """The batches of ``loader.epoch(epoch)`` as a ``ray.data.Dataset`` that streams: rows in
    plan order (``with_ids=True`` adds the ``id`` column), handed on as the batches are made.

    The dataset is lazy: each time it runs, one Ray Data read task on this machine runs a
    copy of ``loader`` (same source, options and workers) over that epoch, yielding each
    batch as it comes, so the rows are bit-identical to the loader's own. Ray Data groups
    them into blocks of ``block_bytes`` (default: its ``DataContext.target_max_block_size``,
    128 MiB): the first block is out once that much is made, never only at the end of the
    epoch. The source and options must pickle (as for process or Ray workers). Under
    ``on_error="skip"`` the copy's skipped samples go to the loader's ``quarantine`` file
    (required: this loader's ``quarantine_report()`` cannot see them). To feed a model from
    this process, iterate the loader itself.
    """
    failure = loader.config.failure
    if failure.on_error == "skip" and failure.quarantine is None:
        raise ValueError(
            "to_ray_dataset with on_error='skip' needs quarantine='FILE': the epoch runs in a Ray Data task on a "
            "copy of the loader, whose skipped samples this loader's quarantine_report() cannot see; pass "
            "quarantine='skipped.jsonl' (appended to on this machine as they happen) or on_error='raise'"
        )
    config = loader.config
    if failure.quarantine is not None:  # the task's working directory is not ours
        config = config.replace(quarantine=os.path.abspath(failure.quarantine))
    source = _EpochDatasource(loader.source, config, int(epoch))
    # the read task only waits for the copy's workers; without workers it makes the batches itself
    cpus = 0 if config.execution.workers not in (None, 0) else 1
    ds = ray.data.read_datasource(source, ray_remote_args={"num_cpus": cpus}, override_num_blocks=1)
    if block_bytes is not None:
        ds.context.target_max_block_size = int(block_bytes)  # this dataset's own copy of the context
    return ds


class _EpochDatasource(Datasource):
    """One read task that yields a block per batch as a copy of the loader makes them."""

    def __init__(self, source: Any, config: LoaderConfig, epoch: int) -> None:
        self.source, self.config, self.epoch = source, config, epoch

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    @property
    def supports_distributed_reads(self) -> bool:
        return False  # on this machine, like the loader it copies (and its quarantine file)

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        metadata = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
        return [ReadTask(functools.partial(_epoch_blocks, self.source, self.config, self.epoch), metadata)]


def _epoch_blocks(source: Any, config: LoaderConfig, epoch: int) -> Iterator[Any]:
    from .loader import Loader  # in the read task's process

    with Loader(source, config=config) as loader:
        for batch in loader.epoch(epoch):
            yield BlockAccessor.batch_to_block(dict(batch))
