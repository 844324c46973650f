"""mode="ray": the scheduler's guarantees hold on Ray actors, and the Ray Data bridges round-trip.

One small local cluster (2 CPUs, no dashboard) serves the whole module. The ``no_leaks``
fixture cannot be used here (Ray's own daemons are children of the test process), so
``no_ray_leaks`` checks what is ours: no actor of steadyfeed's left alive, no worker
thread, no shared-memory segment.
"""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil
import pytest

ray = pytest.importorskip(
    "ray", reason="Ray is not installed (pip install 'steadyfeed[ray]'); skipping mode='ray' tests"
)
pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'steadyfeed[ray]')")

from conftest import snapshot  # noqa: E402
from helpers import (  # noqa: E402
    FaultySource,
    SlowToStart,
    assert_paired,
    child_processes,
    epoch_digest,
    jitter_rows,
    noisy,
    paired_source,
)

import steadyfeed.ray as sfr  # noqa: E402
from steadyfeed import CollateError, Loader, SampleTimeout, WorkerDied  # noqa: E402
from steadyfeed.errors import RayClusterLost  # noqa: E402
from steadyfeed.execution import ray_pool, shm  # noqa: E402
from steadyfeed.execution.ray_pool import ACTOR_PREFIX, RayPool  # noqa: E402
from steadyfeed.quality import Checked  # noqa: E402

