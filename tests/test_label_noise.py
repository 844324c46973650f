"""The framework-free label-noise recorder: planted flips on synthetic data rank first, the noise
rate is estimated with an interval, from a plain numpy training loop and from a tiny torch loop.

The data: 4 Gaussian classes in 10 dimensions, a fixed seed, a known set of flipped labels. A
softmax regression trained for 8 epochs puts the flipped samples at the bottom of the AUM ranking
(measured: recall in the top k = 1.0 at 10% and 0.996 at 20%, k the number of flips; the noise
rate within 0.005 of the truth); the bounds below hold by a wide margin, and a ranking that did
not use the margins (by id, or shuffled) fails them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import steadyfeed as sf
from steadyfeed.diagnostics.label_noise import LabelNoiseRecorder, NoiseOptions, class_indices, log_probabilities

CLASSES, DIM, N, EPOCHS = 4, 10, 1200, 8


def planted(rate: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=2.0, size=(CLASSES, DIM))
    truth = rng.integers(0, CLASSES, N)
    x = (centers[truth] + rng.normal(size=(N, DIM))).astype(np.float32)
    flipped = np.sort(rng.choice(N, int(rate * N), replace=False))
    given = truth.copy()
    given[flipped] = (truth[flipped] + rng.integers(1, CLASSES, len(flipped))) % CLASSES
    return x, given, truth, flipped


def numpy_loop(x, y, recorder, epochs=EPOCHS):
    """Softmax regression by SGD; the recorder sees each batch's logits before its step."""
    w, b = np.zeros((DIM, CLASSES)), np.zeros(CLASSES)
    with sf.Loader(sf.ArraySource(x=x, y=y), 32, shuffle=True, seed=1, with_ids=True) as loader:
        for epoch in range(epochs):
            for batch in loader.epoch(epoch):
                logits = batch["x"] @ w + b
                recorder.record(batch["id"], logits, batch["y"])
                grad = np.exp(logits - logits.max(1, keepdims=True))
                grad /= grad.sum(1, keepdims=True)
                grad[np.arange(len(grad)), batch["y"]] -= 1
                w -= 0.05 * batch["x"].T @ grad / len(grad)
                b -= 0.05 * grad.mean(0)
    return recorder


def recall_at_k(ranked_ids, flipped) -> float:
    k = len(flipped)
    return len(set(list(ranked_ids)[:k]) & set(flipped.tolist())) / k


@pytest.mark.parametrize("rate", [0.1, 0.2])
def test_planted_flips_rank_first_and_the_rate_is_estimated(rate):
    x, given, truth, flipped = planted(rate)
    found = numpy_loop(x, given, LabelNoiseRecorder()).findings()
    ranked = [s["id"] for s in found["suspects"]]
    assert recall_at_k(ranked, flipped) >= 0.9
    assert abs(found["flagged"] - len(flipped)) < 0.2 * len(flipped)  # precision: few clean ones flagged
    est = found["noise_rate"]
    assert abs(est["estimate"] - rate) < 0.03 and est["low"] <= est["estimate"] <= est["high"]
    assert est["high"] - est["low"] < 0.1 and est["low"] <= rate <= est["high"]
    assert found["samples"] == N and found["max_records"] == EPOCHS
    # a suspect's predicted label is mostly the true one, its given label the flipped one
    top = found["suspects"][: len(flipped)]
    assert np.mean([s["predicted"] == truth[s["id"]] for s in top]) > 0.8
    assert all(s["given"] == given[s["id"]] for s in top)
    assert [s["score"] for s in found["suspects"]] == sorted(s["score"] for s in found["suspects"])
    json.dumps(found)  # JSON-able, as the report reads it


def test_clean_labels_give_a_low_rate_and_few_suspects():
    x, given, _, _ = planted(0.0)
    found = numpy_loop(x, given, LabelNoiseRecorder()).findings()
    assert found["noise_rate"]["estimate"] < 0.02 and found["flagged"] < 0.02 * N


