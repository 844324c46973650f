"""A /dev/shm too small for the batches (Docker's 64 MB default): never a bus error.

Each namespace test runs a child interpreter in a mount namespace of its own whose /dev/shm is
a 16 MiB tmpfs, with 24 MiB batches in process mode (the case that used to end in SIGBUS and
``WorkerDied ... exited with code -7``). Slots are reserved before any byte is written, so the
shortage is seen in time: under ``transport="auto"`` every batch arrives, by pipe, with one
warning; under ``"shm"`` a SharedMemoryFull names the free and needed bytes and the fixes.
"""

import warnings

import numpy as np
import pytest
from helpers import BigSource, epoch_digest, paired_source
from hostile import run_python

from steadyfeed import Loader

pytestmark = pytest.mark.timeout(300)

# 3 samples of 8 MiB: 24 MiB batches, in a 16 MiB /dev/shm
SCRIPT = """
    import json, os, warnings
    import steadyfeed as sf
    from helpers import BigSource

    def main():
        out = {{}}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sf.Loader(BigSource(12, 8 << 20), 3, workers=2, mode="process", transport={transport!r},
                               with_ids=True) as loader:
                    rows = [(int(i), float(row[0]), float(row[-1])) for b in loader.epoch(0)
                            for i, row in zip(b["id"], b["x"])]
                    out.update(rows=rows, stats={{k: loader.stats()[k] for k in ("transport", "transport_fallback")}})
            except Exception as exc:
                out["error"] = [type(exc).__name__, str(exc), getattr(exc, "needed", None), getattr(exc, "free", None)]
        out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        out["left"] = sorted(os.listdir("/dev/shm"))
        print(json.dumps(out))

    if __name__ == "__main__":
        main()
"""

FIXES = ("--shm-size", "batch_size", "mode='thread'")


def small_shm(transport: str) -> dict:
    return run_python(SCRIPT.format(transport=transport), shm_size="16m")


def test_batches_too_big_for_dev_shm_fall_back_to_pipes_with_one_warning():
    out = small_shm("auto")
    assert "error" not in out, out.get("error")
    assert sorted(i for i, _, _ in out["rows"]) == list(range(12))  # every sample once, none lost
    assert all(first == last == i for i, first, last in out["rows"])  # each row is its own sample, whole
    assert len(out["warnings"]) == 1, out["warnings"]
    warning = out["warnings"][0]
    assert "/dev/shm has" in warning and "25,165,888 bytes" in warning and "pipes" in warning
    assert all(fix in warning for fix in FIXES)
    assert out["stats"] == {"transport": "pipe", "transport_fallback": warning}
    assert out["left"] == []


def test_transport_shm_raises_naming_free_and_needed_bytes_and_the_fixes():
    out = small_shm("shm")
    kind, message, needed, free = out["error"]
    assert kind == "SharedMemoryFull"
    assert needed == 3 * (8 << 20) + 64 and 0 < free <= 16 << 20  # the batch and its id column, 64-byte aligned
    assert "/dev/shm has" in message and "transport='shm' does not fall back" in message
    assert all(fix in message for fix in FIXES)
    assert out["warnings"] == [] and out["left"] == []


def test_a_full_dev_shm_refuses_process_workers_clearly():
    """Not even a worker's one-page status slot fits: a clear error at start, nothing left behind."""
    code = SCRIPT.format(transport="pipe").replace(
        "def main():", "def main():\n        open('/dev/shm/filler', 'wb').write(bytes(16 << 20))", 1
    )
    out = run_python(code, shm_size="16m")
    kind, message, needed, free = out["error"]
    assert kind == "SharedMemoryFull" and "status slot of process worker 0" in message and free < needed
    assert all(fix in message for fix in FIXES)
    assert out["left"] == ["filler"]


def test_batches_that_fit_stay_in_shared_memory():
    out = run_python(
        SCRIPT.format(transport="auto").replace("BigSource(12, 8 << 20)", "BigSource(12, 1 << 20)"), shm_size="16m"
    )
    assert out["stats"] == {"transport": "shm", "transport_fallback": None} and out["warnings"] == []
    assert sorted(i for i, _, _ in out["rows"]) == list(range(12))


