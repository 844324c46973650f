"""Loader specs: the one way every ``steadyfeed`` command turns what the user names into data.

A **spec** is ``path/to/file.py:NAME`` or ``package.module:NAME`` (``NAME`` may be dotted).
A callable ``NAME`` is called with no arguments; the result (or ``NAME`` itself) is what
the spec names. Commands that need a loader accept a :class:`~steadyfeed.Loader` or a
source (``len`` + ``getitem``); ``steadyfeed pack`` also accepts an iterable of samples.

Instead of a spec, the standard sources have shortcuts (``--npy-pairs IN LABELS``,
``--npy FILE``, ``--hdf5 FILE --key x=/images``, ``--images DIR``, ``--csv FILE --x COLS``,
``--tfrecord GLOB``, ``--parquet PATH``, ``--webdataset SHARDS``). Loader flags (``--batch-size``, ``--workers``, ``--shuffle``, ...)
build the Loader around a source, or override a returned Loader through ``replace``:
only the flags given on the command line change anything.

The commands share two more helpers here: :func:`at_setting` (a loader's copy at other
workers / mode, as commands run it) and :func:`raw_loader` (its source read as stored).

Guarantees:

* a spec file is imported as a top-level module with its directory first on ``sys.path``,
  so spawned process workers (which inherit ``sys.path``) unpickle what it defines;
* everything that stops a spec from becoming a loader (a malformed spec, a missing file,
  module or name, an exception in the user's code, a wrong return type, invalid loader
  options, data a source refuses at construction) raises :class:`SpecError` with a
  one-line message; :func:`usage_error` prints it and returns exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..config import AUTO, option_fields
from ..loader import Loader

DEFAULT_BATCH_SIZE = 32
USAGE_ERROR = 2  # argparse's exit code for bad usage; every command uses it for a bad spec too


def _flag_options(field, hint) -> dict:
    """argparse keywords for one Loader option, from its field: the type from its annotation,
    the help from its documentation. Every flag defaults to None: "not given, leave it"."""
    args = typing.get_args(hint)
    kinds = {a for a in args if a is not type(None)} or {hint}
    help_text = field.metadata["doc"] + (f" (default {DEFAULT_BATCH_SIZE})" if field.name == "batch_size" else "")
    if typing.get_origin(hint) is typing.Literal:
        return dict(choices=args, help=help_text)
    words = [w for k in kinds if typing.get_origin(k) is typing.Literal for w in typing.get_args(k)]
    if int in kinds and words:  # a count or a word: workers N|auto
        return dict(type=_int_or(words), metavar=field.metadata["metavar"], help=help_text)
    if kinds == {bool}:
        return dict(action=argparse.BooleanOptionalAction, help=help_text)
    kind = int if kinds == {int} else float if kinds == {float} else str
    return dict(type=kind, metavar=field.metadata["metavar"] or kind.__name__.upper(), help=help_text)


def _int_or(words: list[str]) -> Callable[[str], int | str]:
    def parse(text: str) -> int | str:
        if text in words:
            return text
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer or {' / '.join(words)}, got {text!r}") from None

    return parse


# each loader flag is the Loader option of the same name (config.py), built from its field
LOADER_FLAGS = {f.name: _flag_options(f, hint) for _, f, hint in option_fields() if f.metadata["cli"]}


class SpecError(ValueError):
    """A spec (or shortcut, or loader flag) that does not give usable data; the message is one line."""


# -- resolving a spec ------------------------------------------------------------------------
def resolve(spec: str, *, call: bool = True) -> Any:
    """The object ``spec`` names; called (with no arguments) when callable and ``call`` is true."""
    target, sep, name = spec.rpartition(":")
    if not (sep and target and name):
        raise SpecError(f"SPEC must be FILE.py:NAME or MODULE:NAME, got {spec!r}")
    module = _import_file(target) if target.endswith(".py") else _import_module(target)
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise SpecError(f"{target} has no {name!r}")
        obj = getattr(obj, part)
    if not (call and callable(obj)):
        return obj
    try:
        return obj()
    except Exception as exc:  # the user's code: say where, in one line
        raise SpecError(f"{spec} raised {_one_line(exc)}") from exc


def resolve_callable(spec: str) -> Callable:
    """The function ``spec`` names (not called), e.g. a ``--check`` function."""
    fn = resolve(spec, call=False)
    if not callable(fn):
        raise SpecError(f"{spec} is a {type(fn).__name__}, expected a function")
    return fn


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except Exception as exc:  # ImportError, or whatever the module raises while importing
        raise SpecError(f"cannot import module {name!r}: {_one_line(exc)}") from exc


def _import_file(path: str):
    """Import FILE.py as a top-level module, its directory on sys.path, so that spawned
    process workers (which inherit sys.path) can import it by name to unpickle its objects."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise SpecError(f"SPEC file not found: {path}")
    name = Path(path).stem
    loaded = sys.modules.get(name)
    if loaded is not None and os.path.abspath(getattr(loaded, "__file__", None) or "") != path:
        raise SpecError(
            f"cannot import {path} as module {name!r}: a module of that name is already loaded "
            f"from {getattr(loaded, '__file__', None)}; rename the file"
        )
    if os.path.dirname(path) not in sys.path:
        sys.path.insert(0, os.path.dirname(path))
    return _import_module(name)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# -- arguments -------------------------------------------------------------------------------
