"""``Loader(..., pack_to=DIR)`` (issue 17, item 5): what automatic packing costs in the first
epoch and what it gains in later ones, on data generated under a temporary directory (removed
after):

  npy    20,000 ``.npy`` pairs (32 x 32 x 3 float32 inputs, 12 KB a file; ``NpyPairs``)
  jpeg   5,000 JPEGs 128 x 128 (quality 90, about 8 KB) in two class folders (``ImageFolder``),
         packed as the files' bytes (the default), then with a share of the images held
         decoded too (``pack_decoded``: half, and all, unless ``--decoded`` says otherwise)

For each dataset, in one run and in turns (``--repeat`` rounds; the median is shown):

* **first epoch**: a shuffled epoch from a cold page cache (every file of the data and of the
  pack directory is fsynced and dropped with ``posix_fadvise(POSIX_FADV_DONTNEED)`` first),
  by a loader without ``pack_to`` and by one with it (whose pack is built in the background
  meanwhile; the pack directory is emptied before each such run). Target: within 15%. The time
  until the pack was published is shown too.
* **later epochs**: a shuffled epoch from a cold page cache, read from the small files (no
  ``pack_to``) and from the pack (a loader whose pack exists). Target: the pack >= 2x faster.
  Beside it, the limit proxies: every byte of the pack read from a cold cache, with no loader,
  and for images (packed as their files' bytes, so reading them back decodes them) every
  image the pack does not hold decoded, decoded from memory in as many threads as the loader
  has; the speed-up an epoch from the pack would have if it cost only the larger of the two.

Every epoch is checked to deliver every id once. Loader: batch 32, 2 worker threads, no
transform. Not a timed test: the machine is shared, so both sides of each ratio are measured
in the same run, alternating, and the load average is printed with the results.

    .venv/bin/python benchmarks/bench_pack_to.py [--repeat 3] [--only npy|jpeg] [--decoded 0.5,1] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
from _common import photo_like

import steadyfeed as sf

SEED, BATCH, WORKERS = 0, 32, 2
NPY_COUNT, NPY_SHAPE = 20_000, (32, 32, 3)
JPEG_COUNT, JPEG_SIDE = 5_000, 128
FIRST_EPOCH_TARGET, LATER_TARGET = 1.15, 2.0


# -- data ---------------------------------------------------------------------------------------
def generate_npy(root: str, n: int) -> sf.NpyPairs:
    rng = np.random.default_rng(SEED)
    for d in ("inputs", "labels"):
        os.makedirs(os.path.join(root, d))
    for i in range(n):
        np.save(os.path.join(root, "inputs", f"{i:06d}.npy"), rng.random(NPY_SHAPE, dtype=np.float32))
        np.save(os.path.join(root, "labels", f"{i:06d}.npy"), np.int64(i % 10))
    return sf.NpyPairs(os.path.join(root, "inputs"), os.path.join(root, "labels"))


def generate_jpeg(root: str, n: int) -> sf.ImageFolder:
    """Photo-like content: a smooth random colour field plus noise (about 8 KB at quality 90)."""
    from PIL import Image

    rng = np.random.default_rng(SEED)
    for c in range(2):
        os.makedirs(os.path.join(root, f"class_{c}"))
    for i in range(n):
        Image.fromarray(photo_like(rng, JPEG_SIDE)).save(
            os.path.join(root, f"class_{i % 2}", f"{i:05d}.jpg"), quality=90
        )
    return sf.ImageFolder(root)


# -- a cold page cache --------------------------------------------------------------------------
def drop_cache(*roots: str) -> int:
    """Flush, then drop from the page cache, every file under ``roots``; the bytes dropped."""
    os.sync()  # DONTNEED drops clean pages only
    total = 0
    for root in roots:
        for directory, _, names in os.walk(root):
            for name in names:
                path = os.path.join(directory, name)
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    total += os.fstat(fd).st_size
                finally:
                    os.close(fd)
    return total


def cold_read(root: str) -> float:
    """Seconds to read every byte under ``root`` from a cold cache, file by file in 1 MiB reads:
    the disk's limit for an epoch from the pack (which reads all of it)."""
    drop_cache(root)
    start = time.perf_counter()
    for directory, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(directory, name), "rb", buffering=0) as f:
                while f.read(1 << 20):
                    pass
    return time.perf_counter() - start


