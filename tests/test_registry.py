"""The registry: validation messages, duplicate names, plugins (file and broken), spec parsing."""
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attn
from attn.attention.base import ALL_MODES, Attention, Backend, UnsupportedBackend
from attn.registry import ATTENTION, Registry, parse_spec

ROOT = Path(__file__).resolve().parents[1]


def test_builtin_full_is_listed_with_backends_and_capabilities():
    spec = next(s for s in attn.list_attention() if s["name"] == "full")
    assert {b["name"] for b in spec["backends"]} >= {"reference", "sdpa", "xformers"}
    assert spec["causal"] and spec["bidirectional"] and spec["exact"]


def test_unknown_name_lists_registered():
    with pytest.raises(ValueError, match=r"unknown attention variant 'nope'; registered: .*full"):
        attn.build_attention("nope")


def test_unknown_param_names_valid_ones():
    with pytest.raises(ValueError, match=r"unknown parameter 'windw'.*valid: (none)|unknown parameter 'windw'"):
        attn.build_attention("full", windw=3)


def test_unknown_backend_lists_valid():
    with pytest.raises(ValueError, match=r"unknown backend 'cuda_magic'.*sdpa"):
        attn.build_attention("full", backend="cuda_magic")


@dataclasses.dataclass(frozen=True)
class _Cfg:
    n: int = 4
    x: float = 1.0
    flag: bool = False
    mode: "str" = "a"

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")


def _registry_with_toy() -> Registry:
    reg = Registry("toy")

    @reg.register("toy", config=_Cfg)
    class Toy:
        def __init__(self, config):
            self.config = config

    return reg


NOT_AN_INT = st.one_of(
    st.text(min_size=1).filter(lambda s: not re.fullmatch(r"\s*[-+]?[\d_]+\s*", s)),
    st.floats().filter(lambda f: not f.is_integer()),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


@given(NOT_AN_INT)
def test_ill_typed_int_is_rejected_naming_the_field(bad):
    reg = _registry_with_toy()
    with pytest.raises(ValueError, match=r"toy\.n must be an int"):
        reg.make_config("toy", {"n": bad})


@given(st.integers(max_value=0))
def test_out_of_range_names_field_and_rule(n):
    reg = _registry_with_toy()
    with pytest.raises(ValueError, match=r"n must be >= 1"):
        reg.make_config("toy", {"n": n})


@given(st.integers(min_value=1, max_value=10**6), st.floats(allow_nan=False, allow_infinity=False), st.booleans())
def test_string_params_from_the_command_line_are_coerced(n, x, flag):
    reg = _registry_with_toy()
    cfg = reg.make_config("toy", {"n": str(n), "x": repr(x), "flag": str(flag).lower()})
    assert (cfg.n, cfg.x, cfg.flag) == (n, x, flag)


def test_registering_twice_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        attn.register_attention("full", config=attn.attention.full.FullConfig)(type("X", (Attention,), {}))


def test_config_must_be_a_dataclass():
    with pytest.raises(TypeError):
        attn.register_attention("bad_cfg", config=dict)


def test_parse_spec():
    assert parse_spec("sliding_window:window=256,backend=flex") == ("sliding_window", {"window": "256", "backend": "flex"})
    assert parse_spec("full") == ("full", {})
    for bad in ["", ":window=3", "x:window", "x:a=1,a=2"]:
        with pytest.raises(ValueError):
            parse_spec(bad)


def test_readme_example_plugin_loads_runs_and_matches_full_for_huge_cap():
    assert attn.load_plugin(str(ROOT / "examples" / "softcap_attention.py"))
    try:
        m = attn.build_attention("softcap", cap=1e6)
        q, k, v = torch.randn(3, 1, 2, 37, 16).unbind(0)
        ref = attn.build_attention("full", backend="reference")
        torch.testing.assert_close(m(q, k, v), ref(q, k, v), atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match="cap must be > 0"):
            attn.build_attention("softcap", cap=0)
        # It plugs into the backbone like any built-in.
        model = attn.Transformer(attn.TransformerConfig.preset("tiny", attention="softcap"))
        assert model(torch.randint(0, 256, (1, 9))).shape == (1, 9, 256)
    finally:
        ATTENTION.unregister("softcap")


def test_readme_shows_the_tested_example():
    readme = (ROOT / "README.md").read_text()
    example = (ROOT / "examples" / "softcap_attention.py").read_text()
    assert example.strip() in readme, "README's 'add a variant' block must be examples/softcap_attention.py verbatim"


def test_broken_plugin_is_reported_and_others_still_work(tmp_path):
    bad = tmp_path / "broken_attn.py"
    bad.write_text("raise RuntimeError('kaboom')\n")
    assert not attn.load_plugin(str(bad))
    assert "kaboom" in attn.plugin_errors()[str(bad)]
    assert not attn.load_plugin(str(tmp_path / "missing.py"))
    assert "no such file" in attn.plugin_errors()[str(tmp_path / "missing.py")]
    assert attn.build_attention("full") is not None


def test_unsupported_backend_says_why():
    class CudaOnly(Attention):
        name = "cuda_only"
        backends = (Backend("fast", {"cuda": ALL_MODES}),)

    m = CudaOnly(config=None)
    with pytest.raises(UnsupportedBackend, match="needs CUDA"):
        m(*torch.randn(3, 1, 1, 4, 8).unbind(0))


def test_entry_point_plugin_is_loaded_lazily(tmp_path):
    pkg = tmp_path / "ep_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from dataclasses import dataclass\nimport attn\nfrom attn.attention.full import FullAttention\n"
        "@dataclass(frozen=True)\nclass C: pass\n"
        "@attn.register_attention('ep_full', config=C)\nclass EpFull(FullAttention): pass\n"
    )
    dist = tmp_path / "ep_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[attn.variants]\nep_full = ep_pkg\n")
    (dist / "RECORD").write_text("")
    code = "import attn; print([s['name'] for s in attn.list_attention()])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": ""}, check=True).stdout
    assert "ep_full" in out


def test_resolve_variant_types_the_spec_once_for_every_caller():
    v = attn.resolve_variant("sliding_window:window=64,sinks=4,backend=flex")
    assert (v.name, v.given, v.backend) == ("sliding_window", {"window": 64, "sinks": 4}, "flex")
    assert v.fields["window"] == 64 and v.fields["dilation"] == 1  # every field, defaults included
    assert attn.resolve_variant("full").backend == "auto"
    with pytest.raises(ValueError, match=r"unknown backend 'nope' for 'full' in 'full:backend=nope'; valid: auto, "):
        attn.resolve_variant("full:backend=nope")
    with pytest.raises(ValueError, match="unknown backend 'nope' for 'full'; valid: auto, "):
        attn.build_attention("full", backend="nope")  # the same check, where no spec text exists
    with pytest.raises(ValueError, match="window"):
        attn.resolve_variant("sliding_window:window=zero")
