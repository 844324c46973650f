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
* ``source_from_ray_dataset(ds)`` and ``to_ray_dataset(loader, epoch)`` convert both ways.
"""
from __future__ import annotations

import bisect
from typing import Any

import ray  # absolute import: the Ray package, not this module

from .errors import RayClusterLost
from .execution.ray_pool import ray_init_options

__all__ = ["RayClusterLost", "RayDatasetSource", "init", "source_from_ray_dataset", "to_ray_dataset"]


def init(address: str | None = None, num_cpus: int | None = None, **kwargs: Any):
    """Connect to the Ray cluster at ``address`` ("auto", "host:6379", "ray://host:10001") or,
    with no address, to ``RAY_ADDRESS`` when set, else start a new local cluster with
    ``num_cpus`` CPUs (never silently joining whatever ``ray start`` last left on this machine).
    No dashboard; calling it again while connected is a no-op. Returns Ray's context."""
    return ray.init(**ray_init_options(address, num_cpus, **kwargs))


# -- Ray Data -> steadyfeed ---------------------------------------------------------------
@ray.remote(num_cpus=0)
def _rows_in(block) -> int:
    return len(next(iter(block.values()))) if block else 0


class RayDatasetSource:
    """A random-access source over a materialized Ray Dataset: sample ``i`` is row ``i``.

    The dataset's blocks stay in the Ray object store (as dicts of numpy arrays); this
    object holds only their references and row offsets, so it pickles small and works in
    ``mode="thread"`` and ``mode="ray"`` (not ``mode="process"``: plain processes are not
    Ray workers and cannot fetch object refs). Each reader keeps the last block it fetched,
    so reads in plan order cost one fetch per block; shuffled reads can fetch a block per
    sample, which is slow for large blocks: repartition to small blocks first.
    """

    def __init__(self, block_refs: list, offsets: list[int]):
        self.block_refs, self.offsets = block_refs, offsets  # offsets[k] = first row of block k
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

    def __getstate__(self):
        return {"block_refs": self.block_refs, "offsets": self.offsets, "_cached": None}

    def __repr__(self) -> str:
        return f"RayDatasetSource({len(self)} rows in {len(self.block_refs)} blocks)"


def source_from_ray_dataset(ds) -> RayDatasetSource:
    """Materialize ``ds`` (a ``ray.data.Dataset``) into numpy blocks in the object store.

    Cost: one full pass of the dataset's pipeline and one copy of it in the object store
    (spilled to disk by Ray when larger than memory). Columns must convert to numpy
    (numeric or string; one fixed shape per column). Row order is the dataset's.
    """
    refs = ds.to_numpy_refs()
    sizes = ray.get([_rows_in.remote(ref) for ref in refs])
    keep = [(ref, n) for ref, n in zip(refs, sizes) if n > 0]
    offsets = [0]
    for _, n in keep:
        offsets.append(offsets[-1] + n)
    return RayDatasetSource([ref for ref, _ in keep], offsets)


# -- steadyfeed -> Ray Data ---------------------------------------------------------------
def to_ray_dataset(loader, epoch: int = 0):
    """The batches of ``loader.epoch(epoch)`` as a materialized ``ray.data.Dataset``, one
    block per batch, rows in plan order (``with_ids=True`` keeps the ``id`` column).

    Cost: the whole epoch is produced up front and one Arrow copy of every batch goes into
    the object store; for feeding a model, iterate the loader itself, which streams.
    """
    from ray.data.block import BlockAccessor  # the converter map_batches uses for numpy batches

    blocks = [BlockAccessor.batch_to_block(dict(batch)) for batch in loader.epoch(epoch)]
    if not blocks:
        return ray.data.from_items([])
    return ray.data.from_blocks(blocks)
