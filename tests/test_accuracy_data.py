"""Accuracy task generators: deterministic per seed, answers recoverable, train/test disjoint, shapes as asked."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.accuracy import lm, mqar, passkey
from harness.accuracy.common import IGNORE, split_of
from harness.accuracy.stats import mean_ci, wilson

# -- MQAR ------------------------------------------------------------------------------------


@given(length=st.integers(12, 96), pairs=st.integers(1, 4), gap_frac=st.floats(0, 1), seed=st.integers(0, 10**6),
       split=st.sampled_from(["train", "test"]))
def test_mqar_layout_and_answers_recoverable(length, pairs, gap_frac, seed, split):
    gap = int(gap_frac * (length - 3 * pairs))
    x, y = mqar.generate(5, length, pairs, gap, split, seed, num_keys=16)
    assert x.shape == y.shape == (5, length)
    kv_start = length - 3 * pairs - gap
    for seq, tgt in zip(x.tolist(), y.tolist(), strict=True):
        scored = [t for t in range(length) if tgt[t] != IGNORE]
        assert scored == list(range(length - pairs, length))  # the queries close the sequence
        keys = seq[kv_start : kv_start + 2 * pairs : 2]
        assert len(set(keys)) == pairs and all(1 <= k <= 16 for k in keys)
        assert sorted(seq[t] for t in scored) == sorted(keys)  # every key queried once
        for t in scored:
            first = seq.index(seq[t])  # the key's pair comes before its query
            assert first - kv_start == 2 * keys.index(seq[t])
            assert tgt[t] == seq[first + 1]  # the answer is the value stored with the key
            assert 17 <= tgt[t] <= 32  # values have their own tokens
            assert t - first >= gap + 2  # the gap is at least what was asked
        assert all(v == mqar.FILLER for i, v in enumerate(seq) if i < kv_start or kv_start + 2 * pairs <= i < length - pairs)
        mapping = np.stack([keys, seq[kv_start + 1 : kv_start + 2 * pairs : 2]]).astype(np.int64)
        assert split_of(mapping.tobytes()) == split


def test_mqar_is_deterministic_per_seed_and_differs_across_seeds():
    a = mqar.generate(8, 64, 4, None, "train", 3)
    b = mqar.generate(8, 64, 4, None, "train", 3)
    c = mqar.generate(8, 64, 4, None, "train", 4)
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    task = mqar.MQAR(mqar.MQARConfig(num_pairs=4, num_keys=16))
    assert torch.equal(task.train_batch(0, 5, 4, 32)[0], task.train_batch(0, 5, 4, 32)[0])
    assert not torch.equal(task.train_batch(0, 5, 4, 32)[0], task.train_batch(0, 6, 4, 32)[0])


def test_mqar_train_and_test_mappings_are_disjoint():
    def mappings(split):
        x, _ = mqar.generate(400, 16, 2, 0, split, 0, num_keys=4)  # tiny space: 12 key pairs x 16 value pairs
        return {tuple(r[10:14]) for r in x.tolist()}  # the pairs: 16 - 3 * 2 = 10 filler tokens first

    train, test = mappings("train"), mappings("test")
    assert train and test and not train & test


def test_mqar_cells_fit_their_length():
    task = mqar.MQAR(mqar.MQARConfig(num_pairs=4, num_keys=32))
    cells = task.cells(64, [64, 128])
    assert {c["num_pairs"] for c in cells} == {4, 8, 16}
    for c in cells:
        assert c["eval_len"] >= 3 * c["num_pairs"] + c["gap"]
        assert c["gap"] == mqar.resolve_gap(c["gap_rule"], c["eval_len"], c["num_pairs"])
    assert {c["gap"] for c in cells if c["eval_len"] == 128 and c["num_pairs"] == 4} == {0, 58, 116}
    with pytest.raises(ValueError, match="too short"):
        task.check(8, [64])


# -- passkey ---------------------------------------------------------------------------------


@given(length=st.integers(passkey.overhead(5), 400), depth=st.floats(0, 1), seed=st.integers(0, 10**6),
       split=st.sampled_from(["train", "test"]))
def test_passkey_layout_depth_and_answer(length, depth, seed, split):
    x, y, keys = passkey.generate(3, length, depth, split, seed)
    assert x.shape == (3, length)
    filler_len = length - passkey.overhead(5)
    for row, tgt, key in zip(x.tolist(), y.tolist(), keys, strict=True):
        text = bytes(row).decode("ascii")
        assert len(key) == 5 and split_of(key.encode()) == split
        assert text.endswith(passkey.QUESTION + key)
        # the key sentence sits after round(depth * filler) filler bytes
        at = text.index("The pass key is ")
        assert at == round(depth * filler_len)
        assert text[at + len("The pass key is ") :].startswith(key + ".")
        # scored targets are exactly the answer digits, predicted from the byte before each
        scored = [t for t in range(length) if tgt[t] != IGNORE]
        assert scored == list(range(length - 6, length - 1))
        assert bytes(tgt[t] for t in scored).decode() == key


def test_passkey_training_targets_are_the_two_predictable_copies_of_the_key():
    x, y, keys = passkey.generate(4, 200, None, "train", 3, targets="retrieval")
    for row, tgt, key in zip(x.tolist(), y.tolist(), keys, strict=True):
        scored = [t for t in range(200) if tgt[t] != IGNORE]
        assert bytes(tgt[t] for t in scored).decode() == key + key  # the repeat in the key sentence, then the answer
        text = bytes(row).decode()
        assert text[scored[0] - len("Remember it.") : scored[0] + 1] == "Remember it. "
        assert all(tgt[t] == row[t + 1] for t in scored)


def test_passkey_is_deterministic_and_keys_disjoint():
    a = passkey.generate(50, 128, None, "train", 7)
    assert torch.equal(a[0], passkey.generate(50, 128, None, "train", 7)[0])
    train = set(passkey.generate(300, 128, 0.5, "train", 1, digits=2)[2])
    test = set(passkey.generate(300, 128, 0.5, "test", 1, digits=2)[2])
    assert train and test and not train & test
    with pytest.raises(ValueError, match="too short"):
        passkey.Passkey().check(50, [128])


# -- lm --------------------------------------------------------------------------------------


def corpus_dir(tmp_path, n=12, size=600):
    rng = np.random.default_rng(0)
    for i in range(n):
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta"], size // 5))
        (tmp_path / f"f{i}.txt").write_text(f"file {i}: {words}\n")
    return tmp_path


def test_lm_split_by_file_is_disjoint_and_deterministic(tmp_path):
    d = corpus_dir(tmp_path)
    files = lm.corpus_files([str(d)])
    c = lm.load_corpus((str(d),), 0.3)
    assert c.split_by == "file" and c.num_files == 12
    test_names = [n for n, _ in files if split_of(n.encode(), 0.3) == "test"]
    test_bytes = lm.SEPARATOR.join((d / n).read_bytes() for n in test_names)
    assert c.test.tobytes() == test_bytes  # the test stream is exactly the test files
    for n in test_names:  # and no test file's text is in the training stream
        assert (d / n).read_bytes() not in c.train.tobytes()


def test_lm_windows_tile_the_same_bytes_at_every_length(tmp_path):
    task = lm.LM(lm.LMConfig(corpus=(str(corpus_dir(tmp_path, n=3, size=3000)),), eval_bytes=512))
    cells = task.cells(32, [32, 64, 128])
    scored = cells[0]["scored_bytes"]
    assert scored % 128 == 0 and scored >= 512
    for c in cells:
        w = task.windows(c["eval_len"], c["scored_bytes"])
        assert w.shape == (scored // c["eval_len"], c["eval_len"] + 1)
        assert torch.equal(w[:, 1:].flatten(), torch.from_numpy(task.corpus.test[1 : scored + 1].astype(np.int64)))
    x, y = task.train_batch(0, 3, 4, 32)
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])


def test_lm_single_file_corpus_splits_inside_the_file(tmp_path):
    (tmp_path / "one.txt").write_text("x" * 1000)
    c = lm.load_corpus((str(tmp_path / "one.txt"),), 0.1)
    assert c.split_by == "bytes" and len(c.test) == 100 and len(c.train) == 900


def test_lm_default_corpus_is_the_stdlib():
    files = lm.corpus_files([])
    names = {n for n, _ in files}
    assert "os.py" in names and all(n.endswith(".py") for n in names)
    assert not any("site-packages" in n for n in names)


# -- stats -----------------------------------------------------------------------------------


def test_wilson_known_values():
    # Wilson (1927) / Newcombe (1998) worked examples: 0/10 and 5/10 at 95 %
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)  # Newcombe's example 81/263


@given(n=st.integers(1, 500), frac=st.floats(0, 1), conf=st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_wilson_bounds_solve_the_score_equation(n, frac, conf):
    """The Wilson bounds are the p with |p_hat - p| = z sqrt(p (1 - p) / n)."""
    from statistics import NormalDist

    k = round(frac * n)
    z = NormalDist().inv_cdf(0.5 + conf / 2)
    p_hat = k / n
    for p in wilson(k, n, conf):
        assert 0.0 <= p <= 1.0
        assert abs(p_hat - p) == pytest.approx(z * math.sqrt(p * (1 - p) / n), abs=1e-9)


def test_mean_ci_t_interval():
    m = mean_ci([1.0, 2.0, 3.0])
    # mean 2, sd 1, t_{0.975, 2} = 4.302653 -> half-width 4.302653 / sqrt(3)
    assert m.value == 2.0 and m.n == 3
    assert m.ci_high - 2.0 == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert mean_ci([5.0]).ci_low is None