def add_spec_arguments(
    parser: argparse.ArgumentParser, *, metavar: str = "SPEC", help: str | None = None, exclude: tuple[str, ...] = ()
) -> None:
    """Add the positional spec (dest ``spec``, optional when a shortcut is used), the source
    shortcuts and the loader flags (less those named in ``exclude``, e.g. ``("workers", "mode")``)."""
    parser.add_argument(
        "spec",
        metavar=metavar,
        nargs="?",
        default=None,
        help=help
        or "FILE.py:NAME or MODULE:NAME: a function returning a steadyfeed.Loader "
        "or a source (or such an object itself)",
    )
    shortcuts = parser.add_argument_group("data shortcuts (instead of SPEC)")
    shortcuts.add_argument("--npy-pairs", nargs=2, metavar=("INPUTS", "LABELS"), help="NpyPairs(INPUTS, LABELS)")
    shortcuts.add_argument("--npy", metavar="FILE", help="NpyArray(x=FILE), more files with --key NAME=FILE")
    shortcuts.add_argument("--hdf5", metavar="FILE", help="Hdf5Source(FILE, ...) with --key NAME=/dataset")
    shortcuts.add_argument("--images", metavar="DIR", help="ImageFolder(DIR): DIR/<class>/<image files>")
    shortcuts.add_argument("--csv", metavar="FILE", help="CsvSource(FILE, x=--x, y=--y)")
    shortcuts.add_argument(
        "--tfrecord",
        metavar="GLOB",
        help="TFRecordSource(GLOB): a pack output directory, or "
        "TFRecord files (GZIP/ZLIB detected), their features "
        "inferred or named with --feature",
    )
    shortcuts.add_argument(
        "--feature",
        action="append",
        default=[],
        metavar="KEY=DTYPE[:SHAPE]",
        help="--tfrecord: a feature to read, e.g. x=float32:28,28, y=int64, name=bytes, text=str, "
        "tokens=int64:? ('?': a dimension of any length; repeatable; default: inferred from "
        "the first records)",
    )
    shortcuts.add_argument(
        "--parquet",
        metavar="PATH",
        help="ParquetSource(PATH): a file, glob or directory; every column, or --x COLS (and --y COL)",
    )
    shortcuts.add_argument(
        "--webdataset",
        metavar="SHARDS",
        help="WebDatasetSource(SHARDS): tar shards (a glob or shard-{000..009}.tar); every member",
    )
    shortcuts.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="NAME=WHERE",
        help="a named array: a dataset path for --hdf5, a file for --npy (repeatable)",
    )
    shortcuts.add_argument(
        "--x", metavar="COLS", help="--csv, --parquet: comma-separated input columns (--csv: names or 0-based)"
    )
    shortcuts.add_argument("--y", metavar="COL", help="--csv, --parquet: the label column")
    shortcuts.add_argument(
        "--dtype",
        action="append",
        default=[],
        metavar="KEY=DTYPE",
        help="--csv: a key's dtype, e.g. y=int64 (default float32), y=class for text labels",
    )
    shortcuts.add_argument(
        "--delimiter", default=",", metavar="CHAR", help="--csv: the field delimiter (default ','; '\\t' for a tab)"
    )
    shortcuts.add_argument("--image-size", nargs=2, type=int, metavar=("H", "W"), help="--images: resize to H x W")
    shortcuts.add_argument("--channels", type=int, choices=(1, 3, 4), default=3, help="--images: channels (default 3)")

    flags = parser.add_argument_group("loader options (override a returned Loader's)")
    added = tuple(name for name in LOADER_FLAGS if name not in exclude)
    for name in added:
        flags.add_argument(_flag(name), dest=name, default=None, **LOADER_FLAGS[name])
    if "last_batch" in added:  # the deprecated spelling still works, with a note on stderr
        flags.add_argument(
            "--drop-last", dest="drop_last", default=None, action=argparse.BooleanOptionalAction, help=argparse.SUPPRESS
        )
        added += ("drop_last",)
    parser.set_defaults(loader_flags=added)  # loader_options reads these only: a command may reuse a name


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


