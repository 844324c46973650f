"""One trainer of several: connects to the Ray cluster at ADDRESS, indexes the same Ray Data
pipeline as every other trainer (its blocks finish in a random order, see helpers.jitter_rows),
and writes the "row" values of its shard, in delivery order, to OUT as JSON.

Run: python shard_driver.py ADDRESS SHARD_INDEX SHARD_COUNT OUT [KEY]
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for helpers

import numpy as np  # noqa: E402
import ray  # noqa: E402
from helpers import jitter_rows  # noqa: E402

import steadyfeed.ray as sfr  # noqa: E402
from steadyfeed import Loader  # noqa: E402

ROWS = 2000


def main() -> None:
    address, shard, count, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    key = sys.argv[5] if len(sys.argv) > 5 else None
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sfr.init(address=address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": tests_dir}})
    ds = ray.data.range(ROWS, override_num_blocks=8).map_batches(
        jitter_rows, num_cpus=0.25, compute=ray.data.TaskPoolStrategy(size=4)
    )
    source = sfr.source_from_ray_dataset(ds, key=key)
    with Loader(source, 32, shuffle=True, seed=5, workers=2, shard_index=shard, shard_count=count) as loader:
        rows = np.concatenate([batch["row"] for batch in loader]).tolist()
    with open(out, "w") as f:
        json.dump(rows, f)
    ray.shutdown()


if __name__ == "__main__":
    main()
