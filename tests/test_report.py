"""The HTML report: every section of the findings contract, rendered into one self-contained page
and checked in a real headless browser (Debian's chromium): the images decode, the sections and
tables hold what the findings say, strings from data stay text.

label_noise comes from a real (numpy) training run with planted flips, quarantine from a real
loader run under on_error="skip"; quality, duplicates and excluded are hand-made in the contract's
shape (another part of steadyfeed emits them), with thumbnails from a source and from files.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import steadyfeed as sf
from steadyfeed.diagnostics import findings as findings_io
from steadyfeed.diagnostics.label_noise import LabelNoiseRecorder
from steadyfeed.diagnostics.report import ReportOptions, render, write

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("matplotlib")

N, CLASSES, SIDE = 400, 4, 8
EVIL = "<script>window.pwned=1</script>&amp;\"'"
BROWSER_TIMEOUT = 120


def images(seed: int = 0):
    """8x8 grey images: class c is a bright band at rows 2c, 2c+1; 10% of the labels flipped."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, CLASSES, N)
    x = rng.normal(0.2, 0.1, size=(N, SIDE, SIDE)).astype(np.float32)
    for c in range(CLASSES):
        x[truth == c, 2 * c : 2 * c + 2, :] += 1.0
    flipped = rng.choice(N, N // 10, replace=False)
    given = truth.copy()
    given[flipped] = (truth[flipped] + 1 + rng.integers(0, CLASSES - 1, len(flipped))) % CLASSES
    return x, given, set(flipped.tolist())


def label_noise_findings(x, y) -> dict:
    recorder = LabelNoiseRecorder()
    w = np.zeros((SIDE * SIDE, CLASSES))
    with sf.Loader(sf.ArraySource(x=x, y=y), 32, shuffle=True, with_ids=True) as loader:
        for epoch in range(5):
            for batch in loader.epoch(epoch):
                flat = batch["x"].reshape(len(batch["x"]), -1)
                logits = flat @ w
                recorder.record(batch["id"], logits, batch["y"])
                p = np.exp(logits - logits.max(1, keepdims=True))
                p /= p.sum(1, keepdims=True)
                p[np.arange(len(p)), batch["y"]] -= 1
                w -= 0.1 * flat.T @ p / len(p)
    return recorder.findings()


class Failing:
    """Two samples of the images fail to read (a corrupt file, say)."""

    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if i in (3, 17):
            raise ValueError(f"corrupt sample {i} {EVIL}")
        return {"x": self.x[i]}

    def locate(self, i):
        return f"/data/{EVIL}/{i}.png"


def quarantine_findings(x) -> dict:
    with sf.Loader(Failing(x), 50, on_error="skip", max_error_fraction=0.5) as loader:
        for _ in loader.epoch(0):
            pass
        return findings_io.from_quarantine(loader.quarantine_report())


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The findings (every section), the sources, the written page, and what the data says."""
    root = tmp_path_factory.mktemp("report")
    x, y, flipped = images()
    files = []
    for k in range(3):  # images on disk, for findings that name a file and no source
        path = root / f"{EVIL if k == 0 else 'img'}{k}.png".replace("/", "_")
        Image.fromarray((np.full((20, 30), 60 * k + 40)).astype(np.uint8)).save(path)
        files.append(str(path))
    noise = label_noise_findings(x, y)
    findings = findings_io.merge(
        {"label_noise": noise},
        quarantine_findings(x),
        {
            "quality": {
                "checks": {
                    "blur": {
                        "threshold": 12.5,
                        "flagged": [
                            {"id": 5, "score": 1.5, "label": 2},
                            {"id": 9, "score": 3.25, "label": 0},
                            {"id": 10**6, "score": 4.0, "file": files[0]},
                        ],
                    },  # not in the source: its file
                    "dark": {"threshold": 0.1, "flagged": [{"id": 7, "score": 0.01, "file": files[1], "label": EVIL}]},
                },
                "per_class": {"0": {"blur": 1}, "2": {"blur": 1, "dark": 1}},
            }
        },
        {
            "duplicates": [
                {"a": 1, "b": 2, "distance": 0, "split_a": "train", "split_b": "val"},
                {
                    "a": 11,
                    "b": 12,
                    "distance": 3,
                    "a_file": files[1],
                    "b_file": files[2],
                    "split_a": "elsewhere",
                    "split_b": "elsewhere",
                },
            ]
        },
        {"excluded": [{"id": 3, "reason": "quarantined"}, {"id": 42, "reason": EVIL}]},
    )
    out = root / "report.html"
    sources = {"train": sf.ArraySource(x=x, y=y), "val": sf.ArraySource(x=x[::-1].copy())}
    write(out, json.loads(json.dumps(findings)), sources=sources, options=ReportOptions(title=f"test {EVIL}"))
    return {"findings": findings, "path": out, "flipped": flipped, "root": root}


def test_the_findings_are_real_and_every_section_is_there(page):
    f = page["findings"]
    assert set(f) == {"label_noise", "quarantine", "quality", "duplicates", "excluded"}
    assert {q["id"] for q in f["quarantine"]} == {3, 17}
    suspects = {s["id"] for s in f["label_noise"]["suspects"]}
    assert len(suspects & page["flipped"]) >= 0.8 * len(page["flipped"])
    text = page["path"].read_text()
    for section in ("summary", "label-noise", "quality", "duplicates", "quarantine", "excluded"):
        assert f'id="{section}"' in text


def test_strings_from_data_are_escaped(page):
    text = page["path"].read_text()
    assert "<script>" not in text.lower()
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;&amp;amp;&quot;&#x27;" in text


def test_the_page_is_self_contained(page):
    text = page["path"].read_text()
    srcs = re.findall(r'src="([^"]*)"', text)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r'(href|src)="(?!data:)', text) and "<link" not in text and "@import" not in text


def test_an_empty_findings_page_says_so():
    assert "No findings." in render({})


def test_a_thumbnail_that_cannot_be_made_says_why():
    text = render(
        {
            "excluded": [],
            "quality": {
                "checks": {"blur": {"threshold": 1, "flagged": [{"id": 0, "score": 1, "file": "/nonexistent/x.png"}]}}
            },
        }
    )
    assert "no image: FileNotFoundError" in text


# -- in a real browser ------------------------------------------------------------------------------
_PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const cell = s => [...document.querySelectorAll(s)].map(e => e.textContent);
  const out = {images: imgs.length, decoded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
    thumbs: document.querySelectorAll('img.thumb').length, plots: document.querySelectorAll('img.plot').length,
    suspects: document.querySelectorAll('div.suspects figure').length,
    quarantined: cell('table.quarantined tr td:first-child'), excluded: cell('table.excluded-ids tr td:last-child'),
    pairs: document.querySelectorAll('table.pairs tr').length - 1,
    quality: document.querySelectorAll('div.quality figure').length,
    scripts: document.scripts.length, pwned: window.pwned === 1, title: document.title};
  const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str:
    """The chromium binary; installs Debian's package when it is missing and this may (root)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no chromium, and apt-get install -y chromium needs root here")
    try:
        subprocess.run(
            ["apt-get", "install", "-y", "chromium"],
            capture_output=True,
            timeout=600,
            check=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"chromium is missing and apt-get install -y chromium failed: {exc}")
    found = shutil.which("chromium")
    if not found:
        pytest.skip("apt-get install -y chromium ran but there is no chromium on PATH")
    return found


@pytest.mark.timeout(BROWSER_TIMEOUT + 660)
def test_in_a_headless_browser_every_image_decodes_and_every_section_shows(page, tmp_path):
    browser = chromium()
    probed = tmp_path / "probed.html"
    probed.write_text(page["path"].read_text().replace("</body>", _PROBE + "</body>"))
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            probed.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=BROWSER_TIMEOUT,
    )
    match = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert match, f"rc {done.returncode}; no probe in the DOM:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    seen = json.loads(html.unescape(match.group(1)))
    f = page["findings"]
    shown_suspects = min(len(f["label_noise"]["suspects"]), ReportOptions.rows)
    # thumbnails: suspects, 4 quality images, 2 pairs x 2; plots: the AUM histogram and the per-class bars
    assert seen["thumbs"] == shown_suspects + 4 + 4, seen
    assert seen["plots"] == 2, seen
    assert seen["decoded"] == seen["images"] == seen["thumbs"] + seen["plots"], seen
    assert seen["suspects"] == shown_suspects and seen["pairs"] == 2 and seen["quality"] == 4
    assert sorted(seen["quarantined"]) == ["17", "3"]
    assert seen["excluded"] == ["quarantined", EVIL]  # the text itself, shown, not run
    assert seen["scripts"] == 1 and not seen["pwned"]  # only the probe ran
    assert seen["title"] == f"test {EVIL}"