pytestmark = pytest.mark.timeout(240)  # Ray Data passes take over a minute on a loaded 2-core machine
N = 40
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _start_ray():
    # actors import helpers.py (sources and transforms pickled by reference) like spawned processes do
    sfr.init(num_cpus=2, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": TESTS_DIR}})


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    _start_ray()
    yield
    ray.shutdown()


def our_actors() -> list[str]:
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return [n for n in names if n.startswith(ACTOR_PREFIX)]


@pytest.fixture
def no_ray_leaks():
    yield
    deadline = time.monotonic() + 10
    while our_actors() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert our_actors() == [], f"steadyfeed Ray actors left alive: {our_actors()}"
    after = snapshot()
    assert after["threads"] == [] and after["segments"] == [], after  # status slots included


def delivered_ids(loader):
    batches = list(loader)
    for b in batches:
        assert_paired(b)
    return np.concatenate([b["id"] for b in batches]) if batches else np.zeros(0, np.int64)


def digests(mode, workers=2):
    with Loader(
        paired_source(300), 32, shuffle=True, seed=7, transform=noisy, workers=workers, mode=mode, with_ids=True
    ) as loader:
        return [epoch_digest(loader.epoch(e)) for e in (0, 1)]


def test_exactly_once_and_bit_identical_to_threads(no_ray_leaks):
    assert digests("ray") == digests("thread") == digests("thread", workers=0)
    with Loader(paired_source(N), 4, shuffle=True, workers=2, mode="ray", with_ids=True) as loader:
        assert sorted(delivered_ids(loader).tolist()) == list(range(N))
        running = loader._pool._running_actors()
        assert running and all(a.attached for a in running)  # status read from shared memory here
        batch = next(iter(loader))
        assert all(a.flags.writeable and a.flags.owndata for a in batch.values())  # fresh, not object-store views


def test_actor_killed_mid_epoch_still_exactly_once(marker_dir, no_ray_leaks):
    src = FaultySource(N, marker_dir=marker_dir, slow=0.02)
    with Loader(src, 4, workers=2, mode="ray", with_ids=True, retries=1) as loader:
        ids, victims = [], []
        for i, batch in enumerate(loader):
            ids.append(batch["id"])
            if i == 1:
                victim = next(iter(loader._pool.workers.values()))
                victims.append(victim.wid)
                ray.kill(victim.handle, no_restart=True)
        assert sorted(np.concatenate(ids).tolist()) == list(range(N))
        assert victims[0] not in loader._pool.workers  # the killed actor was replaced


def test_sample_that_kills_its_actor_is_rerun(marker_dir, no_ray_leaks):
    src = FaultySource(N, kill={9, 30}, marker_dir=marker_dir)
    with Loader(src, 4, workers=2, mode="ray", with_ids=True, retries=1) as loader:
        assert sorted(delivered_ids(loader).tolist()) == list(range(N))


@pytest.mark.parametrize("share_status", [True, False], ids=["shared-slot", "own-slot"])
def test_actor_death_without_retries_names_the_sample(share_status, monkeypatch, marker_dir, no_ray_leaks):
    """Own slot: the actor keeps its status in a slot of its own, read after its death by the
    pool's agent on its node, as for an actor on another node (test_ray_cluster.py does it there)."""
    monkeypatch.setattr(RayPool, "share_status", share_status)
    src = FaultySource(N, kill={9}, marker_dir=marker_dir)
    with Loader(src, 4, workers=2, mode="ray", with_ids=True) as loader:
        batches = iter(loader)
        next(batches)
        assert all(a.attached == share_status for a in loader._pool._running_actors())
        with pytest.raises(WorkerDied) as info:
            list(batches)
    assert (info.value.sample_id, info.value.batch_index) == (9, 2)
    assert "Ray actor died" in str(info.value)


def test_actor_cancelled_while_it_starts_leaves_no_status_slot(monkeypatch, marker_dir, no_ray_leaks):
    """Ray cancels the creation of an actor still inside ``__init__`` when the pool shuts down
    (seen in a suite run: its own status slot appeared after the pool had swept them). Held
    while it unpickles the source, shut down, then let go: nothing of the pool is left once
    its process is gone."""
    monkeypatch.setattr(RayPool, "share_status", False)  # every actor would make a slot of its own
    loader = Loader(SlowToStart(paired_source(N), marker_dir), 4, workers=1, mode="ray")
    loader._ensure_pool()
    while not (starting := [f for f in os.listdir(marker_dir) if f.startswith("starting-")]):
        time.sleep(0.05)
    loader.close()
    open(os.path.join(marker_dir, "release"), "w").close()
    pid = int(starting[0].split("-")[1])
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    assert snapshot()["segments"] == []


@pytest.mark.parametrize("consumer_shm", ["same", "another machine's"])
def test_an_actor_started_after_its_pool_let_it_go_makes_no_slot_of_its_own(consumer_shm, no_ray_leaks):
    """An actor whose ``started`` runs after its pool shut down (a suite run under load: its
    creation ended as the pool shut down, and 4 ms after the kill it made its own status slot,
    which outlived the pool's sweep) finds the consumer's slot gone from the same ``/dev/shm``
    and makes none. Where the consumer's ``/dev/shm`` is another machine's (a Ray Client
    driver), a slot of its own is what it keeps, as before."""
    if ray_pool.shm_identity() is None:
        pytest.skip("no boot id or /dev/shm here to tell one machine's shared memory from another's")
    token = shm.owner_token()  # the leak checks look for slots named after this process
    own = f"{shm.PREFIX}{token}a0"
    shm_id = ray_pool.shm_identity() if consumer_shm == "same" else "elsewhere"
    node = ray.get_runtime_context().get_node_id()
    actor = ray_pool.BatchActor.options(**ray_pool.ACTOR_OPTIONS).remote(
        None, f"{shm.PREFIX}{token}r0", node, own, shm_id
    )
    try:
        _, _, kept = ray.get(actor.started.remote(), timeout=120)
        made = os.path.exists(os.path.join(ray_pool.SHM_DIR, own))
    finally:
        ray.kill(actor)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(ray_pool.SHM_DIR, own))
    assert (kept, made) == ((None, False) if consumer_shm == "same" else (own, True))


def test_skip_quarantines_with_the_same_fields_as_threads(marker_dir, no_ray_leaks):
    src = FaultySource(N, fail={0, 13, 39}, marker_dir=marker_dir)
    reports = {}
    for mode in ("thread", "ray"):
        with Loader(src, 4, workers=2, mode=mode, with_ids=True, on_error="skip") as loader:
            assert sorted(delivered_ids(loader).tolist()) == sorted(set(range(N)) - {0, 13, 39})
            reports[mode] = loader.quarantine_report()
    assert reports["ray"] == reports["thread"]
    assert reports["ray"][1]["location"] == "/data/sample_00013.npy"


def test_hung_sample_times_out_naming_it(marker_dir, no_ray_leaks):
    src = FaultySource(N, hang={17}, marker_dir=marker_dir)
    with Loader(src, 4, workers=2, mode="ray", timeout=0.5) as loader:  # the hang outlasts the test's timeout
        with pytest.raises(SampleTimeout) as info:
            list(loader)
    assert info.value.sample_id == 17 and "timeout=0.5" in str(info.value)


