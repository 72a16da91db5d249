"""The measured callables (FLOPs, decoding at a fixed context), peak memory, and the worker's RSS watchdog."""
from pathlib import Path

import pytest
import torch

from harness.cost import Cell, build, linear_weights, model_config
from harness.cost.timing import TimingConfig
from harness.cost.worker import Worker, WorkerConfig
from harness.memory import PeakMemory

PLUGIN = str(Path(__file__).resolve().parent / "plugins" / "misbehaving.py")


def cell(variant="full", mode="forward", scope="op", L=16, params=None, B=1, H=2, D=8, layers=None):
    return Cell(variant=variant, variant_params=params or {}, backend_requested="auto", position="none",
                position_params={}, scope=scope, mode=mode, device="cpu", dtype="float32", batch_size=B,
                num_heads=H, head_dim=D, seq_len=L, layers=layers if scope == "model" else None)


def causal_pairs(q_len, k_len):
    return sum(min(k_len, k_len - q_len + i + 1) for i in range(q_len))


@pytest.mark.parametrize("mode, factor, q_len, k_len", [("forward", 1, 16, 16), ("train", 3, 16, 16), ("decode", 1, 1, 17)])
def test_op_flops_follow_the_definition(mode, factor, q_len, k_len):
    B, H, D = 2, 2, 8
    m = build(cell(mode=mode, B=B, H=H, D=D))
    assert m.flops == factor * 4 * B * H * D * causal_pairs(q_len, k_len)
    assert m.tokens == (B if mode == "decode" else B * 16)


@pytest.mark.parametrize("mode", ["forward", "train", "decode"])
def test_model_flops_count_every_matmul(mode):
    c = cell(mode=mode, scope="model", L=16, H=2, D=8, layers=2)
    cfg = model_config(c)
    d, ff, V, n = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.n_layers
    weights = n * (3 * d * d + d * d + 2 * d * ff) + V * d  # qkv, out proj, FFN up/down; tied LM head
    tokens, (q_len, k_len) = (1, (1, 17)) if mode == "decode" else (16, (16, 16))
    attention = n * 4 * c.num_heads * c.head_dim * causal_pairs(q_len, k_len)
    factor = 3 if mode == "train" else 1
    m = build(c)
    assert m.flops == factor * (2 * tokens * weights + attention)
    assert linear_weights(torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))) == 25


@pytest.mark.parametrize("variant, params", [("full", {}), ("linear", {})])
def test_decode_steps_all_see_the_same_context(variant, params):
    """Rewinding after each timed step: every repeat decodes at the same cache length."""
    torch.manual_seed(0)
    m = build(cell(variant=variant, mode="decode", L=12, params=params))
    outs = [m.fn().clone() for _ in range(4)]
    assert m.state.length == 12
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0])


def test_rolling_cache_that_cannot_rewind_keeps_a_bounded_size():
    m = build(cell(variant="sliding_window", mode="decode", L=12, params={"window": 4}))
    for _ in range(5):
        m.fn()
    assert m.state.cached <= 3  # the window minus the new token: the step's cost cannot grow


def test_peak_memory_counts_what_is_allocated_after_the_baseline():
    mem = PeakMemory("cpu")
    junk = [torch.ones(1024) for _ in range(20_000)]  # ~80 MiB of small blocks, freed before the baseline
    del junk
    mem.baseline()
    mem.reset_peak()
    x = torch.ones(32 * 2**20 // 4)  # 32 MiB, written so it is resident
    peak = mem.peak()
    del x
    assert 31 * 2**20 <= peak <= 40 * 2**20


def test_rss_watchdog_kills_a_worker_past_the_limit():
    """Without the address-space cap (as on CUDA hosts), the parent's RSS watch still stops a hog."""
    hog = cell(variant="test_hog", params={"gib": 3.0})
    with Worker(WorkerConfig(mem_limit_bytes=256 * 2**20, plugins=(PLUGIN,), address_space_cap=False)) as w:
        result = w.run_cell(hog.as_row(), TimingConfig(0.01, 0.05), seed=0, time_limit_s=120)
        assert result["status"] == "oom" and "watchdog" in result["error"]
        assert w.proc is None  # killed: the next cell gets a fresh process


@pytest.mark.parametrize("device, restarted", [("cpu", False), ("cuda", True)])
def test_an_error_restarts_the_worker_only_on_cuda(device, restarted):
    """A CUDA error can be sticky (one illegal address fails every later call in that context), so on
    CUDA the next cell gets a fresh process; on CPU a raised error leaves the worker usable."""
    bad = cell(variant="test_raises")
    with Worker(WorkerConfig(device=device, plugins=(PLUGIN,), address_space_cap=False)) as w:
        result = w.run_cell(bad.as_row(), TimingConfig(0.01, 0.05), seed=0, time_limit_s=120)
        assert result["status"] == "error" and "deliberate failure" in result["error"]
        assert (w.proc is None) == restarted


@pytest.mark.parametrize("device, index", [("cuda", 0), ("cuda:1", 1)])
def test_the_worker_makes_its_cuda_device_current_with_an_index(monkeypatch, device, index):
    """torch refuses a bare "cuda" in set_device and set_per_process_memory_fraction; the worker passes
    an index, and makes the cell's device current so the timer synchronises the device that runs it."""
    from types import SimpleNamespace

    from harness.cost import child

    calls = []

    def needs_index(name):
        def call(*args):
            assert all(isinstance(a, (int, float)) for a in args), f"{name}{args}: torch needs an index"
            calls.append((name, *args))
        return call

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", needs_index("set_device"))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", needs_index("fraction"))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=8 * 2**30))
    assert child.claim_cuda_device(device, 2 * 2**30) == index
    assert calls == [("set_device", index), ("fraction", 0.25, index)]
