"""File descriptors: under ``ulimit -n 64`` a source over 10,000 files runs in every mode.

Handles are opened lazily and kept in a bounded LRU per process (``LazyHandles``); one in use
is never closed under its reader; running out of descriptors (EMFILE) closes every idle handle
and tries again, and failing that is an error naming the file and the limit, never a crash or
a lost sample. The limit is set in a child interpreter (``resource.setrlimit``), so this
process keeps its own.
"""

import errno
import os

import numpy as np
import pytest
from hostile import run_python

from steadyfeed.sources.base import LazyHandles

pytestmark = pytest.mark.timeout(300)

FILES = 10_001
TF_FILES = 640

EVERY_MODE = """
    import json, resource
    import numpy as np
    import steadyfeed as sf
    from helpers import ManyFiles, assert_paired

    def main():
        src = ManyFiles({directory!r}, {n})
        out = {{"limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "runs": {{}}}}
        for workers, mode in ((0, "thread"), (2, "thread"), (2, "process")):
            with sf.Loader(src, 64, shuffle=True, workers=workers, mode=mode, with_ids=True) as loader:
                ids = []
                for batch in loader.epoch(0):
                    assert_paired(batch)
                    ids += batch["id"].tolist()
            out["runs"][f"{{workers}} {{mode}}"] = [sorted(ids) == list(range({n})), src._handles.open_count()]
        print(json.dumps(out))

    if __name__ == "__main__":
        main()
"""


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    from helpers import ManyFiles

    directory = tmp_path_factory.mktemp("many") / "files"
    ManyFiles.write(directory, FILES)
    return str(directory)


def test_a_source_over_10000_files_runs_in_every_mode_under_ulimit_64(many_files):
    out = run_python(EVERY_MODE.format(directory=many_files, n=FILES), nofile=64)
    assert out["limit"] == 64
    max_open = max(4, 64 // 8)
    for setting, (exactly_once, still_open) in out["runs"].items():
        assert exactly_once, setting
        assert still_open <= max_open, setting  # the consumer's own handles (workers=0) stay bounded too


def test_tfrecords_over_many_more_files_than_the_limit_under_ulimit_64(tmp_path):
    """A real source (one handle per file): 10 times more files than descriptors."""
    from helpers import paired_source

    from steadyfeed.sources.tfrecord.example import encode_example, infer_specs
    from steadyfeed.sources.tfrecord.framing import frame

    src = paired_source(TF_FILES)
    specs = infer_specs(src[0])
    for i in range(TF_FILES):  # one record per file, as a careless export would write them
        record = encode_example(src[i], specs)
        header, footer = frame(record)
        (tmp_path / f"r{i:05d}.tfrecord").write_bytes(header + record + footer)
    code = f"""
        import json
        import steadyfeed as sf
        from helpers import assert_paired

        if __name__ == "__main__":
            src = sf.TFRecordSource({str(tmp_path / "*.tfrecord")!r}, cache_dir={str(tmp_path / "idx")!r},
                                    features={{"x": ("float64", (4,)), "y": ("float64", ())}})
            with sf.Loader(src, 128, shuffle=True, workers=2, with_ids=True) as loader:
                ids = []
                for batch in loader.epoch(0):
                    assert_paired(batch)
                    ids += batch["id"].tolist()
            print(json.dumps(sorted(ids) == list(range({TF_FILES}))))
    """
    assert run_python(code, nofile=64) is True


NO_FDS_LEFT = """
    import json, os
    import steadyfeed as sf
    from helpers import ManyFiles

    def main():
        src = ManyFiles({directory!r}, 100)
        out = {{}}
        for free in (1, 0):
            held = []
            try:
                while True:  # another part of the program holds every descriptor but `free`
                    held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                pass
            for _ in range(free):
                os.close(held.pop())
            for workers in (0, 2):
                try:
                    with sf.Loader(src, 10, workers=workers, mode="thread", with_ids=True) as loader:
                        ids = [i for batch in loader.epoch(0) for i in batch["id"].tolist()]
                    out[f"{{free}} {{workers}}"] = sorted(ids) == list(range(100))
                except sf.SampleError as exc:
                    out[f"{{free}} {{workers}}"] = [exc.sample_id, str(exc)]
            for fd in held:
                os.close(fd)
        print(json.dumps(out))

    if __name__ == "__main__":
        main()
"""


def test_one_descriptor_is_enough_and_none_is_an_error_naming_the_file_and_the_limit(many_files):
    out = run_python(NO_FDS_LEFT.format(directory=many_files), nofile=64)
    assert out["1 0"] is True  # one reader, one descriptor: each open closes the idle handle before it
    for workers in (0, 2):
        sample_id, message = out[f"0 {workers}"]
        assert f"{sample_id}.bin" in message and "Too many open files" in message
        assert "may open 64 files at once (ulimit -n" in message and "Raise the limit" in message


# -- the LRU itself, in this process --------------------------------------------------------------
def _open_file(path):
    return os.open(path, os.O_RDONLY)


def _paths(tmp_path, n):
    paths = []
    for i in range(n):
        path = tmp_path / f"{i}.txt"
        path.write_bytes(f"file {i}".encode())
        paths.append(str(path))
    return paths


def test_idle_handles_are_bounded_and_one_in_use_is_never_closed(tmp_path):
    paths = _paths(tmp_path, 12)
    handles = LazyHandles(_open_file, os.close, max_open=3)
    with handles.use(paths[0]) as first:
        for path in paths[1:]:
            with handles.use(path) as fd:
                assert os.pread(fd, 16, 0) == open(path, "rb").read()
            assert handles.open_count() <= 4  # three idle at most, and the one in use
        assert os.pread(first, 16, 0) == b"file 0"  # still open, still the same file
    assert handles.open_count() == 3
    handles.close()
    assert handles.open_count() == 0


def test_a_handle_whose_block_raised_is_idle_again_and_closed_over_the_bound(tmp_path):
    paths = _paths(tmp_path, 3)
    handles = LazyHandles(_open_file, os.close, max_open=1)
    with pytest.raises(ValueError), handles.use(paths[0]):
        raise ValueError("a read failed")
    with handles.use(paths[1]):  # over the bound: the first, idle again, is closed at once
        assert handles.open_count() == 1
    with pytest.raises(ValueError), handles.use(paths[1]), handles.use(paths[2]):
        assert handles.open_count() == 2  # both in use: neither may be closed
        raise ValueError("both in use when it raised")
    assert handles.open_count() == 1  # both given back, the older closed
    handles.close()


class _RunsOutOnce:
    """An opener that finds no descriptor left the first time (another source holds them)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, path):
        self.calls += 1
        if self.calls == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        return os.open(path, os.O_RDONLY)


def test_running_out_closes_every_idle_handle_and_tries_again(tmp_path):
    paths = _paths(tmp_path, 4)
    other = LazyHandles(_open_file, os.close)
    for path in paths[:3]:
        with other.use(path):
            pass
    assert other.open_count() == 3
    handles = LazyHandles(_RunsOutOnce(), os.close)
    with handles.use(paths[3]) as fd:
        assert os.pread(fd, 16, 0) == b"file 3"
    assert other.open_count() == 0  # given back so this one could open
    handles.close()


def test_handles_pickle_empty_and_rebound_to_the_new_process_limit(tmp_path):
    import pickle

    handles = LazyHandles(_open_file, os.close)
    with handles.use(_paths(tmp_path, 1)[0]):
        pass
    clone = pickle.loads(pickle.dumps(handles))
    assert clone.open_count() == 0 and clone.max_open == handles.max_open
    handles.close()
    assert np.all([clone.max_open >= 4])
