"""Module-level sources and transforms for the tests (process mode pickles them by reference),
and the scripted pool and epoch that the scheduler's tests drive with no real worker."""

from __future__ import annotations

import hashlib
import itertools
import os
import signal
import sys
import time

import numpy as np

from steadyfeed import ArraySource
from steadyfeed.execution.handoff import FixedHandoff
from steadyfeed.execution.protocol import Done, Lost
from steadyfeed.execution.scheduler import EpochRun
from steadyfeed.execution.task import BatchResult, Running
from steadyfeed.sampling.plan import build_plan
from steadyfeed.sources.base import LazyHandles
from steadyfeed.stats import LoaderStats

HANG_SECONDS = 600.0  # past every test's timeout: a hang ends only when the test releases it


def child_processes() -> list:
    """This process's children (psutil), without Python's own resource tracker (one per
    interpreter, started by multiprocessing itself): the worker processes."""
    import psutil

    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                out.append(child)
        except psutil.Error:
            continue
    return out


def label_of(x: np.ndarray) -> np.ndarray:
    """The label is a function of the input, so a batch proves its pairs are intact."""
    axes = tuple(range(1, x.ndim))
    return (x.sum(axis=axes) * 3 + 1).astype(np.float64)


def paired_source(n: int, width: int = 4) -> ArraySource:
    x = np.arange(n * width, dtype=np.float64).reshape(n, width)
    return ArraySource(x=x, y=label_of(x))


def assert_paired(batch: dict) -> None:
    np.testing.assert_array_equal(batch["y"], label_of(batch["x"]))
    np.testing.assert_array_equal(batch["x"][:, 0] / batch["x"].shape[1], batch["id"])  # x row i starts at i*width


def noisy(sample: dict, rng: np.random.Generator) -> dict:
    """A random augmentation; keeps y as is."""
    return {**sample, "x": sample["x"] + rng.normal(size=sample["x"].shape)}


def epoch_digest(batches) -> str:
    h = hashlib.sha256()
    for batch in batches:
        for key in sorted(batch):
            h.update(key.encode())
            h.update(np.ascontiguousarray(batch[key]).tobytes())
    return h.hexdigest()


class FaultySource:
    """A paired source whose chosen ids misbehave.

    fail: ids that raise; kill: ids that SIGKILL their own process (once per marker dir);
    hang: ids that mark ``entered-<id>`` and sleep until ``marker_dir/release`` exists (or ``hang_seconds``);
    flaky: ids that fail on their first attempt (tracked by marker files);
    hang_on_node: a Ray node id on which every id hangs (so that node's actor is busy when it dies).
    """

    def __init__(
        self,
        n,
        *,
        fail=(),
        kill=(),
        hang=(),
        flaky=(),
        marker_dir=None,
        slow=0.0,
        hang_seconds=HANG_SECONDS,
        hang_on_node=None,
    ):
        self.inner = paired_source(n)
        self.fail, self.kill, self.hang, self.flaky = set(fail), set(kill), set(hang), set(flaky)
        self.marker_dir = marker_dir
        self.slow = slow
        self.hang_seconds = hang_seconds  # past a test's own timeout: then only the release ends the hang
        self.hang_on_node = hang_on_node

    def __len__(self):
        return len(self.inner)

    def locate(self, i):
        return f"/data/sample_{i:05d}.npy"

    def _first_time(self, tag: str, i: int) -> bool:
        path = os.path.join(self.marker_dir, f"{tag}-{i}")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def __getitem__(self, i):
        if self.slow:
            time.sleep(self.slow)
        if i in self.fail:
            raise ValueError(f"corrupt sample {i}")
        if i in self.flaky and self._first_time("flaky", i):
            raise OSError(f"transient read error on {i}")
        if i in self.kill and self._first_time("kill", i):
            os.kill(os.getpid(), signal.SIGKILL)
        if i in self.hang or (self.hang_on_node is not None and _ray_node() == self.hang_on_node):
            if self.marker_dir is not None:  # so a test can act while the sample is running
                open(os.path.join(self.marker_dir, f"entered-{i}"), "w").close()
            deadline = time.monotonic() + self.hang_seconds
            while time.monotonic() < deadline and not os.path.exists(os.path.join(self.marker_dir, "release")):
                time.sleep(0.02)
        return self.inner[i]


def _ray_node() -> str | None:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def failing_transform(sample, rng):
    if int(sample["x"][0]) // 4 in (3, 11):
        raise RuntimeError("augmentation blew up")
    return sample


