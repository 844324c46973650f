"""The documentation site (``mkdocs.yml``, ``docs/``): it builds in strict mode, and every
example on its pages runs.

How the examples run (the conventions for ``docs/**/*.md``, and the only ones):

* Every fenced block tagged ``python`` runs, and every block tagged ``bash`` runs under
  ``bash -euo pipefail``. Blocks tagged anything else (``text``, ``pycon``, ``console``) are
  shown, never run.
* The blocks of one page run in page order, each in a fresh interpreter (a fresh shell),
  all in one temporary working directory per page: a later block sees the files an earlier
  one wrote, nothing else carries over. So each page is self-contained: it makes its own
  small data with the real writers (``np.save``, Pillow, h5py, pyarrow, ...).
* A hidden setup block: an HTML comment whose first line is ``<!-- setup`` and which holds
  fenced blocks up to a line ending in ``-->``. Its blocks run in their place like any other,
  but the site does not show them (Markdown leaves comments out). For data a reader does not
  need to see.
* ``<!-- no-run: REASON -->`` on the line just before a fence: that block is shown, not run;
  REASON (required) says why (a Ray cluster, a cloud bucket, a multi-host job).
* Environment: ``KERAS_BACKEND=jax`` (the fastest backend to import), JAX on the CPU, the
  virtual environment's ``bin`` first on ``PATH`` (so ``steadyfeed`` is the command under
  test) and ``src`` on ``PYTHONPATH``.

Pages run two at a time. Nothing here measures time: the timeouts are only there so that
nothing can hang.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import steadyfeed
from steadyfeed import config

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RUN = {"python", "bash"}
BLOCK_TIMEOUT = 240  # seconds; only against a hang
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)\s*$")
NO_RUN = re.compile(r"^\s*<!--\s*no-run:\s*(?P<reason>.*?)\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    hidden: bool  # inside a <!-- setup ... --> comment
    skip: str | None  # the no-run reason

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, with the conventions of the module docstring applied."""
    lines = page.read_text(encoding="utf-8").split("\n")
    found, i, in_setup = [], 0, False
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("<!-- setup"):
            in_setup = not line.rstrip().endswith("-->")
        elif in_setup and line.rstrip().endswith("-->") and not FENCE.match(line):
            in_setup = False
        fence = FENCE.match(line)
        if fence and fence["lang"]:
            indent, body, j = fence["indent"], [], i + 1
            while j < len(lines) and not re.match(rf"^{re.escape(indent)}```\s*$", lines[j]):
                body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip())
                j += 1
            if j == len(lines):
                raise AssertionError(f"{page.relative_to(ROOT)}:{i + 1}: a fence that never closes")
            previous = lines[i - 1] if i else ""
            skip = NO_RUN.match(previous)
            found.append(
                Block(page, i + 1, fence["lang"], "\n".join(body) + "\n", in_setup, skip["reason"] if skip else None)
            )
            i = j
        i += 1
    return found


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def environment() -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        CUDA_VISIBLE_DEVICES="",
        PYTHONHASHSEED="0",
        PATH=bin_dir + os.pathsep + env.get("PATH", ""),
        MPLBACKEND="Agg",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p),
        TF_CPP_MIN_LOG_LEVEL="3",
        NO_MKDOCS_2_WARNING="1",
    )
    return env