# -- building ----------------------------------------------------------------------------------
def loader_from_args(args: argparse.Namespace) -> Loader:
    """The Loader the parsed arguments describe: SPEC or one shortcut, then the loader flags."""
    return as_loader(data_from_args(args), loader_options(args), what=describe(args))


def data_from_args(args: argparse.Namespace) -> Any:
    """What SPEC or the one shortcut given names, as it is: a Loader, a source, or (from a
    SPEC) any other object, such as the iterable ``pack`` takes."""
    given = [name for name in _SHORTCUTS if getattr(args, name, None) is not None]
    if bool(args.spec) + len(given) != 1:
        got = [args.spec] * bool(args.spec) + [_flag(name) for name in given]
        raise SpecError(
            f"give exactly one of SPEC, {', '.join(map(_flag, _SHORTCUTS))}"
            + (f" (got {', '.join(got)})" if got else "")
        )
    if args.spec:
        return resolve(args.spec)
    name = given[0]
    try:
        return _SHORTCUTS[name](getattr(args, name), args)
    except SpecError:
        raise
    except Exception as exc:  # missing files, refused data, a missing optional package
        raise SpecError(f"{_flag(name)}: {_one_line(exc)}") from exc


def describe(args: argparse.Namespace) -> str:
    """The data the arguments name, as typed: the spec, or the shortcut and its value."""
    if args.spec:
        return args.spec
    for name in _SHORTCUTS:
        value = getattr(args, name, None)
        if value is not None:
            return " ".join([_flag(name), *([value] if isinstance(value, str) else value)])
    return ""


def loader_from_spec(spec: str, args: argparse.Namespace | None = None) -> Loader:
    """The Loader ``spec`` names, with the loader flags in ``args`` applied."""
    return as_loader(resolve(spec), loader_options(args), what=spec)


def loader_options(args: argparse.Namespace | None) -> dict:
    """The Loader keywords given on the command line (flags left at None are not given)."""
    if args is None:
        return {}
    names = getattr(args, "loader_flags", tuple(LOADER_FLAGS))
    options = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    if "drop_last" in options:
        print("steadyfeed: --drop-last is deprecated: use --last-batch drop", file=sys.stderr)
        drop = options.pop("drop_last")
        if drop and options.get("last_batch", "drop") != "drop":
            raise SpecError(f"--drop-last contradicts --last-batch {options['last_batch']}")
        options.setdefault("last_batch", "drop" if drop else "partial")
    return options


def as_loader(obj: Any, options: dict, what: str) -> Loader:
    """``obj`` (a Loader or a source) as a Loader with ``options`` applied; workers left
    unset (not given here nor to the Loader) are ``"auto"``, as under ``as_keras()``."""
    if not isinstance(obj, Loader) and not (hasattr(obj, "__len__") and hasattr(obj, "__getitem__")):
        hint = "; to turn an iterable into a source, use steadyfeed pack" if hasattr(obj, "__iter__") else ""
        raise SpecError(
            f"{what} gave a {type(obj).__name__}, expected a steadyfeed.Loader or a source (len + getitem){hint}"
        )
    try:
        if isinstance(obj, Loader):
            unset = obj.config.execution.workers is None and "workers" not in options
            options = {**options, "workers": AUTO} if unset else options
            return obj.replace(**options) if options else obj
        return Loader(obj, options.pop("batch_size", DEFAULT_BATCH_SIZE), **{"workers": AUTO, **options})
    except (TypeError, ValueError) as exc:
        raise SpecError(f"invalid loader options for {what}: {_one_line(exc)}") from exc


def usage_error(command: str, exc: BaseException | str) -> int:
    """Print ``steadyfeed COMMAND: error: ...`` on stderr; the exit code for it."""
    print(f"steadyfeed {command}: error: {exc}", file=sys.stderr)
    return USAGE_ERROR