def test_no_room_to_lend_copies_batches_out_and_keeps_shared_memory():
    """Lending needs slots beyond the two of the tasks in flight. One worker, 3 MiB batches, all
    kept: five of its slots fit the 16 MiB, the sixth does not. Lending stops (stats say why),
    batches are copied out of the slots they have, and no pipe is needed."""
    code = (
        SCRIPT.format(transport="auto")
        .replace("BigSource(12, 8 << 20)", "BigSource(36, 1 << 20)")
        .replace("workers=2", "workers=1, inline_when_faster=False")
        .replace(
            "rows = [(int(i), float(row[0]), float(row[-1])) for b in loader.epoch(0)",
            "kept = list(loader.epoch(0))\n                    rows = [(int(i), float(row[0]), float(row[-1])) for b in kept",
        )
        .replace(
            '("transport", "transport_fallback")',
            '("transport", "transport_fallback", "lending_stopped", "lent_batches")',
        )
    )
    out = run_python(code, shm_size="16m")
    assert "error" not in out, out.get("error")
    assert sorted(i for i, _, _ in out["rows"]) == list(range(36))
    assert all(first == last == i for i, first, last in out["rows"])
    stats = out["stats"]
    assert (stats["transport"], stats["transport_fallback"], out["warnings"]) == ("shm", None, [])
    assert "/dev/shm has" in stats["lending_stopped"] and "copied out" in stats["lending_stopped"]
    assert 0 < stats["lent_batches"] <= 5  # at most one a slot that fits
    assert out["left"] == []


@pytest.mark.timeout(120)
def test_pipe_transport_gives_the_same_batches_as_shared_memory_and_threads(no_leaks):
    """On any machine: the pipe path is the same batches, bit for bit, and says so in stats()."""
    src = paired_source(203)
    digests, transports = {}, {}
    for name, options in {
        "thread": dict(mode="thread"),
        "shm": dict(mode="process", transport="shm"),
        "pipe": dict(mode="process", transport="pipe"),
    }.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback, no warning
            with Loader(src, 8, shuffle=True, seed=3, workers=2, with_ids=True, **options) as loader:
                digests[name] = epoch_digest(loader.epoch(1))
                transports[name] = loader.stats()["transport"]
    assert digests["pipe"] == digests["shm"] == digests["thread"]
    assert transports == {"thread": "in-process", "shm": "shm", "pipe": "pipe"}


def test_big_batches_by_pipe_arrive_whole(no_leaks):
    with Loader(BigSource(6, 4 << 20), 3, workers=2, mode="process", transport="pipe", with_ids=True) as loader:
        batches = list(loader.epoch(0))
    assert [b["id"].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5]]
    for b in batches:
        np.testing.assert_array_equal(b["x"], np.repeat(b["id"][:, None].astype(float), b["x"].shape[1], axis=1))


def test_ray_status_slots_on_a_full_dev_shm_are_left_out_never_a_bus_error():
    """Ray mode's only own use of /dev/shm, the actors' status slots: with room they are made;
    on a full /dev/shm the consumer's is left out with one warning (its actors keep their own
    slots, as remote ones), an actor's own is None, and nothing is left behind. No cluster is
    started: the slots are made as the pool and the actors make them."""
    pytest.importorskip("ray")
    out = run_python(
        """
        import json, os, warnings
        from steadyfeed.execution import ray_pool, shm

        def fill():
            with open('/dev/shm/filler', 'wb', buffering=0) as f:
                try:
                    while True:
                        f.write(bytes(4096))
                except OSError:
                    pass

        roomy = [ray_pool._create_slot('sftestowna0'), ray_pool.consumer_slot('testr0', 0)]
        made = [roomy[0] is not None, roomy[1] is not None]
        roomy[0].close()
        os.unlink('/dev/shm/sftestowna0')
        shm.release(roomy[1])
        fill()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            full = [ray_pool._create_slot('sftestowna1'), ray_pool.consumer_slot('testr1', 1),
                    ray_pool.consumer_slot('testr2', 2)]
        print(json.dumps({"made": made, "full": [x is None for x in full], "left": sorted(os.listdir('/dev/shm')),
                          "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]}))
    """,
        shm_size="1m",
    )
    assert out["made"] == [True, True]
    assert out["full"] == [True, True, True] and out["left"] == ["filler"]
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "status slot of Ray actor 1" in out["warnings"][0] and "--shm-size" in out["warnings"][0]
