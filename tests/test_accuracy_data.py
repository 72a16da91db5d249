"""Accuracy task generators: deterministic per seed, answers recoverable, train/test disjoint, shapes as asked."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.accuracy.common import IGNORE, split_of
from harness.accuracy.stats import cluster_se, clustered_accuracy, mean_ci, summarize, wilson
from harness.accuracy.tasks import lm, mqar, passkey

# -- MQAR ------------------------------------------------------------------------------------


def zoology(**kw):
    return mqar.MQARConfig(**{"vocab_size": 64, **kw})


@given(half_len=st.integers(4, 48), pairs=st.integers(1, 12), vocab=st.sampled_from([32, 64, 512]),
       seed=st.integers(0, 10**6), split=st.sampled_from(["train", "test"]), noise=st.booleans())
def test_mqar_follows_zoology_rules_and_answers_are_recoverable(half_len, pairs, vocab, seed, split, noise):
    length = 2 * half_len
    pairs = min(pairs, length // 4, vocab // 2 - 1)
    cfg = zoology(vocab_size=vocab, random_non_queries=noise)
    x, y = mqar.generate(5, length, split, seed, cfg, num_pairs=pairs)
    assert x.shape == y.shape == (5, length)
    half = vocab // 2
    for seq, tgt in zip(x.tolist(), y.tolist(), strict=True):
        keys, values = seq[0:2 * pairs:2], seq[1:2 * pairs:2]
        assert len(set(keys)) == pairs and all(1 <= k < half for k in keys)  # keys: lower half, no repeats
        assert len(set(values)) == pairs and all(half <= v < vocab for v in values)  # values: upper half, no repeats
        scored = [t for t in range(length) if tgt[t] != IGNORE]
        assert len(scored) == pairs and all(t >= 2 * pairs and (t - 2 * pairs) % 2 == 0 for t in scored)  # even slots
        answer = dict(zip(keys, values, strict=True))  # a plain program recovers every answer from the context
        assert sorted(seq[t] for t in scored) == sorted(keys) and all(tgt[t] == answer[seq[t]] for t in scored)
        if not noise:
            assert all(v == 0 for t, v in enumerate(seq) if t >= 2 * pairs and t not in scored)
        pair_set = sorted(zip(keys, values, strict=True))
        assert split_of(np.array(pair_set, dtype=np.int64).T.copy().tobytes()) == split


def test_mqar_split_depends_on_the_set_of_pairs_not_their_order():
    keys, values = np.array([5, 2, 9]), np.array([40, 33, 50])
    for perm in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        order = np.argsort(keys[perm])
        assert (np.stack([keys[perm][order], values[perm][order]]) == np.stack([[2, 5, 9], [33, 40, 50]])).all()
    # and the generator's examples of one split never hold a pair set of the other
    def sets(split):
        x, _ = mqar.generate(300, 8, split, 0, zoology(vocab_size=10), num_pairs=2)  # 4 keys x 5 values: a tiny space
        return {frozenset(zip(r[0:4:2], r[1:4:2], strict=True)) for r in x.tolist()}

    train, test = sets("train"), sets("test")
    assert train and test and not train & test


def test_mqar_query_gaps_follow_the_power_law():
    """Zoology's p_i ~ i^(a-1): with a = 0.01 the first slot holds ~1/H_space of the mass of a harmonic series."""
    cfg = zoology(vocab_size=4096, power_a=0.01)
    x, y = mqar.generate(3000, 64, "train", 1, cfg, num_pairs=1)
    slots = ((y != IGNORE).nonzero()[:, 1] - 2) // 2  # the query's slot: 0 .. 30
    observed = np.bincount(slots.numpy(), minlength=31) / len(slots)
    expected = mqar.gap_probabilities(31, 0.01)
    assert abs(observed - expected).max() < 0.03, (observed[:4], expected[:4])
    assert expected[0] > 5 * expected[-1]  # far queries are rare but present
    uniform = mqar.generate(3000, 64, "train", 1, zoology(vocab_size=4096, power_a=1.0), num_pairs=1)[1]
    u = np.bincount((((uniform != IGNORE).nonzero()[:, 1] - 2) // 2).numpy(), minlength=31) / 3000
    assert abs(u - 1 / 31).max() < 0.03


def test_mqar_is_deterministic_per_seed_and_scales_pairs_with_length():
    cfg = zoology()
    a, b, c = (mqar.generate(8, 64, "train", s, cfg) for s in (3, 3, 4))
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True)) and not torch.equal(a[0], c[0])
    assert ((a[1] != IGNORE).sum(1) == 4).all()  # 64 / 16 pairs
    task = mqar.MQAR(cfg)
    assert [c["num_pairs"] for c in task.cells(64, [64, 128])] == [4, 8]
    assert torch.equal(task.train_batch(0, 5, 4, 32)[0], task.train_batch(0, 5, 4, 32)[0])
    with pytest.raises(ValueError, match="even"):
        task.check(63, [63])
    with pytest.raises(ValueError, match="need length >= 32"):
        mqar.MQAR(zoology(num_pairs=8)).check(30, [30])


