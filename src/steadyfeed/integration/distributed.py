"""Which shard a replica reads, from the framework's own view of the job.

Each helper returns ``{"shard_index": ..., "shard_count": ...}`` for the Loader::

    loader = Loader(source, per_replica_batch, last_batch="pad", **shard_from_jax())

Every replica must use the same ``last_batch`` policy, ``"pad"`` or ``"drop"``: then every
shard has the same number of batches and no replica waits at a collective for a step the
others never take (``"partial"`` may give shards one batch more or less). Under ``"pad"``
the masked rows weigh nothing (``KerasDataset`` makes the mask the sample weight).
The helpers import their framework only when called.
"""

from __future__ import annotations

import os
from typing import Any


def _shard(index: int | str, count: int | str, where: str) -> dict:
    index, count = int(index), int(count)
    if not (count >= 1 and 0 <= index < count):
        raise ValueError(f"{where} gives shard {index} of {count}: need 0 <= index < count")
    return {"shard_index": index, "shard_count": count}


def shard_from_jax() -> dict:
    """One shard per JAX process (host): ``jax.process_index()`` of ``jax.process_count()``."""
    import jax

    return _shard(jax.process_index(), jax.process_count(), "jax")


def shard_from_tf_input_context(ctx: Any) -> dict:
    """One shard per input pipeline of a ``tf.distribute.InputContext``, as given to the
    function of ``strategy.distribute_datasets_from_function``; use
    ``ctx.get_per_replica_batch_size(global_batch)`` as the loader's batch size."""
    return _shard(ctx.input_pipeline_id, ctx.num_input_pipelines, "tf.distribute.InputContext")


def shard_from_torch() -> dict:
    """``torch.distributed`` rank of world size once the process group is initialized,
    else the ``RANK`` / ``WORLD_SIZE`` environment variables torchrun sets (default 0 of 1)."""
    try:
        import torch.distributed as dist
    except ImportError:
        pass
    else:
        if dist.is_available() and dist.is_initialized():
            return _shard(dist.get_rank(), dist.get_world_size(), "torch.distributed")
    return _shard(os.environ.get("RANK", 0), os.environ.get("WORLD_SIZE", 1), "RANK/WORLD_SIZE")
