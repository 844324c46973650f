"""Stop after k batches, restore into a loader with other workers/mode: the rest is identical."""

import json

import numpy as np
import pytest
from helpers import epoch_digest, noisy, paired_source

from steadyfeed import Loader

pytestmark = pytest.mark.timeout(120)


def make(workers=0, mode="thread", **kw):
    return Loader(
        paired_source(300), 16, shuffle=True, seed=11, transform=noisy, workers=workers, mode=mode, with_ids=True, **kw
    )


@pytest.mark.parametrize("k", [0, 3, 18, 19])
@pytest.mark.parametrize(
    "saver,restorer", [((0, "thread"), (2, "process")), ((2, "process"), (3, "thread")), ((2, "thread"), (0, "thread"))]
)
def test_resume_mid_epoch_into_other_settings(k, saver, restorer, no_leaks):
    with make() as loader:
        reference = list(loader.epoch(1))  # uninterrupted epoch 1
        following = list(loader.epoch(2))
    with make(*saver) as loader:
        list(loader)  # epoch 0
        it = iter(loader)
        for _ in range(k):
            next(it)
        it.close()  # the process is "killed" after k batches of epoch 1
        state = json.loads(json.dumps(loader.state_dict()))
    assert state["epoch"] == (1 if k < len(reference) else 2)
    with make(*restorer) as loader:
        loader.load_state_dict(state)
        rest = list(loader)
    expected = reference[k:] if k < len(reference) else following  # all of epoch 1 taken: epoch 2 is next
    assert epoch_digest(rest) == epoch_digest(expected)
    assert len(rest) == len(expected)


def test_next_iteration_after_a_finished_epoch_is_the_next_epoch():
    with make() as loader:
        list(loader)
        assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["next_batch"] == 0


def test_state_from_a_different_plan_is_refused():
    with make() as a, Loader(paired_source(300), 8, shuffle=True, seed=11) as b:
        with pytest.raises(ValueError, match="batch_size: saved 16, here 8"):
            b.load_state_dict(a.state_dict())
        with pytest.raises(ValueError, match="not a steadyfeed loader state"):
            b.load_state_dict({"epoch": 0})


def test_resume_with_ids_matches_reference_ids():
    with make() as loader:
        ids_full = np.concatenate([b["id"] for b in loader.epoch(0)])
    with make(workers=2) as loader:
        it = iter(loader)
        first = [next(it)["id"] for _ in range(5)]
        it.close()
        state = loader.state_dict()
    with make(workers=1) as loader:
        loader.load_state_dict(state)
        rest = [b["id"] for b in loader]
    assert np.array_equal(np.concatenate(first + rest), ids_full)


def test_replace_changes_execution_not_batches(no_leaks):
    with make(workers=0) as a:
        b = a.replace(workers=2, mode="process")
        assert (b.config.execution.workers, b.config.execution.mode, b.config.read.batch_size) == (2, "process", 16)
        with b:
            assert epoch_digest(a.epoch(0)) == epoch_digest(b.epoch(0))
    with pytest.raises(ValueError, match="batch_size"):
        a.replace(batch_size=0)


def test_state_saved_on_other_data_of_the_same_length_is_refused(tmp_path):
    """Same length, same plan, other data: resuming would silently train on the wrong samples."""
    from steadyfeed import ArraySource, NpyArray

    x = np.arange(300 * 4, dtype=np.float64).reshape(300, 4)
    first, second = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(first, x)
    np.save(second, x[::-1].copy())
    with Loader(NpyArray(x=str(first)), 16, shuffle=True) as a:
        next(iter(a))
        state = a.state_dict()
    with Loader(NpyArray(x=str(second)), 16, shuffle=True) as b:  # another file: another fingerprint
        with pytest.raises(ValueError, match="different data or a different plan .*source"):
            b.load_state_dict(state)
    with Loader(ArraySource(x=x), 16, shuffle=True) as c:  # another kind of source of the same length
        with pytest.raises(ValueError, match="NpyArray"):
            c.load_state_dict(state)
    with Loader(NpyArray(x=str(first)), 16, shuffle=True, workers=2) as d:  # the same data: accepted
        d.load_state_dict(state)
        assert d.state_dict()["next_batch"] == 1
