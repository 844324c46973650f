"""Web scale on one machine (issue 16): what a shuffled epoch's bookkeeping costs at 10^3..10^9
samples, and what listing a tree of a million files costs.

1. **Shuffled epochs.** For each N, each loader runs in a fresh process under a memory limit
   (``RLIMIT_AS``, ``--limit-gb``) over a trivial source (sample i is the int64 i): the time
   from building the loader to its first batch of 64, the mean time of the next 200 batches,
   and the peak RSS above the process's RSS after its imports. steadyfeed
   ``Loader(shuffle=True)`` (no workers) against torch ``DataLoader(RandomSampler)`` and Grain
   ``DataLoader(IndexSampler(shuffle=True))`` (no workers, ``Batch(64)``). A run that fails
   under the limit (or takes longer than ``--timeout``) is shown as such.
2. **A million files.** A generated tree ``root/<1000 classes>/<1000 empty .JPEG>`` under
   ``--tmp`` (inodes checked first, removed after): ``sorted(glob.glob(...))`` and
   ``ImageFolder(root)`` listing it cold (no cache) and warm (from its listing cache), each
   in a fresh process: seconds, peak RSS above imports, bytes kept per file, and the size
   of the source pickled for a process worker.

Run from the repository root (``bench`` extra: torch, grain)::

    .venv/bin/python benchmarks/bench_scale.py --markdown
    .venv/bin/python benchmarks/bench_scale.py --sizes 1000,1000000 --files 10000   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

BATCH = 64
NEXT_BATCHES = 200


# -- child side ---------------------------------------------------------------------------------
def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Trivial:
    """Sample i is {"x": i}; ``read_batch`` (steadyfeed's fast path) stacks ids as they are."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        import numpy as np

        return {"x": np.int64(i)}

    def read_batch(self, ids):
        import numpy as np

        return {"x": np.asarray(ids, dtype=np.int64).copy()}


def _epoch_steadyfeed(n: int):
    import steadyfeed as sf

    base = _rss_mb()
    t0 = time.perf_counter()
    loader = sf.Loader(Trivial(n), BATCH, shuffle=True, seed=0)
    it = iter(loader)
    first = next(it)["x"]
    return base, t0, first, it


def _epoch_torch(n: int):
    import torch
    from torch.utils.data import DataLoader, Dataset, RandomSampler

    class TorchTrivial(Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return i

    torch.manual_seed(0)
    base = _rss_mb()
    t0 = time.perf_counter()
    ds = TorchTrivial()
    it = iter(DataLoader(ds, batch_size=BATCH, sampler=RandomSampler(ds), num_workers=0))
    first = next(it)
    return base, t0, first, it


def _epoch_grain(n: int):
    import grain.python as grain

    base = _rss_mb()
    t0 = time.perf_counter()
    sampler = grain.IndexSampler(num_records=n, shard_options=grain.NoSharding(), shuffle=True, num_epochs=1, seed=0)
    loader = grain.DataLoader(data_source=Trivial(n), sampler=sampler, operations=[grain.Batch(BATCH)], worker_count=0)
    it = iter(loader)
    first = next(it)
    return base, t0, first, it


EPOCHS = {"steadyfeed": _epoch_steadyfeed, "torch": _epoch_torch, "grain": _epoch_grain}


def child_epoch(library: str, n: int) -> dict:
    if library == "steadyfeed":
        import steadyfeed  # noqa: F401  (imports before the baseline, as for the peers)
    elif library == "torch":
        import torch  # noqa: F401
    else:
        import grain.python  # noqa: F401
    import numpy  # noqa: F401

    base, t0, first, it = EPOCHS[library](n)
    first_s = time.perf_counter() - t0
    t1, taken = time.perf_counter(), 0
    for _ in range(NEXT_BATCHES):  # fewer when the epoch is shorter (N = 10^3: 15 more)
        try:
            next(it)
        except StopIteration:
            break
        taken += 1
    per_batch = (time.perf_counter() - t1) / max(taken, 1)
    rows = len(first["x"]) if isinstance(first, dict) else len(first)
    return {
        "first_batch_s": first_s,
        "per_batch_us": per_batch * 1e6,
        "batches_timed": taken,
        "rss_base_mb": base,
        "rss_added_mb": max(0.0, _peak_mb() - base),
        "batch": rows,
    }


def child_listing(kind: str, root: str) -> dict:
    import glob
    import pickle

    if kind.startswith("steadyfeed"):
        from steadyfeed.sources.images import ImageFolder
    base = _rss_mb()
    t0 = time.perf_counter()
    if kind == "glob":
        files = sorted(glob.glob(os.path.join(root, "*", "*.JPEG")))
        count, shipped, kept = len(files), len(pickle.dumps(files)), None
    else:
        source = ImageFolder(root, progress=False)
        count, shipped = len(source), len(pickle.dumps(source))
        kept = source._listing.nbytes() / count
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "files": count,
        "rss_added_mb": max(0.0, _peak_mb() - base),
        "pickled_bytes": shipped,
        "kept_bytes_per_file": kept,
    }


def _child_main(argv: list[str]) -> None:
    limit = int(float(argv[1]) * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = child_epoch(argv[2], int(argv[3])) if argv[0] == "epoch" else child_listing(argv[2], argv[3])
    print("RESULT " + json.dumps(out), flush=True)


# -- parent side --------------------------------------------------------------------------------
def run_child(args: list[str], limit_gb: float, timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", args[0], str(limit_gb), *args[1:]]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no first batch within {timeout:.0f} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return {"error": tail[-160:]}


def make_tree(root: str, classes: int, per_class: int) -> float:
    t0 = time.perf_counter()
    for c in range(classes):
        folder = os.path.join(root, f"n{c:08d}")
        os.makedirs(folder)
        for k in range(per_class):
            os.close(os.open(os.path.join(folder, f"n{c:08d}_{k}.JPEG"), os.O_CREAT | os.O_WRONLY, 0o644))
    return time.perf_counter() - t0


def free_inodes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_favail


def load_line() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def fmt(value, spec: str, unit: str = "") -> str:
    return "-" if value is None else format(value, spec) + unit


def epoch_table(rows: list[tuple[int, str, dict]]) -> list[str]:
    lines = [
        "| N | loader | first batch | next batches (mean) | peak RSS | RSS added (above imports) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for n, library, r in rows:
        if "error" in r:
            lines.append(f"| {n:.0e} | {library} | failed: {r['error']} | | | |")
        else:
            lines.append(
                f"| {n:.0e} | {library} | {r['first_batch_s']:.3f} s | {r['per_batch_us']:,.0f} us | "
                f"{r['rss_base_mb'] + r['rss_added_mb']:,.0f} MB | {r['rss_added_mb']:,.1f} MB |"
            )
    return lines


def listing_table(rows: list[tuple[str, dict]]) -> list[str]:
    lines = ["| listing | seconds | RSS added | kept per file | pickled for a worker |", "|---|---:|---:|---:|---:|"]
    for kind, r in rows:
        if "error" in r:
            lines.append(f"| {kind} | failed: {r['error']} | | | |")
            continue
        kept = fmt(r["kept_bytes_per_file"], ".0f", " B")
        lines.append(
            f"| {kind} | {r['seconds']:.2f} | {r['rss_added_mb']:,.0f} MB | {kept} | {r['pickled_bytes']:,} B |"
        )
    return lines


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,1000000,100000000,1000000000")
    parser.add_argument("--libraries", default="steadyfeed,grain,torch")
    parser.add_argument("--limit-gb", type=float, default=6.0, help="RLIMIT_AS of each child process")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a child may run")
    parser.add_argument("--files", type=int, default=1_000_000, help="files in the generated tree (0: skip)")
    parser.add_argument("--tmp", default="/tmp")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()

    print(f"# bench_scale: {load_line()}; python {sys.version.split()[0]}; limit {args.limit_gb:g} GB per process")
    rows = []
    for n in (int(s) for s in args.sizes.split(",") if s):
        for library in args.libraries.split(","):
            result = run_child(["epoch", library, str(n)], args.limit_gb, args.timeout)
            rows.append((n, library, result))
            print(f"  N={n:.0e} {library}: {json.dumps(result)}", flush=True)
    if rows:
        print("\n".join(epoch_table(rows)))

    if args.files:
        classes = 1000 if args.files >= 100_000 else 10
        per_class = args.files // classes
        needed = classes * (per_class + 1) + 1000
        if free_inodes(args.tmp) < 2 * needed:
            print(f"# skipped the file tree: {args.tmp} has {free_inodes(args.tmp):,} free inodes, needs {needed:,}")
            return
        root = os.path.join(args.tmp, f"sf-bench-tree-{os.getpid()}")
        try:
            made = make_tree(root, classes, per_class)
            print(f"# made {classes * per_class:,} empty files in {classes} folders in {made:.0f} s; {load_line()}")
            listing_rows = [
                (kind, run_child(["listing", kind, root], args.limit_gb, args.timeout * 4))
                for kind in ("glob", "steadyfeed cold", "steadyfeed warm")
            ]
            print("\n".join(listing_table(listing_rows)))
        finally:
            shutil.rmtree(root, ignore_errors=True)
            for suffix in (".images-listing.sfidx.npy",):
                if os.path.exists(root + suffix):
                    os.remove(root + suffix)
    print(f"# done; {load_line()}")


if __name__ == "__main__":
    main()