class Unpicklable:
    """Pickles fine but cannot be unpickled in a worker: the worker dies at start."""

    def __init__(self, n):
        self.inner = paired_source(n)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i]

    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise RuntimeError("this source refuses to load in a worker")


class BigSource:
    """Samples of ``sample_bytes`` each, made on the fly (the source itself holds nothing)."""

    def __init__(self, n: int, sample_bytes: int):
        self.n, self.width = n, sample_bytes // 8

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.full(self.width, float(i))}


class ManyFiles:
    """Sample ``i`` is the file ``directory/<i>.bin`` (its x: 4 float64 from 4i, y = label_of(x)),
    read with ``os.pread`` through one handle per file (``LazyHandles``), as a TFRecord or
    WebDataset source over thousands of shards reads. ``write(directory, n)`` makes the files."""

    def __init__(self, directory, n: int):
        self.directory, self.n = os.fspath(directory), n
        self._handles = LazyHandles(_open_readonly, os.close)

    @staticmethod
    def write(directory, n: int) -> None:
        os.makedirs(directory, exist_ok=True)
        for i in range(n):
            with open(os.path.join(directory, f"{i}.bin"), "wb") as f:
                f.write(np.arange(4 * i, 4 * i + 4, dtype=np.float64).tobytes())

    def __len__(self):
        return self.n

    def locate(self, i):
        return os.path.join(self.directory, f"{i}.bin")

    def __getitem__(self, i):
        with self._handles.use(self.locate(i)) as fd:
            x = np.frombuffer(os.pread(fd, 32, 0), dtype=np.float64)
        return {"x": x, "y": label_of(x[None])[0]}

    def close(self):
        self._handles.close()


def _open_readonly(path):
    return os.open(path, os.O_RDONLY)


def errors_in_threads(fn, count: int) -> list:
    """Run ``fn(k)`` for k in range(count) on as many threads at once; the exceptions they raised
    (an assertion inside a thread would otherwise be lost)."""
    import threading

    errors = []

    def guarded(k):
        try:
            fn(k)
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


class RaisingSource:
    """Sample ``bad`` raises ``error_type(*args)``, made afresh on every read."""

    def __init__(self, n, bad, error_type, *args):
        self.inner, self.bad, self.error_type, self.args = paired_source(n), bad, error_type, args

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        if i == self.bad:
            raise self.error_type(*self.args)
        return self.inner[i]


class UnpicklableError(Exception):
    """An exception that cannot travel back from a worker process (it holds a lock)."""

    def __init__(self, message):
        super().__init__(message)
        import threading

        self.lock = threading.Lock()


def identity(sample, rng):
    """A transform that changes nothing, but makes the loader read and check sample by sample."""
    return sample


def jitter_rows(batch: dict) -> dict:
    """A Ray Data map (``ray.data.range`` batches in) whose blocks finish in a random order, so
    the order Ray hands them on in varies from run to run; "row" keeps the original id."""
    import random

    time.sleep(random.random() * 0.3)
    return {"row": batch["id"], "x": batch["id"] * 3}


class SlowToStart:
    """A source that, unpickled in any process but its maker's, marks ``starting-<pid>`` and
    waits for ``marker_dir/release``: a worker or actor held inside its start-up."""

    def __init__(self, inner, marker_dir: str):
        self.inner, self.marker_dir, self.maker = inner, marker_dir, os.getpid()

    def __reduce__(self):
        return (_slow_start, (self.inner, self.marker_dir, self.maker))

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i]


def _slow_start(inner, marker_dir: str, maker: int) -> SlowToStart:
    if os.getpid() != maker:
        open(os.path.join(marker_dir, f"starting-{os.getpid()}"), "w").close()
        deadline = time.monotonic() + HANG_SECONDS
        while time.monotonic() < deadline and not os.path.exists(os.path.join(marker_dir, "release")):
            time.sleep(0.02)
    return SlowToStart(inner, marker_dir)


def in_packer() -> bool:
    """Whether this is ``pack_to``'s child process (``steadyfeed.pack_process`` run as ``__main__``)."""
    return sys.argv[0].endswith("pack_process.py")


