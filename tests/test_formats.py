"""Saved formats across versions: what a user keeps (a checkpoint, a packed directory) stays readable.

The fixtures in ``tests/formats/`` were written by the version that introduced each format
(``tests/formats/make_fixtures.py``) and are never regenerated: reading them with the current
code is what a later release does with a user's files. A format this version no longer reads
must be refused with a message that says what to do, never misread.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest

import steadyfeed as sf
from steadyfeed.sources.tfrecord import MANIFEST_FORMAT, MANIFEST_VERSION

FORMATS = os.path.join(os.path.dirname(__file__), "formats")
sys.path.insert(0, FORMATS)
from make_fixtures import fixture_source, sample_ids  # noqa: E402


def _saved_state() -> dict:
    with open(os.path.join(FORMATS, "loader-state-2.json"), encoding="utf-8") as f:
        return json.load(f)


def test_a_format_2_checkpoint_resumes_the_same_batches():
    saved = _saved_state()
    with sf.Loader(fixture_source(), 4, shuffle=True, seed=11) as loader:
        loader.load_state_dict(saved["state"])
        assert [sample_ids(b) for b in loader] == saved["rest_of_epoch_1"]
        assert [sample_ids(b) for b in loader.epoch(2)] == saved["epoch_2"]


def test_a_format_2_checkpoint_resumes_with_workers():
    saved = _saved_state()
    with sf.Loader(fixture_source(), 4, shuffle=True, seed=11, workers=2) as loader:
        loader.load_state_dict(saved["state"])
        assert [sample_ids(b) for b in loader] == saved["rest_of_epoch_1"]


def test_a_format_1_checkpoint_is_refused_saying_what_to_do():
    old = {**_saved_state()["state"], "format": "steadyfeed.loader/1"}
    with sf.Loader(fixture_source(), 4, shuffle=True, seed=11) as loader:
        with pytest.raises(ValueError, match=r"older steadyfeed \(steadyfeed.loader/1.*loader.seek\(epoch\)"):
            loader.load_state_dict(old)


@pytest.mark.parametrize("state", [{"format": "steadyfeed.loader/9"}, {"epoch": 1}, [1, 2]])
def test_an_unknown_state_is_refused(state):
    with sf.Loader(fixture_source(), 4) as loader:
        with pytest.raises(ValueError, match="not a steadyfeed loader state"):
            loader.load_state_dict(state)


def test_a_version_1_packed_directory_reads_bit_exact(tmp_path):
    packed = shutil.copytree(os.path.join(FORMATS, "pack-manifest-1"), tmp_path / "packed")  # indexes get built
    source, expected = sf.TFRecordSource(str(packed)), fixture_source()
    assert len(source) == len(expected)
    for i in range(len(expected)):
        for key in ("x", "y"):
            got, want = np.asarray(source[i][key]), np.asarray(expected[i][key])
            assert got.dtype == want.dtype and got.shape == want.shape and (got == want).all()


def test_a_manifest_of_another_version_is_refused_naming_both(tmp_path):
    packed = shutil.copytree(os.path.join(FORMATS, "pack-manifest-1"), tmp_path / "packed")
    manifest = json.loads((packed / "manifest.json").read_text())
    (packed / "manifest.json").write_text(json.dumps({**manifest, "version": MANIFEST_VERSION + 1}))
    with pytest.raises(
        sf.DataError, match=f"version {MANIFEST_VERSION + 1}.*{MANIFEST_FORMAT}.*version {MANIFEST_VERSION}"
    ):
        sf.TFRecordSource(str(packed))


def test_every_fixture_is_read_by_a_test():
    fixtures = {name for name in os.listdir(FORMATS) if name != "make_fixtures.py" and not name.startswith("__")}
    assert fixtures == {"loader-state-2.json", "pack-manifest-1"}, "a new fixture needs a test above"


def test_the_changelog_has_a_section_for_this_version():
    text = open(os.path.join(os.path.dirname(FORMATS), "..", "CHANGELOG.md"), encoding="utf-8").read()
    assert f"\n## {sf.__version__} " in text, f"CHANGELOG.md has no '## {sf.__version__}' section"
