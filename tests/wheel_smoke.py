"""A user's first minute with an installed wheel; run by ``test_wheel.py`` with a venv's python.

``python wheel_smoke.py bare|keras|dev``: imports steadyfeed from the venv (never this
checkout), runs a tiny epoch, and checks what that install promises: the bare install
imports no framework and names the extra an optional source needs; ``[keras]`` feeds a Keras
model (``[keras,jax]``: the keras extra brings Keras, a backend comes with its own extra); ``[dev]`` has every extra.
Prints "ok <kind>" last; any failure is an exception.
"""

from __future__ import annotations

import os
import sys

import numpy as np


def tiny_epoch():
    import steadyfeed as sf

    source = sf.ArraySource(x=np.arange(20, dtype=np.float32).reshape(10, 2), y=np.arange(10))
    with sf.Loader(source, 4, shuffle=True, seed=0, workers=2) as loader:
        ids = sorted(int(i) for batch in loader for i in batch["y"])
    assert ids == list(range(10)), ids
    return source


def bare():
    import steadyfeed as sf

    assert os.path.dirname(sf.__file__).startswith(sys.prefix), f"steadyfeed imported from {sf.__file__}"
    tiny_epoch()
    heavy = {"keras", "tensorflow", "torch", "jax", "ray", "PIL", "h5py", "pyarrow"} & set(sys.modules)
    assert not heavy, f"import steadyfeed imported {sorted(heavy)}"
    try:
        sf.ImageFolder(".")
    except ImportError as exc:
        assert "pip install 'steadyfeed[images]'" in str(exc), str(exc)
    else:
        raise AssertionError("ImageFolder without Pillow did not name the images extra")


def keras():
    os.environ["KERAS_BACKEND"] = "jax"  # the lightest backend to install
    import keras as k

    import steadyfeed as sf
    from steadyfeed.keras import LoaderMonitor

    source = tiny_epoch()
    model = k.Sequential([k.Input((2,)), k.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with sf.Loader(source, 4, shuffle=True) as loader:
        history = model.fit(loader.as_keras(), epochs=2, verbose=0, callbacks=[LoaderMonitor(loader)])
    assert len(history.history["loss"]) == 2, history.history


def dev():
    """Every requirement the dev extra reaches (through steadyfeed[...] self-references) is met."""
    from importlib import metadata

    from packaging.requirements import Requirement

    requirements = [Requirement(r) for r in metadata.requires("steadyfeed")]
    extras, todo = set(), ["dev"]
    while todo:
        extra = todo.pop()
        extras.add(extra)
        for req in requirements:
            if req.marker is not None and req.marker.evaluate({"extra": extra}) and req.name == "steadyfeed":
                todo += [e for e in req.extras if e not in extras]
    unmet = []
    for req in requirements:
        wanted = req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras)
        if not wanted or req.name == "steadyfeed":
            continue
        try:
            found = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            found = None
        if found is None or not req.specifier.contains(found, prereleases=True):
            unmet.append(f"{req} (found {found})")
    assert not unmet, f"the dev extra's requirements are not met: {unmet}"
    tiny_epoch()


if __name__ == "__main__":
    kind = sys.argv[1]
    {"bare": bare, "keras": keras, "dev": dev}[kind]()
    print(f"ok {kind}")