# -- the shortcuts -------------------------------------------------------------------------------
def _named(pairs: list[str], flag: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not (sep and name and value):
            raise SpecError(f"{flag} takes NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


def _npy(path: str, args) -> Any:
    from ..sources.npy import NpyArray

    return NpyArray(x=path, **_named(args.key, "--key"))


def _npy_pairs(dirs: list[str], args) -> Any:
    from ..sources.npy import NpyPairs

    return NpyPairs(*dirs)


def _hdf5(path: str, args) -> Any:
    from ..sources.hdf5 import Hdf5Source

    keys = _named(args.key, "--key")
    if not keys:
        raise SpecError("--hdf5 needs the datasets to read, e.g. --key x=/images --key y=/labels")
    if "swmr" in keys:  # it would have turned SWMR mode on instead of naming a dataset
        raise SpecError("--key swmr=... names an Hdf5Source option, not a key; use another key name")
    return Hdf5Source(path, swmr=False, **keys)


def _images(root: str, args) -> Any:
    from .. import sources

    return sources.ImageFolder(root, size=args.image_size, channels=args.channels)


def _csv(path: str, args) -> Any:
    from ..sources.csv_rows import CsvSource

    if not args.x:
        raise SpecError("--csv needs the input columns, e.g. --x a,b,c (and --y label)")
    columns = [int(c) if c.isdigit() else c for c in args.x.split(",")]
    keys: dict[str, Any] = {"x": columns} | ({"y": int(args.y) if args.y.isdigit() else args.y} if args.y else {})
    delimiter = "\t" if args.delimiter in ("\\t", "tab") else args.delimiter
    return CsvSource(path, dtypes=_named(args.dtype, "--dtype"), delimiter=delimiter, **keys)


def _features(pairs: list[str]) -> dict[str, Any] | None:
    """``--feature KEY=DTYPE[:D,D,...]`` as TFRecordSource's ``features`` (None when none given)."""
    features = {}
    for key, value in _named(pairs, "--feature").items():
        dtype, sep, dims = value.partition(":")
        try:
            shape = tuple(None if d.strip() == "?" else int(d) for d in dims.split(",") if d.strip()) if sep else ()
        except ValueError:
            raise SpecError(
                f"--feature {key}={value}: a shape is comma-separated sizes or '?', e.g. "
                f"{key}={dtype}:28,28 or {key}={dtype}:?"
            ) from None
        features[key] = dtype if dtype in ("bytes", "str") else (dtype, shape)
    return features or None


def _tfrecord(paths: str, args) -> Any:
    from .. import sources

    return sources.TFRecordSource(paths, features=_features(args.feature))  # None: the manifest's, or inferred


def _parquet(paths: str, args) -> Any:
    from .. import sources

    keys = {}
    if args.x:
        keys["x"] = [c for c in args.x.split(",")]
    if args.y:
        keys["y"] = args.y
    return sources.ParquetSource(paths, **keys)


def _webdataset(shards: str, args) -> Any:
    from .. import sources

    return sources.WebDatasetSource(shards)


_SHORTCUTS: dict[str, Callable[[Any, argparse.Namespace], Any]] = {
    "npy_pairs": _npy_pairs,
    "npy": _npy,
    "hdf5": _hdf5,
    "images": _images,
    "csv": _csv,
    "tfrecord": _tfrecord,
    "parquet": _parquet,
    "webdataset": _webdataset,
}


# -- reading a loader's data as it is ------------------------------------------------------------
def raw_loader(
    loader: Loader,
    *,
    batch_size: int | None = None,
    workers: int | str | None = None,
    mode: str | None = None,
    transform=None,
) -> Loader:
    """A loader over ``loader``'s source as stored: every id once (excluded ones too), in id
    order, from the source itself (never a ``pack_to`` pack), no transform, one shard, ids in each batch, failing samples skipped (see its ``quarantine_report()``)
    however many fail, and nothing written to the original's quarantine file. ``transform``
    (default none) runs in its workers: what a command measures there (image scores)."""
    execution = loader.config.execution
    return at_setting(
        loader,
        execution.workers if workers is None else workers,
        mode or execution.mode,
        batch_size=batch_size or loader.config.read.batch_size,
        transform=transform,
        shuffle=False,
        sampler=None,
        last_batch="partial",
        shard_index=0,
        shard_count=1,
        on_error="skip",
        max_error_fraction=1.0,
        exclude=None,
        pack_to=None,
        pack_decoded=0.0,
    )


def at_setting(loader: Loader, workers: int | str | None, mode: str, **changes) -> Loader:
    """``loader.replace`` with ``workers`` and ``mode``, ids in every batch and no quarantine
    file (a command never writes to the user's). A ``timeout`` is kept where it can apply:
    with ``workers=0`` nothing can interrupt a sample, so it is dropped there."""
    timeout = loader.config.failure.timeout if workers else None
    return loader.replace(workers=workers, mode=mode, timeout=timeout, with_ids=True, quarantine=None, **changes)


def real_rows(batch: dict) -> np.ndarray:
    """A bool per row of a batch made ``with_ids``: False on the masked rows ``last_batch="pad"`` adds."""
    return batch["mask"] > 0 if "mask" in batch else np.ones(len(batch["id"]), bool)


def batch_rows(batch: dict) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """``(sample id, {key: row})`` for each real row of a batch made ``with_ids`` (padded rows left out)."""
    keys = [k for k in batch if k not in ("id", "mask")]
    for row in np.flatnonzero(real_rows(batch)):
        yield int(batch["id"][row]), {k: batch[k][row] for k in keys}
