"""The typed public API: mypy is clean on the package, everything exported from ``steadyfeed``,
``steadyfeed.keras`` and ``steadyfeed.ray`` is fully annotated, and their ``__all__`` is sorted,
free of duplicates and resolves.

The public modules are inspected in a subprocess: importing ``steadyfeed.keras`` needs
``KERAS_BACKEND`` set before Keras is imported, which this process cannot promise.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ["steadyfeed", "steadyfeed.keras", "steadyfeed.ray"]

# Run in a subprocess; prints {module: {"error": ...} | {"all": [...], "unresolved": [...],
# "missing": [[callable, [unannotated parameters / "return"]], ...], "skipped": [[name, why], ...]}}.
INSPECT = r'''
import importlib, inspect, json, sys

DUNDERS = ("__init__", "__call__", "__getitem__", "__len__", "__iter__")


def callables(modname, name, obj):
    """(qualified name, function) of an exported function, or of an exported class's public
    methods and DUNDERS (its own and those it inherits from steadyfeed classes)."""
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return
        seen = set()
        for klass in obj.__mro__:
            if not klass.__module__.startswith("steadyfeed"):
                continue  # object, keras.callbacks.Callback, ...: not ours to annotate
            for attr, val in vars(klass).items():
                if attr in seen:
                    continue
                seen.add(attr)
                if attr.startswith("_") and attr not in DUNDERS:
                    continue
                if isinstance(val, property):
                    val = val.fget
                if isinstance(val, (staticmethod, classmethod)):
                    val = val.__func__
                if inspect.isfunction(val):
                    yield f"{modname}.{name}.{attr}", val
    elif callable(obj):
        yield f"{modname}.{name}", obj


def missing_annotations(fn):
    sig = inspect.signature(fn)
    bad = [p.name for p in sig.parameters.values()
           if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty:
        bad.append("return")
    return bad


report = {}
for modname in sys.argv[1:]:
    try:
        mod = importlib.import_module(modname)
    except ImportError as exc:
        report[modname] = {"error": f"{type(exc).__name__}: {exc}"}
        continue
    entry = report[modname] = {"all": list(mod.__all__), "unresolved": [], "missing": [], "skipped": []}
    for name in mod.__all__:
        try:
            obj = getattr(mod, name)
        except ImportError as exc:  # an optional source whose extra is not installed
            entry["skipped"].append([name, f"{type(exc).__name__}: {exc}"])
            continue
        except AttributeError:
            entry["unresolved"].append(name)
            continue
        for qual, fn in callables(modname, name, obj):
            bad = missing_annotations(fn)
            if bad:
                entry["missing"].append([qual, bad])
print(json.dumps(report))
'''


@pytest.fixture(scope="module")
def public_api():
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = subprocess.run([sys.executable, "-c", INSPECT, *PUBLIC], capture_output=True, text=True, env=env, timeout=240)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def _module(public_api, modname):
    entry = public_api[modname]
    if "error" in entry:
        pytest.skip(f"{modname} cannot be imported here ({entry['error']})")
    return entry


@pytest.mark.timeout(300)
@pytest.mark.parametrize("modname", PUBLIC)
def test_all_is_sorted_unique_and_resolves(public_api, modname):
    entry = _module(public_api, modname)
    names = entry["all"]
    assert names == sorted(names), f"{modname}.__all__ is not sorted"
    assert len(names) == len(set(names)), (
        f"{modname}.__all__ lists {sorted({n for n in names if names.count(n) > 1})} twice"
    )
    assert not entry["unresolved"], f"{modname}.__all__ names what the module does not have: {entry['unresolved']}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("modname", PUBLIC)
def test_public_api_is_fully_annotated(public_api, modname):
    entry = _module(public_api, modname)
    assert not entry["missing"], "unannotated (callable, [parameters / return]): " + "; ".join(
        f"{qual} {bad}" for qual, bad in entry["missing"]
    )
    if entry["skipped"]:
        pytest.skip(f"not importable here, so not checked: {entry['skipped']}")


def test_optional_sources_are_exported():
    """The lazily imported sources are part of ``steadyfeed.__all__`` (and so of the checks above)."""
    import steadyfeed
    from steadyfeed import sources

    assert set(sources.OPTIONAL) <= set(steadyfeed.__all__)


@pytest.mark.timeout(300)
def test_mypy_is_clean():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip(f"mypy is not installed in {sys.executable} (it is in the dev extra: pip install -e '.[dev]')")
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--hide-error-context"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )  # files and options: pyproject.toml
    assert run.returncode == 0, f"mypy found problems:\n{run.stdout}{run.stderr}"