@pytest.fixture
def polled_status(monkeypatch):
    """Actors as on another node: status through status() calls, not shared memory."""
    monkeypatch.setattr(RayPool, "share_status", False)


def test_remote_style_status_still_times_out_and_recovers(polled_status, marker_dir, no_ray_leaks):
    src = FaultySource(N, hang={17}, kill={30}, marker_dir=marker_dir)
    with Loader(src, 4, workers=2, mode="ray", timeout=0.5, retries=1, on_error="skip", with_ids=True) as loader:
        ids = delivered_ids(loader)
        assert not any(a.attached for a in loader._pool.workers.values())
        report = loader.quarantine_report()
    assert sorted(ids.tolist()) == sorted(set(range(N)) - {17})
    assert [(r["sample_id"], r["error_type"]) for r in report] == [(17, "SampleTimeout")]


def test_shutdown_kills_every_actor(no_ray_leaks):
    loader = Loader(paired_source(100), 4, workers=2, mode="ray")
    list(loader)
    pids = loader._pool.actor_pids()
    assert len(our_actors()) == 2
    loader.close()
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, f"actor processes still running: {pids}"
        time.sleep(0.1)


def test_two_shards_are_disjoint_and_complete(no_ray_leaks):
    shards = []
    for k in range(2):
        with Loader(
            paired_source(N + 3),
            4,
            shuffle=True,
            seed=3,
            workers=1,
            mode="ray",
            with_ids=True,
            shard_index=k,
            shard_count=2,
        ) as loader:
            shards.append(set(delivered_ids(loader).tolist()))
    assert not shards[0] & shards[1] and shards[0] | shards[1] == set(range(N + 3))


def test_ray_data_bridges_round_trip(no_ray_leaks):
    x = np.arange(N * 3, dtype=np.float32).reshape(N, 3)
    ds = ray.data.from_numpy(x).repartition(4)
    ds = ds.map_batches(lambda b: {"x": b["data"], "y": b["data"].sum(axis=1)}, batch_format="numpy")
    source = sfr.source_from_ray_dataset(ds)
    assert len(source) == N
    with Loader(source, 8, workers=2, mode="ray", with_ids=True) as loader:
        back = sfr.to_ray_dataset(loader, epoch=0)
        rows = back.take_all()
    assert [r["id"] for r in rows] == list(range(N))
    np.testing.assert_array_equal(np.stack([r["x"] for r in rows]), x)
    np.testing.assert_array_equal(np.array([r["y"] for r in rows]), x.sum(axis=1))


def _rows(source):
    return [int(source[i]["row"]) for i in range(len(source))]


def test_the_ray_developer_apis_the_bridges_use_exist():
    """Ray Data's developer APIs (public, less stable than its public ones) that ray.py relies on:
    a Ray release that drops one fails here rather than in a user's run."""
    from ray.data.block import BlockAccessor, BlockMetadata

    ds = ray.data.range(3)
    assert callable(ds.iter_internal_ref_bundles) and hasattr(ds.context.execution_options, "preserve_order")
    bundle = next(iter(ds.iter_internal_ref_bundles()))
    assert all(isinstance(ref, ray.ObjectRef) for ref in bundle.block_refs)
    block = ray.get(bundle.block_refs[0])
    assert list(BlockAccessor.for_block(block).to_numpy()) == ["id"]
    assert BlockAccessor.batch_to_block({"x": np.zeros((2, 3))}).num_rows == 2
    BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
    assert hasattr(ds.context, "target_max_block_size")


# four passes of Ray Data, two of them sorts: 14 s idle, past 180 s with both cores kept busy
@pytest.mark.timeout(480)
def test_ray_data_source_order_does_not_depend_on_how_ray_ran_it(no_ray_leaks):
    ds = ray.data.range(400, override_num_blocks=6).map_batches(  # 3 at once, finishing in any order
        jitter_rows, num_cpus=0.25, compute=ray.data.TaskPoolStrategy(size=3)
    )
    first, second = sfr.source_from_ray_dataset(ds), sfr.source_from_ray_dataset(ds)
    assert _rows(first) == _rows(second) == list(range(400))  # the dataset's own order, each time
    assert first.fingerprint() == second.fingerprint()
    assert not ds.context.execution_options.preserve_order  # the caller's dataset is left as it was
    shuffled = ds.random_shuffle()  # a different order on every pass: only a key can fix one
    by_key = sfr.source_from_ray_dataset(shuffled, key="row")
    assert _rows(by_key) == list(range(400)) and by_key.fingerprint() == first.fingerprint()