def test_mqar_baseline_is_what_a_random_context_value_scores():
    """The reported in-context baseline equals a plain simulation of 'answer a random value from the context'."""
    cfg = zoology(vocab_size=32)
    task = mqar.MQAR(cfg)
    cell = task.cells(64, [64])[0]
    x, y = task.test_set(64)
    rng = np.random.default_rng(0)
    hits = total = 0
    for seq, tgt in zip(x.tolist(), y.tolist(), strict=True):
        values = seq[1:8:2]
        for t in (t for t in range(64) if tgt[t] != IGNORE):
            hits += sum(rng.choice(values) == tgt[t] for _ in range(200))
            total += 200
    assert cell["baseline"] == pytest.approx(0.25) and hits / total == pytest.approx(cell["baseline"], abs=0.01)
    assert cell["chance"] == pytest.approx(1 / 16)


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
    task = lm.LM(lm.LMConfig(corpus=(str(corpus_dir(tmp_path, n=40, size=3000)),), eval_bytes=512))
    cells = task.cells(32, [32, 64, 128])
    scored = cells[0]["scored_bytes"]
    assert scored % 128 == 0 and scored >= 512 and {c["scored_bytes"] for c in cells} == {scored}
    starts = task.segments([32, 64, 128])
    assert len(starts) == scored // 128 and (np.diff(starts) >= 129).all()  # segments never overlap
    test = torch.from_numpy(task.corpus.test.astype(np.int64))
    want = torch.cat([test[s + 1 : s + 129] for s in starts.tolist()])  # every predicted byte of every segment
    for c in cells:
        w = task.windows(c["eval_len"], c["segment_bytes"], starts)
        assert w.shape == (scored // c["eval_len"], c["eval_len"] + 1)
        assert torch.equal(w[:, 1:].flatten(), want)  # the same bytes at every length
    x, y = task.train_batch(0, 3, 4, 32)
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])


def test_lm_scored_text_is_spread_over_the_test_files(tmp_path):
    """The scored segments reach the end of the test split (not only its first files), and scored_files counts
    the files they touch, checked against the test files' own spans."""
    task = lm.LM(lm.LMConfig(corpus=(str(corpus_dir(tmp_path, n=60, size=2000)),), test_fraction=0.5, eval_bytes=2048))
    test, starts = task.corpus.test, task.segments([256])
    assert starts[-1] + 257 > len(test) - 300  # the last segment sits at the end of the test split
    spans = [(s, s + len(d)) for s, d in zip(task.corpus.test_starts, bytes(test).split(lm.SEPARATOR), strict=True)]
    touched = {i for s in starts.tolist() for i, (a, b) in enumerate(spans) if a <= s + 256 and s < b + 1}
    assert task.cells(64, [64, 256])[0]["scored_files"] == len(touched) >= 8


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


def test_proportions_across_seeds_get_a_t_interval_clipped_to_0_1_and_marked():
    rows = [dict(task="mqar", metric="accuracy", value=v, seed=i, status="ok") for i, v in enumerate([1.0, 0.99, 0.93])]
    rows += [dict(task="lm", metric="bpb", value=v, seed=i, status="ok") for i, v in enumerate([1.0, 0.99, 0.93])]
    by = {r["metric"]: r for r in summarize(rows)}
    raw = mean_ci([1.0, 0.99, 0.93])
    assert raw.ci_high > 1.0  # the unclipped t interval leaves [0, 1] (the 1.0039 the issue found)
    assert by["accuracy"]["ci_high"] == 1.0 and by["accuracy"]["ci_low"] == pytest.approx(raw.ci_low)
    assert by["accuracy"]["ci_clipped"] and not by["bpb"]["ci_clipped"] and by["bpb"]["ci_high"] == pytest.approx(raw.ci_high)


@given(per=st.lists(st.tuples(st.integers(1, 8), st.floats(0, 1)), min_size=2, max_size=60))
def test_cluster_standard_error_equals_statsmodels(per):
    """The ratio estimator's sandwich variance is statsmodels' cluster-robust SE of an intercept-only OLS."""
    import numpy as np
    import statsmodels.api as sm

    totals = [m for m, _ in per]
    correct = [round(f * m) for m, f in per]
    y = np.concatenate([[1.0] * c + [0.0] * (m - c) for c, m in zip(correct, totals, strict=True)])
    groups = np.repeat(np.arange(len(totals)), totals)
    fit = sm.OLS(y, np.ones_like(y)).fit(cov_type="cluster", cov_kwds={"groups": groups, "use_correction": False})
    G = len(totals)
    assert cluster_se(correct, totals) == pytest.approx(float(fit.bse[0]) * math.sqrt(G / (G - 1)), rel=1e-9, abs=1e-12)


def test_clustered_interval_is_wider_than_treating_answers_as_independent():
    # 100 examples of 4 answers each, all-or-nothing: really 100 trials, not 400
    correct, totals = [4] * 70 + [0] * 30, [4] * 100
    m = clustered_accuracy(correct, totals)
    assert m.value == pytest.approx(0.7) and m.n == 100
    assert (m.ci_low, m.ci_high) == pytest.approx(wilson(70, 100), abs=1e-3)  # deff = 4 x G/(G-1): effective n = 99
    naive = wilson(280, 400)
    assert m.ci_high - m.ci_low > 1.9 * (naive[1] - naive[0])
    # independent answers (no clustering beyond chance): close to the plain Wilson interval
    rng = np.random.default_rng(0)
    ind = rng.random((2000, 4)) < 0.7
    m2 = clustered_accuracy(ind.sum(1).tolist(), [4] * 2000)
    w = wilson(int(ind.sum()), 8000)
    assert m2.ci_high - m2.ci_low == pytest.approx(w[1] - w[0], rel=0.1)
    # at 100 %: no collapse to a point; the examples count as the trials
    top = clustered_accuracy([4] * 50, [4] * 50)
    assert top.ci_high == 1.0 and top.ci_low == pytest.approx(wilson(50, 50)[0]) and top.ci_low < 1.0
