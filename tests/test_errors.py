"""A failing sample's SampleError is also what the worker raised, in every mode."""

import pickle

import pytest
from helpers import RaisingSource

from steadyfeed import Loader, SampleError
from steadyfeed.errors import with_original_type

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("workers,mode", [(0, "thread"), (2, "thread"), (2, "process")])
@pytest.mark.parametrize("error", [ValueError("corrupt"), KeyError("missing 'q'"), FileNotFoundError(2, "gone")])
def test_the_error_is_a_sample_error_and_the_original_type(workers, mode, error, no_leaks):
    with Loader(RaisingSource(20, 9, type(error), *error.args), 4, workers=workers, mode=mode) as loader:
        with pytest.raises(type(error)) as info:
            list(loader)
    raised = info.value
    assert isinstance(raised, SampleError) and type(raised) is with_original_type(SampleError, type(error))
    assert (raised.sample_id, raised.epoch, raised.batch_index, raised.attempts) == (9, 0, 2, 1)
    assert str(raised).startswith(f"sample 9 failed in epoch 0, batch 2, after 1 attempt(s): {type(error).__name__}")
    assert type(raised.__cause__) is type(error)
    again = pickle.loads(pickle.dumps(raised))
    assert type(again) is type(raised) and again.sample_id == 9 and str(again) == str(raised)


def test_types_that_cannot_be_combined_stay_a_plain_sample_error():
    assert with_original_type(SampleError, UnicodeDecodeError) is SampleError  # its constructor takes 5 arguments
    assert with_original_type(SampleError, StopIteration) is SampleError  # would end a generator silently
    assert with_original_type(SampleError, KeyboardInterrupt) is SampleError  # not an Exception


def test_an_error_that_cannot_leave_its_worker_process_is_still_named_and_typed(no_leaks):
    from helpers import UnpicklableError

    from steadyfeed.errors import RemoteError

    with Loader(RaisingSource(8, 5, UnpicklableError, "held a lock"), 4, workers=1, mode="process") as loader:
        with pytest.raises(SampleError) as info:
            list(loader)
    assert isinstance(info.value, RemoteError) and info.value.sample_id == 5
    assert "UnpicklableError: held a lock" in str(info.value)