@pytest.mark.timeout(300)
def test_the_report_command_writes_the_page(page, tmp_path):
    saved = tmp_path / "findings.json"
    findings_io.save(saved, page["findings"])
    out = tmp_path / "cli.html"
    done = subprocess.run(
        [sys.executable, "-m", "steadyfeed.tools.cli", "report", str(saved), "-o", str(out), "--title", "from the CLI"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "<title>from the CLI</title>" in text and 'id="quarantine"' in text
    # no source given: the suspects have no file, so no thumbnails; files still give theirs
    assert text.count('class="thumb"') == 4
    # with data (SPEC after the flags, as before them), the suspects get their thumbnails from it
    spec = tmp_path / "data.py"
    spec.write_text(
        "import numpy as np\nimport steadyfeed as sf\n\n"
        f"def train():\n    return sf.ArraySource(x=np.ones(({N}, {SIDE}, {SIDE}), np.float32))\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "steadyfeed.tools.cli", "report", str(saved), "-o", str(out), f"{spec}:train"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    shown = min(len(page["findings"]["label_noise"]["suspects"]), ReportOptions.rows)
    assert out.read_text().count('class="thumb"') == shown + 4 + 3  # + quality's 4, pairs: a "train" side, 2 files
    bad = subprocess.run(
        [sys.executable, "-m", "steadyfeed.tools.cli", "report", str(tmp_path / "none.json"), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert bad.returncode == 2 and "none.json" in bad.stderr
    unwritable = subprocess.run(
        [sys.executable, "-m", "steadyfeed.tools.cli", "report", str(saved), "-o", str(saved / "no" / "page.html")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert unwritable.returncode == 1 and "cannot write" in unwritable.stderr


def test_findings_merge_concatenates_lists_and_joins_quality_checks(tmp_path):
    a = {"quarantine": [{"id": 1, "error": "E"}], "quality": {"checks": {"blur": {"flagged": []}}}}
    b = {
        "quarantine": [{"id": 1, "error": "E"}, {"id": 2, "error": "F"}],
        "quality": {"checks": {"dark": {"flagged": []}}, "per_class": {"0": {"dark": 0}}},
        "label_noise": {"x": 1},
    }
    merged = findings_io.merge(a, b)
    assert [q["id"] for q in merged["quarantine"]] == [1, 2]
    assert set(merged["quality"]["checks"]) == {"blur", "dark"} and merged["quality"]["per_class"] == {"0": {"dark": 0}}
    findings_io.save(tmp_path / "f.json", {**merged, "n": np.int64(3)})  # numpy scalars are JSON numbers
    assert findings_io.load(tmp_path / "f.json")["n"] == 3
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="JSON object"):
        findings_io.load(tmp_path / "list.json")
