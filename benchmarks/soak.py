"""Soak with faults (issue 19): many epochs in thread and process mode while a chaos thread
kills random workers, makes random samples raise and slows random reads.

Checked on every epoch, whatever the timing:

* every sample is delivered exactly once, with its own label, except the samples quarantined
  in that epoch; each quarantined sample is one the chaos made raise, named in the report
  (id, epoch, location, error), and each sample made to raise is quarantined exactly once
  (it raises on every attempt until it has been, then reads again);
* the chaos did happen: workers were killed (process mode: new worker pids appeared);
* RSS, file descriptors, threads, child processes and this process's ``/dev/shm`` entries
  are flat from epoch ``FLAT_FROM`` to the end: no count goes above what the first epochs
  showed (a leak of one thing every few epochs would, over the run), and RSS grows by at
  most ``--rss-slack-mib``.

The chaos is paced by the batches delivered, not by the clock (an action every few batches,
at a random moment within the next few milliseconds), so a slow machine sees as much of it as
a fast one. A kill waits until ``prefetch + 2`` batches were delivered since the last one, so
no batch is lost twice and a sample is never charged more deaths than ``retries`` allows:
a death never costs a sample (that would be the failure policy, tested elsewhere).

    .venv/bin/python benchmarks/soak.py                       # 200 epochs, thread then process (~15 min)
    .venv/bin/python benchmarks/soak.py --epochs 30 --modes process
    .venv/bin/python benchmarks/soak.py --json soak.json      # every epoch's resources too

``tests/test_soak.py`` runs ``soak()`` short (25 epochs of a smaller dataset). Kept to numpy,
psutil and steadyfeed: process workers re-import this module to unpickle the source.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

import steadyfeed as sf

FLAT_FROM = 10
OK, RAISE, SLOW = 0, 1, 2  # a sample's chaos flag
SLOW_SECONDS = 0.03
SHM_DIR = "/dev/shm"


class ChaosError(RuntimeError):
    """What a sample the chaos armed raises."""


class WorkerKilled(BaseException):
    """Ends a worker thread (thread mode's SIGKILL): the pool sees the thread die."""


_KILLS = {"pending": 0}  # thread mode: kills asked for and not yet carried out
_KILLS_LOCK = threading.Lock()


def label_of(x: np.ndarray) -> np.ndarray:
    return x.sum(axis=1) * 3 + 1


class ChaosSource:
    """``n`` paired samples (``y = label_of(x)``, ``x[0] = id * width``) whose reads obey a flag
    per sample in a shared file the chaos thread writes: RAISE raises on every attempt, SLOW
    sleeps once. In thread mode a pending kill ends the worker thread that reads next."""

    def __init__(self, n: int, width: int, control: str):
        self.n, self.width, self.control = n, width, control
        self._flags: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    def __getstate__(self):
        return {**self.__dict__, "_flags": None}  # each process maps the control file itself

    def flags(self) -> np.ndarray:
        if self._flags is None:
            self._flags = np.memmap(self.control, np.int8, "r+", shape=(self.n,))
        return self._flags

    def __getitem__(self, i: int) -> dict:
        flag = int(self.flags()[i])  # no local holds the map: a traceback's frames would keep it open
        if flag == RAISE:
            raise ChaosError(f"chaos: sample {i} raises until it is quarantined")
        if flag == SLOW:
            self.flags()[i] = OK
            time.sleep(SLOW_SECONDS)
        # only in a worker thread (steadyfeed names them so), never in the consumer making a batch itself
        if _KILLS["pending"] and threading.current_thread().name.startswith("steadyfeed-thread"):
            with _KILLS_LOCK:
                if _KILLS["pending"]:
                    _KILLS["pending"] -= 1
                    raise WorkerKilled(f"chaos: worker thread killed on sample {i}")
        x = np.arange(i * self.width, (i + 1) * self.width, dtype=np.float64)
        return {"x": x, "y": label_of(x[None])[0]}

    def locate(self, i: int) -> str:
        return f"chaos sample {i} of {self.n}"


def augment(sample: dict, rng: np.random.Generator) -> dict:
    """Random augmentation that leaves the pair checkable."""
    return {**sample, "noise": rng.normal(size=4)}


# -- resources ----------------------------------------------------------------------------------
def worker_processes() -> list:
    """This process's children, without multiprocessing's resource tracker."""
    import psutil

    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                out.append(child)
        except psutil.Error:
            continue
    return out


def our_shm_entries() -> int:
    """This process's entries in /dev/shm (steadyfeed names them ``sf<pid hex>...``)."""
    from steadyfeed.execution.shm import PREFIX

    if not os.path.isdir(SHM_DIR):
        return 0
    mine = f"{PREFIX}{os.getpid():x}"
    return sum(name.startswith(mine) for name in os.listdir(SHM_DIR))


def resources() -> dict:
    import psutil

    me = psutil.Process()
    return {
        "rss": me.memory_info().rss,
        "fds": me.num_fds(),
        "threads": threading.active_count(),
        "children": len(worker_processes()),
        "shm": our_shm_entries(),
    }


COUNTS = ("fds", "threads", "children", "shm")


def settled(band: dict | None, seconds: float = 5.0) -> dict:
    """Resources now; while a count is above ``band`` (a worker thread between reporting its
    death and returning, a process being reaped), looked at again for up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        now = resources()
        if band is None or all(now[k] <= band[k] for k in COUNTS) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


# -- chaos --------------------------------------------------------------------------------------
@dataclass
class ChaosLog:
    kills: int = 0
    armed: list = field(default_factory=list)  # ids made to raise, once per arming
    slowed: int = 0
    killed_pids: list = field(default_factory=list)


class Chaos(threading.Thread):
    """Acts every ``every`` batches delivered or so (``delivered()``), at a random moment in
    the next few milliseconds: a kill (at most every ``kill_gap`` batches, once in about
    ``kill_every``), a sample armed to raise, or a few slow reads."""

    def __init__(self, mode: str, flags: np.ndarray, seed: int, every: int, kill_every: int, kill_gap: int):
        super().__init__(name="soak-chaos", daemon=True)
        self.mode, self.flags, self.rng = mode, flags, random.Random(seed)
        self.every, self.kill_every, self.kill_gap = every, kill_every, kill_gap
        self.log = ChaosLog()
        self.arming = True  # off for the last epoch: an armed sample must be read again to be quarantined
        self._cond = threading.Condition()
        self._delivered = self._next_at = 0
        self._next_kill = kill_every
        self._last_kill = -kill_gap
        self._busy = self._stopping = False

    def delivered(self) -> None:
        with self._cond:
            self._delivered += 1
            self._cond.notify_all()

    def quarantined(self, ids) -> None:
        """The loader quarantined these: they read again from now on."""
        for i in ids:
            self.flags[i] = OK

    def idle(self) -> None:
        """Wait until no action is under way or due (at an epoch's end, before resources are
        measured and before the next epoch says whether samples may still be armed)."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or (not self._busy and self._delivered < self._next_at))

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self.join()

    def run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._delivered >= self._next_at)
                if self._stopping:
                    return
                self._busy, at = True, self._delivered
                self._next_at = at + self.rng.randint(1, 2 * self.every)
            try:
                time.sleep(self.rng.uniform(0, 0.01))
                self._act(at)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _act(self, at: int) -> None:
        if at >= self._next_kill and at - self._last_kill >= self.kill_gap and self._kill():
            self._last_kill, self._next_kill = at, at + self.rng.randint(self.kill_every // 2, self.kill_every * 3 // 2)
        elif self.arming and self.rng.random() < 0.5:
            candidates = np.flatnonzero(self.flags == OK)
            if len(candidates):
                i = int(candidates[self.rng.randrange(len(candidates))])
                self.flags[i] = RAISE
                self.log.armed.append(i)
        else:
            for _ in range(self.rng.randint(1, 3)):
                i = self.rng.randrange(len(self.flags))
                if self.flags[i] == OK:
                    self.flags[i] = SLOW
                    self.log.slowed += 1

    def _kill(self) -> bool:
        if self.mode == "thread":
            with _KILLS_LOCK:
                _KILLS["pending"] += 1
        else:
            workers = worker_processes()
            if not workers:
                return False
            victim = self.rng.choice(workers)
            try:
                os.kill(victim.pid, signal.SIGKILL)
            except ProcessLookupError:
                return False
            self.log.killed_pids.append(victim.pid)
        self.log.kills += 1
        return True


# -- the soak -----------------------------------------------------------------------------------
@dataclass
class SoakResult:
    mode: str
    epochs: int
    samples: int
    seconds: float
    kills: int
    worker_pids: int  # distinct worker processes seen (process mode)
    armed: int
    quarantined: int
    slowed: int
    problems: list
    series: dict  # resource -> one value per epoch
    flat: dict  # resource -> {"at_10", "min", "max", "band", "flat"}

    @property
    def ok(self) -> bool:
        return not self.problems and all(f["flat"] for f in self.flat.values())


def soak(
    mode: str,
    *,
    epochs: int = 200,
    n: int = 2000,
    width: int = 64,
    batch_size: int = 32,
    workers: int = 2,
    seed: int = 0,
    every: int = 4,
    kill_every: int = 120,
    rss_slack: int = 32 << 20,
    progress=None,
) -> SoakResult:
    """Run the soak in ``mode`` ("thread" or "process"); see the module docstring."""
    _KILLS["pending"] = 0
    with tempfile.TemporaryDirectory(prefix="steadyfeed-soak-") as tmp:
        control = os.path.join(tmp, "flags")
        np.zeros(n, np.int8).tofile(control)
        source = ChaosSource(n, width, control)
        flags = source.flags()
        loader = sf.Loader(
            source,
            batch_size,
            shuffle=True,
            seed=seed,
            transform=augment,
            workers=workers,
            mode=mode,
            with_ids=True,
            on_error="skip",
            retries=2,
            max_error_fraction=0.5,
            timeout=120,
        )
        chaos = Chaos(mode, flags, seed, every, kill_every, kill_gap=loader.config.execution.effective_prefetch + 2)
        try:
            return _run(loader, chaos, mode, epochs, n, rss_slack, progress)
        finally:
            chaos.stop()
            loader.close()
            del flags
            source._flags = None


def _run(loader, chaos: Chaos, mode: str, epochs: int, n: int, rss_slack: int, progress) -> SoakResult:
    problems, seen = [], 0
    series: dict[str, list[int]] = {k: [] for k in ("rss", *COUNTS)}
    pids: set[int] = set()
    quarantined: list[int] = []
    band = None
    chaos.start()
    started = time.perf_counter()
    for epoch in range(epochs):
        chaos.arming = epoch < epochs - 1
        ids = []
        for batch in loader.epoch(epoch):
            if not np.array_equal(batch["y"], label_of(batch["x"])) or not np.array_equal(
                batch["x"][:, 0] / batch["x"].shape[1], batch["id"]
            ):
                problems.append(f"epoch {epoch}: a batch whose pairs are broken")
            ids.append(batch["id"].copy())  # a copy: a view would keep a lent batch's slot (and its map)
            chaos.delivered()
            if mode == "process":
                pids.update(p.pid for p in worker_processes())
        batch = None  # no batch is held while resources are counted
        chaos.idle()  # nothing more happens until the next epoch's first batch
        report = loader.quarantine_report()
        new, seen = report[seen:], len(report)
        chaos.quarantined(e["sample_id"] for e in new)
        quarantined += [e["sample_id"] for e in new]
        problems += _check_epoch(epoch, np.concatenate(ids) if ids else np.array([], int), new, n)
        now = settled(band if epoch >= FLAT_FROM else None)
        for k, v in now.items():
            series[k].append(v)
        if epoch == FLAT_FROM:
            band = {k: max(series[k]) for k in COUNTS}
        if progress:
            progress(epoch, now, chaos.log)
    seconds = time.perf_counter() - started
    log = chaos.log
    if sorted(log.armed) != sorted(quarantined):
        problems.append(f"samples made to raise {sorted(log.armed)} != samples quarantined {sorted(quarantined)}")
    return SoakResult(
        mode,
        epochs,
        n,
        seconds,
        log.kills,
        len(pids),
        len(log.armed),
        len(quarantined),
        log.slowed,
        problems,
        series,
        flatness(series, rss_slack),
    )


def _check_epoch(epoch: int, ids: np.ndarray, entries: list[dict], n: int) -> list[str]:
    """Exactly once, minus this epoch's quarantined samples, each named."""
    problems = []
    skipped = [e["sample_id"] for e in entries]
    expected = sorted(set(range(n)) - set(skipped))
    if len(set(skipped)) != len(skipped) or any(e["epoch"] != epoch for e in entries):
        problems.append(f"epoch {epoch}: quarantine entries repeat a sample or name another epoch: {entries}")
    if sorted(ids.tolist()) != expected:
        counts = np.bincount(ids, minlength=n)
        problems.append(
            f"epoch {epoch}: not exactly once: missing {sorted(set(expected) - set(ids.tolist()))[:10]}, "
            f"repeated {np.flatnonzero(counts > 1)[:10].tolist()}"
        )
    for e in entries:
        if e["location"] != f"chaos sample {e['sample_id']} of {n}" or not e["message"] or not e["error_type"]:
            problems.append(f"epoch {epoch}: a quarantine entry that does not name its sample: {e}")
    return problems


def flatness(series: dict, rss_slack: int) -> dict:
    """Per resource: its value at FLAT_FROM, its range after, the band of the first epochs,
    and whether it stayed flat (counts within the band; RSS within ``rss_slack`` of FLAT_FROM's)."""
    out = {}
    for k, values in series.items():
        if len(values) <= FLAT_FROM:
            continue
        after = values[FLAT_FROM:]
        band = values[FLAT_FROM] + rss_slack if k == "rss" else max(values[: FLAT_FROM + 1])
        out[k] = {
            "at_10": values[FLAT_FROM],
            "min": min(after),
            "max": max(after),
            "band": band,
            "flat": max(after) <= band,
        }
    return out


# -- command line -------------------------------------------------------------------------------
def _line(r: SoakResult) -> str:
    f = r.flat
    mib = 1 << 20
    return (
        f"| {r.mode} | {r.epochs} | {r.samples:,} | {r.seconds:.0f} | {r.kills} | {r.armed} / {r.quarantined} | "
        f"{r.slowed} | {f['rss']['at_10'] / mib:.1f} -> {f['rss']['min'] / mib:.1f}..{f['rss']['max'] / mib:.1f} | "
        + " | ".join(f"{f[k]['at_10']} -> {f[k]['min']}..{f[k]['max']} (<= {f[k]['band']})" for k in COUNTS)
        + f" | {'yes' if r.ok else 'NO'} |"
    )


HEADER = (
    "| mode | epochs | samples | seconds | kills | made to raise / quarantined | slow reads | "
    "RSS MiB (epoch 10 -> after) | fds | threads | children | /dev/shm | ok |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--modes", default="thread,process")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--kill-every", type=int, default=120, help="batches between kills, about")
    parser.add_argument("--rss-slack-mib", type=float, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write every series here")
    args = parser.parse_args(argv)
    results = []
    for mode in args.modes.split(","):

        def tick(epoch, now, log, mode=mode):
            if epoch % 10 == 0 or epoch == args.epochs - 1:
                print(
                    f"  {mode} epoch {epoch}: rss {now['rss'] / 2**20:.1f} MiB, fds {now['fds']}, threads "
                    f"{now['threads']}, children {now['children']}, shm {now['shm']}; kills {log.kills}, "
                    f"made to raise {len(log.armed)}",
                    file=sys.stderr,
                    flush=True,
                )

        results.append(
            soak(
                mode,
                epochs=args.epochs,
                n=args.samples,
                batch_size=args.batch_size,
                kill_every=args.kill_every,
                rss_slack=int(args.rss_slack_mib * 2**20),
                seed=args.seed,
                progress=tick,
            )
        )
    print(
        f"`{' '.join(['.venv/bin/python', 'benchmarks/soak.py', *(argv if argv is not None else sys.argv[1:])])}`, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end\n"
    )
    print(HEADER)
    for r in results:
        print(_line(r))
        for p in r.problems[:20]:
            print(f"  problem: {p}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**asdict(r), "ok": r.ok} for r in results], f)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
