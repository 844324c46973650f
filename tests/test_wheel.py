"""The package as a user installs it: ``python -m build`` makes an sdist and a wheel, and the
wheel installs into fresh virtual environments and works (``wheel_smoke.py``).

* no extras, then ``[keras,jax]``: a fresh venv, the dependencies installed by pip (from its cache
  after the first run);
* ``[dev]``: the wheel installed without dependencies into a fresh venv that sees the project's
  ``.venv`` packages (a full install of every framework would take minutes); the smoke script
  checks that every requirement the dev extra reaches is met, and a test module of the suite
  runs against the installed wheel, not this checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOKE = Path(__file__).with_name("wheel_smoke.py")

pytestmark = pytest.mark.timeout(600)


def _run(*cmd, cwd=None, env=None):
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result.stdout


def _clean_env():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KERAS_BACKEND")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT, cwd=out, env=_clean_env())
    return out


@pytest.fixture(scope="module")
def wheel(dist):
    (path,) = dist.glob("steadyfeed-*.whl")
    return path


def _venv(path: Path) -> Path:
    """A fresh venv without pip of its own (ensurepip costs more than the rest): the project's pip
    installs into it with ``--python``."""
    base = getattr(sys, "_base_executable", None) or sys.executable  # the interpreter .venv was made from
    _run(base, "-m", "venv", "--without-pip", path)
    return path / "bin" / "python"


def _pip_install(python: Path, *args):
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", *args, env=_clean_env())


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """One fresh venv: the bare install first, then the keras extra on top (as a user adds it)."""
    return _venv(tmp_path_factory.mktemp("user") / "venv")


def test_build_makes_an_sdist_and_a_wheel_with_the_package_data(dist, wheel):
    import steadyfeed

    assert list(dist.glob(f"steadyfeed-{steadyfeed.__version__}.tar.gz"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "steadyfeed/py.typed" in names and "steadyfeed/loader.py" in names
    assert not [n for n in names if n.startswith("tests/")]
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "steadyfeed = steadyfeed.tools.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_the_wheel_installs_and_runs_in_a_fresh_venv(venv, wheel, tmp_path):
    _pip_install(venv, wheel)
    assert _run(venv, SMOKE, "bare", cwd=tmp_path, env=_clean_env()).strip().endswith("ok bare")
    import steadyfeed

    version = _run(venv.parent / "steadyfeed", "--version", env=_clean_env())
    assert version.strip() == f"steadyfeed {steadyfeed.__version__}"


def test_the_keras_extras_train_a_keras_model(venv, wheel, tmp_path):
    # [keras] brings Keras, not a backend (Keras's own backends need scipy or jax even for numpy)
    _pip_install(venv, f"steadyfeed[keras,jax] @ {wheel.as_uri()}")
    assert _run(venv, SMOKE, "keras", cwd=tmp_path, env=_clean_env()).strip().endswith("ok keras")


def test_the_wheel_with_the_dev_extra_passes_a_test_module(tmp_path, wheel):
    python, env = _venv(tmp_path / "venv"), _clean_env()
    _pip_install(python, "--no-deps", wheel)
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    # the project's dependencies, without its editable steadyfeed (a path line in a .pth file does not
    # run the .pth files of that directory, so the editable finder stays out)
    (site / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    assert _run(python, SMOKE, "dev", cwd=tmp_path, env=env).strip().endswith("ok dev")
    where = _run(python, "-c", "import steadyfeed; print(steadyfeed.__file__)", cwd=tmp_path, env=env)
    assert where.startswith(str(tmp_path)), where
    _run(
        python,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        ROOT / "tests" / "test_formats.py",
        cwd=tmp_path,
        env=env,
    )
