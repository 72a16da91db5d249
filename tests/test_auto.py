"""`auto` follows the documented rule: the measured order for the device and mode, then declaration order."""
import pytest
import torch

import attn
from attn.registry import ATTENTION

BUILTIN = ["full", "sliding_window", "block_sparse", "linear"]


def expected(module, device, mode):
    """The rule of attn/attention/base.py, spelled out: auto_order first, reference only as a last resort."""
    measured = list(module.auto_order.get(f"{device}/{mode}", ()))
    order = measured + [b.name for b in module.backends if b.name not in measured]
    fast = [n for n in order if n != "reference" and module.backend_info(n).why_not(device, torch.float32, mode) is None]
    return fast[0] if fast else "reference"


@pytest.mark.parametrize("name", BUILTIN)
def test_auto_orders_name_real_backends(name):
    cls = ATTENTION.get(name).cls
    names = {b.name for b in cls.backends}
    for key, order in cls.auto_order.items():
        device, _, mode = key.partition("/")
        assert device in ("cpu", "cuda") and mode in ("forward", "backward", "decode"), key
        assert set(order) <= names and len(set(order)) == len(order), (key, order)


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("mode", ["forward", "backward", "decode"])
def test_auto_picks_by_the_rule_on_cpu(name, mode):
    m = attn.build_attention(name)
    assert m.select_backend("cpu", torch.float32, mode) == expected(m, "cpu", mode)


@pytest.mark.parametrize("name, mode, backend", [
    ("sliding_window", "forward", "flex"),  # measured: compiled flex beats blocked on the development CPU
    ("block_sparse", "forward", "flex"),  # measured: flex beats gathered
    ("linear", "forward", "chunked"),
    ("linear", "decode", "recurrent"),
    ("full", "forward", "sdpa"),  # no measured order: the first declared fast backend
])
def test_the_measured_cpu_choices(name, mode, backend):
    m = attn.build_attention(name)
    if m.backend_info(backend).why_not("cpu", torch.float32, mode) is not None:
        pytest.skip(f"{backend} cannot run here")
    assert m.select_backend("cpu", torch.float32, mode) == backend


def test_a_forward_call_records_the_backend_auto_chose():
    m = attn.build_attention("linear")
    q = k = v = torch.randn(1, 2, 100, 16)
    with torch.no_grad():
        m(q, k, v)
        assert m.last_backend == expected(m, "cpu", "forward") == "chunked"
        m(q[:, :, -1:], k, v)  # one query after a prefix: decoding
        assert m.last_backend == expected(m, "cpu", "decode") == "recurrent"


def test_a_variant_without_a_measured_order_keeps_declaration_order():
    class Plain(attn.Attention):
        name = "plain"
        backends = (
            attn.attention.base.Backend("reference", {"cpu": attn.attention.base.ALL_MODES}),
            attn.attention.base.Backend("slow", {"cpu": attn.attention.base.ALL_MODES}),
            attn.attention.base.Backend("fast", {"cpu": attn.attention.base.ALL_MODES}),
        )

    assert Plain(None).select_backend("cpu", torch.float32, "forward") == "slow"
    Plain.auto_order = {"cpu/forward": ("fast",)}
    assert Plain(None).select_backend("cpu", torch.float32, "forward") == "fast"
    assert Plain(None).select_backend("cpu", torch.float32, "decode") == "slow"


@pytest.mark.parametrize("order, why", [({"cpu/train": ("fast",)}, "backward"), ({"cpu/forward": ("fats",)}, "unknown")])
def test_a_bad_auto_order_is_refused_at_registration(order, why):
    from dataclasses import dataclass

    from attn.attention.base import ALL_MODES, Backend
    from attn.registry import Registry

    @dataclass(frozen=True)
    class Cfg:
        pass

    class Bad(attn.Attention):
        backends = (Backend("reference", {"cpu": ALL_MODES}), Backend("fast", {"cpu": ALL_MODES}))
        auto_order = order

    with pytest.raises(TypeError, match=why):
        Registry("attention variant", base="attn.attention.base.Attention").register("bad", Cfg)(Bad)


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("mode", ["forward", "backward", "decode"])
def test_list_shows_the_order_auto_tries(name, mode):
    """`attn-bench list`'s "auto tries" line is the order select_backend follows: its first runnable entry runs."""
    m = attn.build_attention(name)
    order = type(m).auto_orders()[f"cpu/{mode}"]
    runnable = [n for n in order if m.backend_info(n).why_not("cpu", torch.float32, mode) is None]
    assert order[-1] == "reference"
    assert m.select_backend("cpu", torch.float32, mode) == runnable[0]


def test_auto_falls_back_to_the_reference_wherever_it_is_listed():
    """A plugin listing a CUDA-only fast backend first, and its reference second, still runs on CPU."""
    from dataclasses import dataclass

    from attn.attention.base import ALL_MODES, Backend

    @dataclass(frozen=True)
    class Cfg:
        pass

    class CudaFirst(attn.Attention):
        backends = (Backend("fast", {"cuda": ALL_MODES}), Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}))

        def backend_fast(self, q, k, v, causal):
            raise AssertionError("not on CPU")

        def backend_reference(self, q, k, v, causal):
            return v

    try:
        attn.register_attention("test_cuda_first", config=Cfg)(CudaFirst)
        m = attn.build_attention("test_cuda_first")
        q = torch.randn(1, 2, 8, 4)
        m(q, q, q)
        assert m.last_backend == "reference"
        assert CudaFirst.auto_orders()["cpu/forward"] == ["reference"]
    finally:
        ATTENTION.unregister("test_cuda_first")


def test_declarations_are_checked_when_registered():
    from dataclasses import dataclass

    from attn.attention.base import ALL_MODES, Backend

    @dataclass(frozen=True)
    class Cfg:
        window: int = 256

    @dataclass(frozen=True)
    class BadDefault:
        window: int = "256"  # what a user wrote, and list and the sweep used to accept

    class NoMethod(attn.Attention):
        backends = (Backend("reference", {"cpu": ALL_MODES}), Backend("fast", {"cpu": ALL_MODES}))

        def backend_reference(self, q, k, v, causal):
            return v

    class Fine(NoMethod):
        def backend_fast(self, q, k, v, causal):
            return v

    with pytest.raises(TypeError, match=r"backend\(s\) fast without a method: write def backend_fast"):
        attn.register_attention("test_no_method", config=Cfg)(NoMethod)
    with pytest.raises(TypeError, match=r"'window' is declared int but its default is '256' \(str\)"):
        attn.register_attention("test_bad_default", config=BadDefault)(Fine)
    assert "test_no_method" not in ATTENTION.names() and "test_bad_default" not in ATTENTION.names()
