"""Messy data on disk, written by the real writers (Pillow, h5py, numpy, the csv module, gzip),
as a new user's folders are: what ``test_collate.py``, ``test_cli_inspect.py`` and
``test_packing.py`` run the loader and the tools on."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np

SIZE = (24, 32)  # the common image size
ODD_SIZE = (50, 70)  # the one image that differs
ODD_IMAGE = "cats/c3.png"  # ... and where it is


def pixels(i: int, size=SIZE) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, (*size, 3), dtype=np.uint8)


def image_tree(
    root: Path,
    *,
    per_class: int = 6,
    odd: bool = True,
    empty_class: bool = False,
    notes: bool = False,
    empty_file: bool = False,
) -> Path:
    """``root/cats``, ``root/dogs``: ``per_class`` 24x32 RGB PNGs each (written by Pillow), one
    50x70 among them (``odd``), plus on request an empty class folder ``birds/``, a stray
    ``cats/notes.txt`` and a zero-byte ``dogs/empty.png``."""
    from PIL import Image

    for c, name in enumerate(("cats", "dogs")):
        (root / name).mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            rel = f"{name}/{name[0]}{k}.png"
            Image.fromarray(pixels(c * 100 + k, ODD_SIZE if odd and rel == ODD_IMAGE else SIZE)).save(root / rel)
    if empty_class:
        (root / "birds").mkdir()
    if notes:
        (root / "cats" / "notes.txt").write_text("shot on 2024-05-01, see the wiki\n")
    if empty_file:
        (root / "dogs" / "empty.png").write_bytes(b"")
    return root


NAMES = [f"item-{i * 37 % 1000}" for i in range(50)]  # lengths 6 to 8: variable-length strings


def vlen_hdf5(path: Path) -> Path:
    """``/names``: variable-length ASCII strings (h5py's string_dtype) of 6-8 bytes; ``/y``: labels."""
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("names", data=[n.encode() for n in NAMES], dtype=h5py.string_dtype("ascii"))
        f["y"] = np.arange(len(NAMES), dtype=np.int64)
    return path


BIG_ENDIAN = 5  # the one .npy written big-endian


def npy_pairs(root: Path, n: int = 12) -> tuple[Path, Path]:
    """``inputs/NNNN.npy`` float32 (3, 4) arrays and ``labels/NNNN.npy`` int64, saved by numpy;
    input ``BIG_ENDIAN`` is saved as ``>f4`` (same values)."""
    inputs, labels = root / "inputs", root / "labels"
    inputs.mkdir(parents=True)
    labels.mkdir()
    for i in range(n):
        x = np.arange(12, dtype=np.float32).reshape(3, 4) + i
        np.save(inputs / f"{i:04d}.npy", x.astype(">f4") if i == BIG_ENDIAN else x)
        np.save(labels / f"{i:04d}.npy", np.int64(i % 3))
    return inputs, labels


def csv_file(path: Path) -> Path:
    """A CSV (the csv module) with a float, an int and a text column; two missing values (line 4:
    ``a`` empty; line 6: ``b`` empty) and one short row (line 7)."""
    rows = [
        ["a", "b", "name"],
        ["0.5", "1", "x"],
        ["1.5", "2", "y"],
        ["", "3", "z"],
        ["3.5", "4", "w"],
        ["4.5", "", "v"],
        ["5.5", "6"],
        ["6.5", "7", "u"],
    ]
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return path


def gzip_tfrecord(path: Path, records: list[bytes]) -> Path:
    """A TFRecord file as ``TFRecordOptions(compression_type="GZIP")`` writes it: the framed
    records, gzip-compressed."""
    from steadyfeed.sources.tfrecord import frame

    with gzip.open(path, "wb") as f:
        for data in records:
            header, footer = frame(data)
            f.write(header + data + footer)
    return path