class HeldInPacker:
    """A source whose sample ``at``, when ``pack_to``'s child process reads it, says so (a file
    ``reached`` in ``marks``, holding the process's nice value) and then waits for a file
    ``go`` there; any other reader, the loader included, reads it at once. Unpickled in that
    child, it writes the nice value it finds to ``unpickled``. Module-level, so it pickles
    into that child."""

    def __init__(self, inner, at: int, marks: str):
        self.inner, self.at, self.marks = inner, at, marks

    def __setstate__(self, state):
        self.__dict__.update(state)
        if in_packer():
            with open(os.path.join(self.marks, "unpickled"), "w") as f:
                f.write(str(os.nice(0)))

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        if i == self.at and in_packer():
            with open(os.path.join(self.marks, "reached"), "w") as f:
                f.write(str(os.nice(0)))
            while not os.path.exists(os.path.join(self.marks, "go")):
                time.sleep(0.01)
        return self.inner[i]

    def fingerprint(self):
        return "held:" + self.inner.fingerprint()


class RefusedInPacker:
    """A source that pickles here but cannot be unpickled in ``pack_to``'s child process (as a
    class defined in a training script's ``__main__`` cannot): everywhere else it is ``inner``."""

    def __init__(self, inner):
        self.inner = inner

    def __setstate__(self, state):
        if in_packer():
            raise AttributeError("RefusedInPacker is not importable here")
        self.__dict__.update(state)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i]

    def fingerprint(self):
        return "refused:" + self.inner.fingerprint()


def epoch_run(
    pool,
    n: int,
    batch_size: int,
    *,
    prefetch: int,
    retries: int = 0,
    stop_on_failure: bool = False,
    max_blameless_deaths: int = 3,
    grouping=None,
):
    """An EpochRun of ids 0..n-1 in order, in batches of ``batch_size``, on a scripted ``pool``
    whose workers always get the batches (tests of the scheduler, with no real worker)."""
    plan = build_plan(
        np.arange(n, dtype=np.int64),
        batch_size=batch_size,
        shard_index=0,
        shard_count=1,
        last_batch="partial",
        with_draws=False,
    )
    return EpochRun(
        pool,
        plan,
        epoch=0,
        start=0,
        prefetch=prefetch,
        retries=retries,
        stop_on_failure=stop_on_failure,
        task_ids=itertools.count(),
        max_blameless_deaths=max_blameless_deaths,
        stats=LoaderStats(),
        handoff=FixedHandoff(to_workers=True),
        grouping=grouping,
    )


def result_of(task):
    kept = [p for p in range(len(task.spec.ids)) if p not in task.excluded]
    return BatchResult(task.task_id, task.spec.index, {"id": task.spec.ids[kept]}, (), {"read": 0.0})


class ScriptedPool:
    """A pool for tests of the scheduler, with no real worker: ``script(task) -> None`` finishes
    the task with ``finish(task)`` (by default its kept ids, ``result_of``); ``-> (position or
    Stage or None, cause)`` loses its worker while at that place. ``order`` picks which pending
    task reports first; ``workers``: how many the pool says it has (idle: those beyond the
    pending tasks)."""

    def __init__(self, script=lambda task: None, capacity=4, order="lifo", finish=None, workers=2):
        self.script, self.capacity, self.order = script, capacity, order
        self.finish, self.workers = finish or result_of, workers
        self.pending, self.submitted, self.max_in_flight = [], [], 0

    def free_slots(self):
        return self.capacity - len(self.pending)

    def idle_workers(self):
        return max(0, self.workers - len(self.pending))

    def submit(self, task):
        assert self.free_slots() > 0, "submitted past free_slots()"
        self.pending.append(task)
        self.submitted.append(task)
        self.max_in_flight = max(self.max_in_flight, len(self.pending))

    def run_here(self, task):
        raise AssertionError("the workers' handoff never makes a batch in the consumer")

    def drain(self):
        return []

    def wait(self, timeout):
        assert self.pending, "waited with nothing in flight: the run would hang"
        task = self.pending.pop(-1 if self.order == "lifo" else 0)
        scripted = self.script(task)
        if scripted is None:
            return [Done(self.finish(task))]
        where, cause = scripted  # where None: lost with no sample to blame (a Ray node gone)
        running = None if where is None else Running(task.task_id, where, 1.0)
        return [Lost((task,), running, cause, f"scripted {cause}")]

    def shutdown(self):
        pass


class Recording:
    """An allocator standing for a shared-memory slot (arrays full of a marker value): it
    keeps what it made, so a test can check that a batch is those very arrays."""

    def __init__(self):
        self.made = []

    def __call__(self, specs):
        self.made.append({key: np.full(shape, 77, dtype) for key, (shape, dtype) in specs.items()})
        return self.made[-1]