def run_page(page: Path, tmp: Path) -> list[str]:
    """Run the page's runnable blocks in order in one working directory: the failures, as text."""
    name = "-".join(page.relative_to(DOCS).with_suffix("").parts)
    work, scripts = tmp / name / "work", tmp / name / "scripts"
    work.mkdir(parents=True)
    scripts.mkdir()
    for block in blocks(page):
        if block.lang not in RUN or block.skip is not None:
            continue
        script = scripts / f"line{block.line}.{'py' if block.lang == 'python' else 'sh'}"
        script.write_text(block.code, encoding="utf-8")
        command = [sys.executable, str(script)] if block.lang == "python" else ["bash", "-euo", "pipefail", str(script)]
        try:
            done = subprocess.run(
                command,
                cwd=work,
                env=environment(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            return [f"{block.where()}: still running after {BLOCK_TIMEOUT} s"]
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-4000:]
            return [f"{block.where()}: exit {done.returncode}\n{output}"]  # later blocks need this one
    return []


# -- the conventions are kept -------------------------------------------------------------
def test_every_page_is_in_the_nav_and_every_skip_says_why():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in pages():
        assert str(page.relative_to(DOCS)) in nav, f"{page.relative_to(ROOT)} is not in mkdocs.yml's nav"
        for block in blocks(page):
            if block.skip is not None:
                assert block.skip, f"{block.where()}: no-run needs a reason"
                assert block.lang in RUN, f"{block.where()}: no-run on a block that never runs"
    runnable = [b for p in pages() for b in blocks(p) if b.lang in RUN]
    skipped = [b for b in runnable if b.skip is not None]
    assert len(runnable) >= 30 and len(skipped) <= len(runnable) // 5, "no-run is for a few blocks only"


def test_the_block_parser_follows_the_conventions(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# t\n\n```python\nprint(1)\n```\n\n<!-- setup\n```python\nimport os\n```\n-->\n\n"
        "<!-- no-run: needs a cluster -->\n```python\nray()\n```\n\n* item\n\n    ```bash\n"
        "    echo hi\n    ```\n\n```text\nshown\n```\n"
    )
    found = blocks(page)
    assert [(b.lang, b.code, b.hidden, b.skip) for b in found] == [
        ("python", "print(1)\n", False, None),
        ("python", "import os\n", True, None),
        ("python", "ray()\n", False, "needs a cluster"),
        ("bash", "echo hi\n", False, None),
        ("text", "shown\n", False, None),
    ]


# -- the API reference covers the public names --------------------------------------------
def test_the_api_reference_documents_every_public_name():
    text = "\n".join(p.read_text() for p in (DOCS / "api").glob("*.md"))
    documented = {line.split()[1] for line in text.split("\n") if line.startswith("::: ")}
    for module, members in re.findall(r"^::: ([\w.]+)\n    options:\n      members: \[([^\]]*)\]", text, re.M):
        documented |= {f"{module}.{name.strip()}" for name in members.split(",")}  # a module shown with its names
    short = {name.rsplit(".", 1)[-1] for name in documented if name.count(".") >= 1}
    missing = [n for n in steadyfeed.__all__ if f"steadyfeed.{n}" not in documented and n not in short]
    assert not missing, f"names of steadyfeed.__all__ without a ':::' entry in docs/api/: {missing}"
    for module in ("keras", "ray"):
        tree = ast.parse((ROOT / "src" / "steadyfeed" / f"{module}.py").read_text())
        names = next(
            ast.literal_eval(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "__all__"
        )
        missing = [
            n
            for n in names
            if f"steadyfeed.{module}.{n}" not in documented
            and not (module == "ray" and n == "RayClusterLost" and "steadyfeed.RayClusterLost" in documented)
        ]
        assert not missing, f"steadyfeed.{module} names without a ':::' entry: {missing}"


def test_the_options_page_lists_every_option_with_its_default():
    text = (DOCS / "concepts" / "options.md").read_text()
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `(\w+)` \| `([^`]*)` \|", text, re.M)}
    for _group, f, _type in config.option_fields():
        assert f.name in rows, f"docs/concepts/options.md has no row for the option {f.name!r}"
        default = "required" if f.default is dataclasses.MISSING else repr(f.default)
        assert rows[f.name] == default, f"{f.name}: the page says {rows[f.name]}, the code {default}"
    assert set(rows) == set(config.OPTION_GROUPS), f"rows for no option: {set(rows) - set(config.OPTION_GROUPS)}"


def test_every_test_the_pages_name_exists():
    """The guarantees name the tests that prove them: each named test and file must exist."""
    tests = ROOT / "tests"
    defined = {m[1] for path in tests.rglob("*.py") for m in re.finditer(r"^\s*def (test_\w+)", path.read_text(), re.M)}
    for page in pages():
        text = page.read_text()
        for name in set(re.findall(r"\b(test_\w+)\b", text)):
            if name.startswith("test_sources_") and name.endswith("_"):  # tests/test_sources_*.py
                continue
            assert name in defined or (tests / f"{name}.py").exists(), f"{page.relative_to(ROOT)} names {name}"
        for path in set(re.findall(r"`(tests/[\w/.]+)`", text)):
            assert (ROOT / path).exists(), f"{page.relative_to(ROOT)} names {path}, which does not exist"


@pytest.mark.parametrize("page", ["docs/getting-started/install.md", "README.md"])
def test_the_install_tables_list_every_extra(page):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    listed = re.findall(r"^\| `(\w+)` \|", (ROOT / page).read_text(), re.M)
    assert sorted(listed) == sorted(extras), f"{page} lists {sorted(listed)}, pyproject.toml has {sorted(extras)}"


# -- the site builds, and every example runs ------------------------------------------------
@pytest.mark.timeout(600)
def test_the_site_builds_in_strict_mode(tmp_path):
    """A broken link, anchor, cross-reference or ``:::`` target fails the build."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--clean",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        env=environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert (tmp_path / "site" / "api" / "loader" / "index.html").read_text().count("Loader") > 10


@pytest.mark.timeout(900)
def test_every_example_on_every_page_runs(tmp_path):
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        # the pages that train Keras models take longest: start them first, so the two lanes even out
        ordered = sorted(pages(), key=lambda page: "import keras" not in page.read_text())
        failures = [f for result in pool.map(lambda page: run_page(page, tmp_path), ordered) for f in result]
    assert not failures, "\n\n".join(failures)
