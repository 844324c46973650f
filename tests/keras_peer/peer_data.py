"""Sources for the peer tests: module level, so process workers unpickle them by reference."""

import numpy as np

from steadyfeed import ArraySource


class VaryingShapes:
    """Batches of 16 with 4 then 5 features, then 2 rows of 6: upstream's three differently shaped batches."""

    WIDTHS = [4] * 16 + [5] * 16 + [6] * 2

    def __len__(self):
        return len(self.WIDTHS)

    def __getitem__(self, i):
        return {"x": np.ones(self.WIDTHS[i], "float32"), "y": np.ones(2, "float32")}


class RaisesFromBatchTwo:
    """Four batches of 8: the first two random, then ValueError("Expected exception")."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        if i >= 16:
            raise ValueError("Expected exception")
        rng = np.random.default_rng(i)
        return {"x": rng.random(4).astype("float32"), "y": rng.random(2).astype("float32")}


def arrays_source(**arrays) -> ArraySource:
    return ArraySource(**arrays)