def test_shuffled_margins_do_not_find_the_flips():
    """The detector's signal is the margins: recorded with unrelated outputs it finds nothing."""
    x, given, _, flipped = planted(0.1)
    recorder = LabelNoiseRecorder("logits")
    rng = np.random.default_rng(5)
    for _ in range(EPOCHS):
        recorder.record(np.arange(N), rng.normal(size=(N, CLASSES)), given)
    ranked = [s["id"] for s in recorder.findings(NoiseOptions(top=len(flipped)))["suspects"]]
    assert recall_at_k(ranked, flipped) < 0.3


def test_probabilities_give_the_margins_of_their_logits():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(50, 5)) * 3
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = rng.integers(0, 5, 50)
    a, b = LabelNoiseRecorder("logits"), LabelNoiseRecorder("auto")
    a.record(np.arange(50), logits, labels)
    b.record(np.arange(50), p, np.eye(5)[labels])  # one-hot labels too
    np.testing.assert_allclose(a.signals()["aum"], b.signals()["aum"], rtol=1e-9, atol=1e-9)
    manual = logits[np.arange(50), labels] - np.where(np.eye(5)[labels] == 1, -np.inf, logits).max(1)
    np.testing.assert_allclose(a.signals()["aum"], manual, atol=1e-9)


def test_a_sigmoid_column_is_two_classes():
    lp = log_probabilities(np.array([[0.9], [0.2]]), "auto")
    np.testing.assert_allclose(np.exp(lp), [[0.1, 0.9], [0.8, 0.2]])
    assert class_indices(np.array([[1.0], [0.0]]), 2, 2).tolist() == [1, 0]


def test_signals_average_over_the_times_a_sample_was_seen_in_any_order():
    recorder = LabelNoiseRecorder("logits")
    recorder.record([7, 2], [[2.0, 0.0], [0.0, 1.0]], [0, 0])
    recorder.record([2, 7], [[0.0, 3.0], [4.0, 0.0]], [0, 1])
    s = recorder.signals()
    assert s["id"].tolist() == [2, 7] and s["records"].tolist() == [2, 2]
    np.testing.assert_allclose(s["aum"], [(-1 - 3) / 2, (2 - 4) / 2])
    assert s["label_changed"].tolist() == [False, True]


def test_bad_input_is_refused_with_what_was_expected():
    recorder = LabelNoiseRecorder()
    with pytest.raises(ValueError, match="2 ids but outputs for 3 rows"):
        recorder.record([0, 1], np.zeros((3, 4)), [0, 1, 2])
    with pytest.raises(ValueError, match="class indices"):
        recorder.record([0, 1], np.zeros((2, 4)), [0, 9])
    recorder.record([0], np.zeros((1, 4)), [0])
    with pytest.raises(ValueError, match="3 classes, earlier batches had 4"):
        recorder.record([1], np.zeros((1, 3)), [0])
    with pytest.raises(ValueError, match="kind"):
        LabelNoiseRecorder("softmax")


def test_nothing_recorded_gives_empty_findings():
    assert LabelNoiseRecorder().findings() == {
        "suspects": [],
        "noise_rate": None,
        "threshold": None,
        "samples": 0,
        "max_records": 0,
    }


@pytest.mark.timeout(300)
def test_a_torch_loop_records_through_the_same_api():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    x, given, _, flipped = planted(0.1)
    model = torch.nn.Linear(DIM, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    recorder = LabelNoiseRecorder("logits")
    loader = sf.Loader(sf.ArraySource(x=x, y=given), 32, shuffle=True, seed=1, with_ids=True)
    with loader:
        for epoch in range(EPOCHS):
            loader.as_torch().set_epoch(epoch)
            for batch in loader.as_torch():
                logits = model(batch["x"])
                recorder.record(batch["id"].numpy(), logits.detach().numpy(), batch["y"].numpy())
                loss = torch.nn.functional.cross_entropy(logits, batch["y"])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    found = recorder.findings()
    assert recall_at_k([s["id"] for s in found["suspects"]], flipped) >= 0.9
    assert abs(found["noise_rate"]["estimate"] - 0.1) < 0.03
