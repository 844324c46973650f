"""Near-duplicates (issue 17, item 3): a perceptual hash that finds re-encoded, resized and
slightly cropped copies within a split and across audit --against splits, by a multi-index
search that finds exactly the pairs a comparison of all pairs finds."""

import json

import images_made as made
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import steadyfeed as sf
from steadyfeed import Loader
from steadyfeed.diagnostics import near_duplicates as nd
from steadyfeed.tools.audit import audit
from steadyfeed.tools.cli import main

pytest.importorskip("PIL")


def brute_force(a, b=None, r=nd.MAX_DISTANCE):
    d = nd.distance(a[:, None], (a if b is None else b)[None, :])
    close = np.triu(d <= r, 1) if b is None else d <= r
    i, j = np.nonzero(close)
    return {(int(x), int(y), int(d[x, y])) for x, y in zip(i, j)}


def test_the_hash_agrees_with_imagehash_and_tells_copies_from_other_images():
    imagehash = pytest.importorskip("imagehash")
    scenes = [made.scene(s) for s in range(30)]
    for method, reference, tolerance in (("phash", imagehash.phash, 2), ("dhash", imagehash.dhash, 5)):
        mine = nd.hashes(np.stack([np.asarray(im) for im in scenes]), method)
        theirs = np.array([int(str(reference(im)), 16) for im in scenes], np.uint64)
        # thumbnails shrink by exact area averaging, imagehash by Pillow's resampling: a few bits apart
        assert nd.distance(mine, theirs).mean() <= tolerance
    h = lambda image: nd.hashes(np.asarray(image))[0]  # noqa: E731
    for copy in (made.reencoded, made.resized, lambda im: made.cropped(im, 0.03)):
        assert all(nd.distance(h(im), h(copy(im))) <= nd.MAX_DISTANCE for im in scenes)
    others = nd.hashes(np.stack([np.asarray(im) for im in scenes]))
    assert min(int(nd.distance(others[i], others[j])) for i in range(30) for j in range(i)) > nd.MAX_DISTANCE + 4


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 400),
    m=st.integers(0, 300),
    r=st.integers(0, 14),
    seed=st.integers(0, 2**32 - 1),
    across=st.booleans(),
    data=st.data(),
)
def test_the_search_finds_exactly_the_pairs_all_pairs_would(n, m, r, seed, across, data):
    """Random hashes with planted neighbours at every distance up to r + 2: the multi-index
    search finds each pair within r once, and nothing else, whatever number of bands it picks."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64) << np.uint64(1)
    b = rng.integers(0, 2**63, m, dtype=np.int64).astype(np.uint64) if across else None
    target = a if b is None else b
    planted = min(len(target) // 2, len(a), 40)
    for k in range(planted):  # target[-1 - k] is a[k] with k % (r + 3) bits flipped
        flips = rng.choice(64, size=k % (r + 3), replace=False)
        target[-1 - k] = a[k] ^ np.uint64(sum(1 << int(f) for f in flips))
    count = data.draw(st.one_of(st.none(), st.integers(nd.MIN_BANDS, max(nd.MIN_BANDS, r + 1))))
    got = nd.find(a, b, r, band_count=count)  # None: as planned for the sizes; else bands with bit flips to probe
    assert {tuple(map(int, row)) for row in got} == brute_force(a, b, r)
    assert len(got) == len({(int(i), int(j)) for i, j, _ in got})  # each pair once


def test_the_band_count_follows_the_sizes():
    assert nd.plan_bands(100, 100, 8) > nd.plan_bands(200_000, 200_000, 8) >= nd.MIN_BANDS
    assert [w for _, w in nd.bands(3)] == [22, 21, 21] and sum(w for _, w in nd.bands(7)) == 64


def trees(tmp_path):
    """A train tree with in-split copies (ids 20, 21, 22 copy 0, 1, 2) and a val tree holding
    copies of train 5 and 6 (val ids 10, 11), as JPEG / PNG files of several sizes."""
    train = {"a": [made.scene(s) for s in range(12)], "b": [made.scene(s) for s in range(12, 20)]}
    train["b"] += [made.reencoded(train["a"][0]), made.resized(train["a"][1]), made.cropped(train["a"][2], 0.03)]
    val = {
        "a": [made.scene(s) for s in range(100, 110)]
        + [made.reencoded(train["a"][5], 50), made.cropped(train["a"][6], 0.03)]
    }
    for root, classes in (("train", train), ("val", val)):
        for name, images in classes.items():
            (tmp_path / root / name).mkdir(parents=True)
            for j, image in enumerate(images):
                image.save(tmp_path / root / name / f"{j:03d}.{'jpg' if j % 2 else 'png'}", quality=92)
    return tmp_path / "train", tmp_path / "val"


@pytest.mark.timeout(300)
def test_audit_lists_the_copies_within_the_split_and_across_against(tmp_path, no_leaks):
    train, val = trees(tmp_path)
    loader = Loader(sf.ImageFolder(train, size=(64, 64)), 8)
    against = Loader(sf.ImageFolder(val, size=(64, 64)), 8)
    report = audit(loader, against=against, epochs=1, settings=((2, "process"),), near_duplicates=8)
    pairs = report.findings["duplicates"]
    within = {(p["a"], p["b"]) for p in pairs if "split_b" not in p}
    across = {(p["a"], p["b"]) for p in pairs if p.get("split_b") == "against"}
    assert within == {(0, 12 + 8), (1, 12 + 9), (2, 12 + 10)}
    assert across == {(5, 10), (6, 11)}
    for p in pairs:
        assert 0 <= p["distance"] <= 8 and p["a_file"].startswith(str(train)) and p["b_file"].endswith((".png", ".jpg"))
    assert [p["distance"] for p in pairs if "split_b" not in p] == sorted(
        p["distance"] for p in pairs if "split_b" not in p
    )
    failed = {c.name for c in report.failed}
    assert {"near_duplicates", "near_contamination"} <= failed
    assert "contamination" not in failed  # no byte-identical sample: only the perceptual hash sees these
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report.as_dict()))
    kept = Loader(sf.ImageFolder(train, size=(64, 64)), 8, exclude=path, with_ids=True)
    assert [e["id"] for e in kept.excluded()] == [5, 6, 20, 21, 22]  # one copy of each pair stays
    assert len(np.concatenate([b["id"] for b in kept])) == 23 - 5


def test_cli_audit_near_duplicates_flag(tmp_path, capsys):
    train, val = trees(tmp_path)
    code = main(
        [
            "audit",
            "--images",
            str(train),
            "--image-size",
            "64",
            "64",
            "--settings",
            "0",
            "--epochs",
            "1",
            "--near-duplicates",
            "--json",
            "--no-progress",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    check = next(c for c in report["checks"] if c["name"] == "near_duplicates")
    assert check["details"]["max_distance"] == nd.MAX_DISTANCE and check["details"]["count"] == 3
    code = main(
        [
            "audit",
            "--images",
            str(val),
            "--image-size",
            "64",
            "64",
            "--settings",
            "0",
            "--epochs",
            "1",
            "--near-duplicates",
            "4",
            "--json",
            "--no-progress",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and next(c for c in report["checks"] if c["name"] == "near_duplicates")["status"] == "pass"
