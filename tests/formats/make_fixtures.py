"""Write the saved-format fixtures of this version into tests/formats/ (run from the repository root).

Each fixture is something a user keeps between versions: a loader checkpoint, a packed
directory. ``tests/test_formats.py`` reads every fixture here with the current code, so a
change that would strand a user's checkpoint or packed data fails the suite.

Run it once when a format gets a new version, for that version only (``--only NAME``); never
regenerate the fixture of an older version: it stands for files users already have.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def fixture_source():
    """The data every fixture is made from; the test builds the same one."""
    import steadyfeed as sf

    x = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    return sf.ArraySource(x=x, y=np.arange(40, dtype=np.int64) % 7)


def sample_ids(batch) -> list[int]:
    """The ids of a batch of the fixture source (row i of x starts at 3 * i)."""
    return (batch["x"][:, 0] // 3).astype(int).tolist()


def loader_state_2() -> None:
    """A mid-epoch checkpoint (epoch 1, after 3 of 10 batches, shuffled) and the ids that follow it."""
    import steadyfeed as sf

    with sf.Loader(fixture_source(), 4, shuffle=True, seed=11) as loader:
        list(loader.epoch(0))
        stream = loader.epoch(1)
        for _ in range(3):
            next(stream)
        state = loader.state_dict()
        rest = [sample_ids(batch) for batch in stream]
        nxt = [sample_ids(batch) for batch in loader.epoch(2)]
    record = {"state": state, "rest_of_epoch_1": rest, "epoch_2": nxt}
    with open(os.path.join(HERE, "loader-state-2.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, sort_keys=True)
        f.write("\n")


def pack_manifest_1() -> None:
    """``pack``'s output (manifest version 1) of the fixture source, shards of 16 records."""
    import steadyfeed as sf

    out = os.path.join(HERE, "pack-manifest-1")
    shutil.rmtree(out, ignore_errors=True)
    sf.pack(fixture_source(), out, shard_size=16, progress=False)
    for name in os.listdir(out):  # offset indexes are caches, rebuilt by a reader: not part of the format
        if name.endswith(".sfidx.npy"):
            os.remove(os.path.join(out, name))


FIXTURES = {"loader-state-2": loader_state_2, "pack-manifest-1": pack_manifest_1}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(FIXTURES), required=True, help="the one fixture to (re)write")
    FIXTURES[parser.parse_args().only]()
    sys.exit(0)
