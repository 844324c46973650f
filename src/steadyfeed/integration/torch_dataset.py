"""``loader.as_torch()``: the loader as a ``torch.utils.data.IterableDataset`` of tensors.

Guarantees: ``iter(ds)`` is ``iter(loader)`` (from the cursor to the end of that epoch,
each batch once, in steadyfeed's order); every array becomes a tensor with
``torch.from_numpy``, sharing the batch's memory (no copy): fresh memory, or a process
worker's lent shared-memory slot, which is not written again while the tensor lives.

Use it directly (``for batch in ds``) or as ``DataLoader(ds, batch_size=None,
num_workers=0)``. Never give torch workers on top: steadyfeed's workers are the workers,
and each torch worker would replay the whole epoch; iterating inside a torch worker raises.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .epochs import align_epoch


class TorchBatches(IterableDataset):
    def __init__(self, loader: Any):
        super().__init__()
        self.loader = loader

    def __iter__(self) -> Iterator[dict]:
        if get_worker_info() is not None:
            raise RuntimeError(
                "steadyfeed's workers are the workers: use DataLoader(ds, batch_size=None, "
                "num_workers=0), or iterate the dataset directly"
            )
        for batch in self.loader:
            yield {key: torch.from_numpy(array) for key, array in batch.items()}

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the next one iterated (when the loader is between epochs), as a
        torch ``DistributedSampler.set_epoch`` would."""
        align_epoch(self.loader, epoch)