def decode_limit(source, decoded: float) -> float:
    """Seconds for WORKERS threads to decode, from bytes already in memory and with no loader,
    every image of ``source`` (an ImageFolder) that a pack holding ``decoded`` of them decoded
    must decode: the CPU's limit for an epoch from that pack (libjpeg-turbo releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    from steadyfeed.sources.decoded_pixels import stores_decoded

    paths = [path for i, path in enumerate(source.files) if not stores_decoded(i, decoded)]
    encoded = [open(path, "rb").read() for path in paths]
    start = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        decoded_count = sum(
            len(part) for part in pool.map(lambda k: [source.decode(d) for d in encoded[k::WORKERS]], range(WORKERS))
        )
    assert decoded_count == len(paths)
    return time.perf_counter() - start


def du(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root) for n in names)


# -- one timed epoch ----------------------------------------------------------------------------
def timed_epoch(loader: sf.Loader, epoch: int, n: int) -> float:
    start = time.perf_counter()
    ids = np.concatenate([batch["id"] for batch in loader.epoch(epoch)])
    seconds = time.perf_counter() - start
    if len(ids) != n or not np.array_equal(np.sort(ids), np.arange(n)):
        raise SystemExit(f"COVERAGE FAILED: {len(ids)} ids delivered for {n} samples")
    return seconds


def make(source, pack_to=None, decoded: float = 0.0) -> sf.Loader:
    return sf.Loader(
        source,
        BATCH,
        shuffle=True,
        seed=SEED,
        with_ids=True,
        workers=WORKERS,
        pack_to=pack_to,
        pack_decoded=decoded if pack_to else 0.0,
    )


def first_epoch(source, data: str, packs: str, with_pack: bool, decoded: float) -> tuple[float, float | None]:
    """Epoch 0 from a cold cache; with ``pack_to``: also the seconds until the pack was ready."""
    shutil.rmtree(packs, ignore_errors=True)
    drop_cache(data)
    with make(source, packs if with_pack else None, decoded) as loader:
        start = time.perf_counter()
        seconds = timed_epoch(loader, 0, len(source))
        if not with_pack:
            return seconds, None
        if not loader.wait_for_pack(3600):
            raise SystemExit(f"the pack was not built: {loader.stats()['pack']}")
        return seconds, time.perf_counter() - start


def later_epoch(source, data: str, packs: str, with_pack: bool, decoded: float) -> float:
    """A later epoch (1) from a cold cache: from the files, or from the pack built before."""
    drop_cache(data, packs)
    with make(source, packs if with_pack else None, decoded) as loader:
        seconds = timed_epoch(loader, 1, len(source))
        assert loader.reading == ("pack" if with_pack else "files"), loader.reading
        return seconds


def bench(name: str, source, data: str, packs: str, repeat: int, decoded: float = 0.0) -> dict:
    decodes = isinstance(source, sf.ImageFolder)  # packed as its files' bytes: reading it back decodes them
    firsts: dict[str, list[float]] = {"files": [], "pack_to": []}
    later: dict[str, list[float]] = {"files": [], "pack": [], "pack read": [], **({"decode": []} if decodes else {})}
    ready: list[float] = []
    for _ in range(repeat):  # in turns, so both sides of each ratio see the same load
        firsts["files"].append(first_epoch(source, data, packs, False, decoded)[0])
        seconds, until_ready = first_epoch(source, data, packs, True, decoded)
        assert until_ready is not None  # with a pack
        firsts["pack_to"].append(seconds)
        ready.append(until_ready)
    for _ in range(repeat):  # the last first-epoch run left a pack behind
        later["files"].append(later_epoch(source, data, packs, False, decoded))
        later["pack"].append(later_epoch(source, data, packs, True, decoded))
        later["pack read"].append(cold_read(packs))
        if decodes:
            later["decode"].append(decode_limit(source, decoded))
    med = {
        k: statistics.median(v)
        for k, v in {
            **{f"first {k}": v for k, v in firsts.items()},
            **{f"later {k}": v for k, v in later.items()},
        }.items()
    }
    return {
        "name": name,
        "samples": len(source),
        "data_bytes": du(data),
        "pack_bytes": du(packs),
        "median": med,
        "runs": {**firsts, **{f"later {k}": v for k, v in later.items()}},
        "ready": statistics.median(ready),
        "first_ratio": med["first pack_to"] / med["first files"],
        "later_ratio": med["later files"] / med["later pack"],
        # the speed-up if the pack cost only its reading, or (images) its decoding, whichever is more
        "limit": max(med["later pack read"], med.get("later decode", 0.0)),
    }


# -- report -------------------------------------------------------------------------------------
def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def report(results: list[dict], loads: tuple, markdown: bool, repeat: int) -> str:
    lines = [
        f"{'**Run**: ' if markdown else ''}{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} cores, steadyfeed {sf.__version__}, numpy {np.__version__}; batch {BATCH}, "
        f"{WORKERS} worker threads, shuffled; median of {repeat} run(s) in turns; load average "
        f"{loads[0][0]:.1f} / {loads[0][1]:.1f} / {loads[0][2]:.1f} before, "
        f"{loads[1][0]:.1f} / {loads[1][1]:.1f} / {loads[1][2]:.1f} after",
        "",
    ]
    head = (
        "| data | first epoch, files | first epoch, pack_to | ratio (target <= 1.15) | pack ready after | "
        "later epoch, files | later epoch, pack | speed-up (target >= 2) | pack read cold (disk limit) | "
        f"decode in {WORKERS} threads (CPU limit) | speed-up at the limit | files / pack on disk |"
    )
    lines += [head, "|---" * (head.count("|") - 1) + "|"]
    for r in results:
        m = r["median"]
        lines.append(
            f"| {r['name']} ({r['samples']:,}) | {m['first files']:.2f} s | {m['first pack_to']:.2f} s | "
            f"{r['first_ratio']:.2f}x {'ok' if r['first_ratio'] <= FIRST_EPOCH_TARGET else 'MISSED'} | "
            f"{r['ready']:.2f} s | {m['later files']:.2f} s | {m['later pack']:.2f} s | "
            f"{r['later_ratio']:.2f}x {'ok' if r['later_ratio'] >= LATER_TARGET else 'MISSED'} | "
            f"{m['later pack read']:.2f} s | {seconds(m.get('later decode'))} | "
            f"{m['later files'] / r['limit']:.2f}x | "
            f"{r['data_bytes'] / 2**20:.0f} / {r['pack_bytes'] / 2**20:.0f} MB |"
        )
    lines += [
        "",
        "runs (seconds): "
        + "; ".join(
            f"{r['name']}: " + ", ".join(f"{k} {' '.join(f'{s:.2f}' for s in v)}" for k, v in r["runs"].items())
            for r in results
        ),
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds, taken in turns (default 3)")
    parser.add_argument("--only", choices=("npy", "jpeg"), help="one dataset")
    parser.add_argument(
        "--decoded",
        default="0.5,1",
        help="the JPEGs' other packs: their pack_decoded shares, comma-separated (default 0.5,1; '' for none)",
    )
    parser.add_argument("--markdown", action="store_true", help="a table for docs/benchmarks.md")
    parser.add_argument("--tmp", default=None, help="where the data is generated (default: the temp directory)")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="sf-bench-pack_to-", dir=args.tmp)
    loads = [os.getloadavg()]
    results = []
    try:
        for name, generate, count in (("npy", generate_npy, NPY_COUNT), ("jpeg", generate_jpeg, JPEG_COUNT)):
            if args.only not in (None, name):
                continue
            data, packs = os.path.join(root, name), os.path.join(root, f"{name}-packs")
            print(f"generating {count:,} {name} samples under {data} ...", file=sys.stderr, flush=True)
            source = generate(data, count)
            results.append(bench(name, source, data, packs, args.repeat))
            for share in [float(v) for v in args.decoded.split(",") if v] if name == "jpeg" else []:
                shutil.rmtree(packs, ignore_errors=True)
                results.append(bench(f"jpeg, {share:g} decoded", source, data, packs, args.repeat, share))
            shutil.rmtree(data, ignore_errors=True)
            shutil.rmtree(packs, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    loads.append(os.getloadavg())
    print(report(results, tuple(loads), args.markdown, args.repeat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