def test_ray_data_key_must_be_unique(no_ray_leaks):
    ds = ray.data.range(40, override_num_blocks=4).map_batches(lambda b: {"row": b["id"] // 2})
    with pytest.raises(ValueError, match="key='row' is not unique"):
        sfr.source_from_ray_dataset(ds, key="row")
    with pytest.raises(ValueError, match="key='nope' is not a column"):
        sfr.source_from_ray_dataset(ds, key="nope")


def test_ray_data_id_column_is_refused_up_front_and_kept_once_renamed(no_ray_leaks):
    ds = ray.data.range(10, override_num_blocks=2)
    with pytest.raises(ValueError, match=r"has a column 'id'.*rename_columns\(\{'id': 'row_id'\}\)"):
        sfr.source_from_ray_dataset(ds)
    source = sfr.source_from_ray_dataset(ds.rename_columns({"id": "row_id"}))
    with Loader(source, 4, shuffle=True, with_ids=True) as loader:
        batches = list(loader)
    for b in batches:
        np.testing.assert_array_equal(b["row_id"], b["id"])  # the user's column survives beside the sample id
    assert sorted(np.concatenate([b["row_id"] for b in batches]).tolist()) == list(range(10))


def test_ray_data_strings_of_different_lengths_need_collate_pad(no_ray_leaks):
    ds = ray.data.from_items([{"text": "x" * (i % 5), "n": i} for i in range(12)])
    source = sfr.source_from_ray_dataset(ds)
    with Loader(source, 4) as loader:
        with pytest.raises(CollateError, match="collate='pad'"):
            list(loader)
    with Loader(source, 4, collate="pad", workers=2, mode="ray") as loader:
        texts = [t for b in loader for t in b["text"].tolist()]
    assert texts == ["x" * (i % 5) for i in range(12)]


def test_ray_backed_source_in_process_mode_is_refused_at_construction(no_ray_leaks):
    source = sfr.source_from_ray_dataset(ray.data.range(8).rename_columns({"id": "row"}))
    for wrapped in (source, Checked(source, checks=())):
        with pytest.raises(ValueError, match=r"mode='process'.*use mode='ray' \(Ray actors\) or mode='thread'"):
            Loader(wrapped, 4, workers=2, mode="process")
    assert [p for p in child_processes() if "multiprocessing" in " ".join(p.cmdline())] == []  # nothing started
    with Loader(source, 4, workers=2, mode="thread") as loader:
        assert sorted(int(r) for b in loader for r in b["row"]) == list(range(8))


@pytest.mark.timeout(120)
def test_to_ray_dataset_streams_before_the_epoch_is_made(marker_dir, no_ray_leaks):
    """The epoch's last sample hangs until released (past the test's timeout): the first rows
    must come out of the dataset before it (blocks of ~one batch here, so a tiny epoch shows it)."""
    src = FaultySource(N, hang={N - 1}, marker_dir=marker_dir, hang_seconds=600)
    with Loader(src, 4, with_ids=True) as loader:
        ds = sfr.to_ray_dataset(loader, epoch=0, block_bytes=64)
        blocks = iter(ds.iter_batches(batch_size=None, batch_format="numpy"))
        first = next(blocks)
        open(os.path.join(marker_dir, "release"), "w").close()
        rest = list(blocks)
    ids = np.concatenate([first["id"]] + [b["id"] for b in rest])
    assert first["id"][0] == 0 and ids.tolist() == list(range(N))


def test_to_ray_dataset_under_skip_needs_a_quarantine_file(tmp_path, marker_dir, no_ray_leaks):
    src = FaultySource(N, fail={5, 22}, marker_dir=marker_dir)
    with Loader(src, 4, on_error="skip", with_ids=True) as loader:
        with pytest.raises(ValueError, match="needs quarantine="):
            sfr.to_ray_dataset(loader)
    path = tmp_path / "skipped.jsonl"
    with Loader(src, 4, on_error="skip", with_ids=True, workers=2, mode="ray", quarantine=str(path)) as loader:
        rows = sfr.to_ray_dataset(loader, epoch=1).take_all()
    assert sorted(r["id"] for r in rows) == sorted(set(range(N)) - {5, 22})
    assert [json.loads(line)["sample_id"] for line in path.read_text().splitlines()] == [5, 22]


def test_more_actors_than_cpus_run_on_those_placed_and_name_the_rest(monkeypatch, no_ray_leaks):
    """3 actors of 1 CPU on 2 CPUs: the third never starts; the epoch runs on the others."""
    with Loader(FaultySource(N, slow=0.01), 4, workers=3, mode="ray", with_ids=True) as loader:
        batches = iter(loader)
        ids = [next(batches)["id"]]  # at least one actor runs now
        monkeypatch.setattr(ray_pool, "START_SECONDS", 0.0)  # so the one still waiting is late at the next check
        with pytest.warns(RuntimeWarning, match=r"[12] of 3 Ray actors not started within 0s .*each needs 1 CPU"):
            ids += [b["id"] for b in batches]
    assert sorted(np.concatenate(ids).tolist()) == list(range(N))


def test_actors_that_cannot_be_placed_raise_instead_of_waiting(monkeypatch, no_ray_leaks):
    monkeypatch.setattr(ray_pool, "START_SECONDS", 2.0)
    monkeypatch.setattr(ray_pool, "ACTOR_OPTIONS", {"num_cpus": 1, "resources": {"steadyfeed_test_nowhere": 1}})
    with Loader(paired_source(N), 4, workers=2, mode="ray") as loader:
        with pytest.raises(RayClusterLost, match=r"no Ray actor of this loader has been running for 2s") as info:
            list(loader)
    assert info.value.address == ray.get_runtime_context().gcs_address
    assert "2 waiting to start, each needs 1 CPU, 1 steadyfeed_test_nowhere" in str(info.value)


def test_cluster_going_away_raises_instead_of_hanging(no_ray_leaks):
    """Last: it shuts the module's cluster down, then starts it again. Then a Ray Data source
    whose rows went with that cluster is refused when a Loader is built on it."""
    source = sfr.source_from_ray_dataset(ray.data.range(8).rename_columns({"id": "row"}))
    try:
        with Loader(paired_source(200), 4, workers=2, mode="ray") as loader:
            with pytest.raises(RayClusterLost, match="Ray cluster at .* is gone"):
                for i, _ in enumerate(loader):
                    if i == 1:
                        ray.shutdown()
        with pytest.raises(ValueError, match="not connected to Ray: build the source again"):
            Loader(source, 4, workers=2, mode="thread")
    finally:
        _start_ray()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_head(temp_dir: str, port: int) -> None:
    """Every process of the test's own head: those naming its temp dir or port, and their children
    (the raylet's agents and workers, which rename themselves "ray::..."), never anyone else's Ray."""
    roots = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if (temp_dir in cmdline or f":{port} " in cmdline) and proc.pid != os.getpid():
            roots.append(proc)
    victims = list(roots)
    for proc in roots:
        try:
            victims.extend(proc.children(recursive=True))
        except psutil.Error:
            pass
    for proc in victims:
        try:
            proc.kill()
        except psutil.Error:
            pass


@pytest.mark.timeout(120)
def test_head_killed_raises_cluster_lost(no_ray_leaks):
    """A separate head (its own short temp dir, so nothing of it outlives the test) is killed mid-epoch."""
    ray.shutdown()
    temp_dir = tempfile.mkdtemp(prefix="sfray")  # short: Ray's socket paths must fit in 107 bytes
    port = _free_port()
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    try:
        subprocess.run(
            [
                ray_cli,
                "start",
                "--head",
                f"--port={port}",
                f"--temp-dir={temp_dir}",
                "--num-cpus=2",
                "--include-dashboard=false",
                "--disable-usage-stats",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        sfr.init(address=f"127.0.0.1:{port}", log_to_driver=False)
        with Loader(paired_source(100_000), 4, workers=2, mode="ray") as loader:
            with pytest.raises(RayClusterLost, match=f"Ray cluster at .*:{port} .*head does not answer"):
                for i, _ in enumerate(loader):
                    if i == 5:
                        _kill_head(temp_dir, port)  # the head's GCS, raylet, agents and the actors
    finally:
        ray.shutdown()
        _kill_head(temp_dir, port)
        shutil.rmtree(temp_dir, ignore_errors=True)
        _start_ray()
