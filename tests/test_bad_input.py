"""Bad samples and bad options give clear errors that name what was expected. (Samples that
read fine but disagree in shape or dtype: ``test_collate.py``.)"""

import numpy as np
import pytest

from steadyfeed import ArraySource, Loader, SampleError

pytestmark = pytest.mark.timeout(60)


def test_object_arrays_and_non_dicts_are_refused():
    class Objects:
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return {"x": np.array([{"a": 1}], dtype=object)}

    with pytest.raises(SampleError, match="dtype object"):
        list(Loader(Objects(), 1))
    with pytest.raises(SampleError, match="must be a dict"):
        list(Loader(ArraySource(x=np.zeros(3)), 1, transform=lambda s, rng: s["x"]))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"mode": "fork"}, "mode must be one of"),
        ({"last_batch": "wrap"}, "last_batch must be one of"),
        ({"on_error": "ignore"}, "on_error must be one of"),
        ({"shard_index": 2, "shard_count": 2}, "shard_index"),
        ({"timeout": 1.0}, "timeout needs workers >= 1"),
        ({"drop_last": True, "last_batch": "pad"}, "contradicts"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"shuffle": True, "sampler": object()}, "either shuffle=True or a sampler"),
    ],
)
def test_bad_options_are_refused_up_front(kwargs, match):
    kwargs = {"batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        Loader(ArraySource(x=np.zeros(4)), **kwargs)


def test_not_a_source():
    with pytest.raises(TypeError, match="__len__ and __getitem__"):
        Loader(iter([1, 2]), 2)


def test_array_source_lengths_must_match():
    with pytest.raises(ValueError, match="same first dimension"):
        ArraySource(x=np.zeros(3), y=np.zeros(4))


def test_unpicklable_transform_in_process_mode_is_a_clear_error():
    with Loader(ArraySource(x=np.zeros(4)), 2, workers=1, mode="process", transform=lambda s, r: s) as loader:
        with pytest.raises(TypeError, match="cannot be pickled"):
            list(loader)
