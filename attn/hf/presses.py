"""KV-cache compression inside a transformers model: NVIDIA kvpress's presses by name, and quantized caches.

A press spec names what happens to a model's KV cache once the context is prefilled:

- ``none``: nothing (the uncompressed cache, the baseline);
- any kvpress press by its name and its parameters by their kvpress names: ``snapkv:compression_ratio=0.5``,
  ``streaming_llm:compression_ratio=0.75,n_sink=4``. The name is the class's without ``Press``, lower case, with
  ``attention`` and ``llm`` set apart by ``_`` (``streaming_llm``, ``expected_attention``), as kvpress's evaluation
  names them; ``attn-bench list`` shows them all with their parameters;
- ``quantized:nbits=4``: transformers' ``QuantizedCache`` on the quanto backend (``nbits`` 2 or 4, its
  ``q_group_size``, ``residual_length``, ``axis_key``, ``axis_value``), every token kept at fewer bits;
- ``oracle:compression_ratio=0.875``: the ceiling of any selector of that budget -- each head keeps, at every decoding
  step, the context keys of highest true attention weight (:mod:`attn.hf.oracle`);
- ``retrieval:retriever=bm25,compression_ratio=0.875``: the model reads only the context's chunks a retriever ranks
  best for the question, up to the budget (:mod:`attn.hf.retrieval`): not a press of kvpress's, an arm beside them.

The protocol is kvpress's pipeline (``KVPressTextGenerationPipeline``): the context is prefilled with the press's hook
on every attention layer, which compresses the layer's cache right after the layer wrote it; the question and the
answer are then decoded against the compressed cache, their positions continuing the context's (so RoPE sees the true
distance), greedily. A press that compresses while decoding (kvpress's ``DecodingPress``) keeps its hooks on then.

Replay (:mod:`attn.hf.replay`): a prefill's hidden states do not depend on the press -- each layer attends over all of
the context's keys, then the hook prunes what the *cache* keeps -- so one prefill, recorded (``Recorder``: each
attention layer's input and RoPE, and the keys it wrote), serves every press: each press gets a fresh cache filled
layer by layer with the recorded keys, and its own ``forward_hook`` called exactly as during a prefill. This holds for
presses that act through kvpress's standard hook (``BasePress.__call__``); the others run their own prefill inside
``with press(model)`` (``prefill_with``). Which does what is each arm's to say (:mod:`attn.hf.arms`).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import re
from dataclasses import dataclass
from typing import Any, get_type_hints

import torch

from attn.hf.oracle import ORACLE, Oracle
from attn.hf.retrieval import RETRIEVAL, Retrieval
from attn.optional import require, unavailable
from attn.specs import coerce, parse_spec, shorten

NONE = "none"
QUANTIZED = "quantized"
QUANTIZED_PARAMS: dict[str, tuple[type, Any]] = {  # transformers' QuantizedCache(backend="quanto") arguments
    "nbits": (int, 4), "q_group_size": (int, 64), "residual_length": (int, 128), "axis_key": (int, 0),
    "axis_value": (int, 0)}
OWN: dict[str, type] = {ORACLE: Oracle, RETRIEVAL: Retrieval}  # our own arms beside kvpress's presses
PARAMS: dict[str, dict[str, tuple[type, Any]]] = {  # parameter -> (type, default) of the presses not kvpress's
    QUANTIZED: QUANTIZED_PARAMS, ORACLE: {"compression_ratio": (float, 0.0)}, RETRIEVAL: Retrieval.PARAMS}
INSTALL = "pip install 'attn-bench[kv]' (kvpress, which pins transformers<5.3, and optimum-quanto)"


def press_name(cls_name: str) -> str:
    """kvpress's class name -> our name: ``StreamingLLMPress`` -> ``streaming_llm``, ``SnapKVPress`` -> ``snapkv``."""
    low = cls_name.removesuffix("Press").lower()
    return re.sub(r"_+", "_", re.sub(r"(attention|llm)", r"_\1_", low)).strip("_")


@functools.cache
def press_classes() -> dict[str, type]:
    """Our name -> kvpress press class, every concrete press kvpress exports (ImportError, saying why, if kvpress is
    not installed or its import fails in any way: :class:`attn.optional.Unavailable`)."""
    kvpress = require("kvpress", INSTALL)
    base, abstract = kvpress.BasePress, {kvpress.BasePress, kvpress.ScorerPress}
    found = {press_name(n): c for n in kvpress.__all__ if isinstance(c := getattr(kvpress, n), type)
             and issubclass(c, base) and c not in abstract}
    return dict(sorted(found.items()))


def _fields(cls: type) -> dict[str, tuple[Any, Any]]:
    """A press's settable parameters: name -> (type, default or MISSING), from its dataclass fields, or from its own
    ``__init__`` where it writes one (kvpress's CriticalKVPress takes ``press`` there, not as a field)."""
    hints = get_type_hints(cls)
    fields = {f.name: (hints.get(f.name, Any), f.default if f.default is not dataclasses.MISSING else (
        f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING))
        for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}
    own = {k: v for k, v in inspect.signature(cls).parameters.items()
           if not k.startswith("_") and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)}
    if set(own) == set(fields):
        return fields
    init = get_type_hints(cls.__init__)
    return {k: (init.get(k, Any), dataclasses.MISSING if v.default is v.empty else v.default) for k, v in own.items()}


def _spec_type(tp: Any) -> bool:
    """Whether a spec's ``k=v`` text can give a value of this type (a number, flag, string, or None of one)."""
    args = getattr(tp, "__args__", None)
    if args and type(None) in args:
        return all(_spec_type(a) for a in args if a is not type(None))
    return tp in (int, float, bool, str)


def _press_field(tp: Any) -> bool:
    """Whether a parameter of this type is another press (``AdaKVPress.press``, ``DecodingPress.base_press``: a
    ``ScorerPress | AdaKVPress``)."""
    args = getattr(tp, "__args__", None)
    if args:
        return all(_press_field(a) for a in args if a is not type(None))
    return isinstance(tp, type) and any(c.__name__ == "BasePress" for c in tp.__mro__)


def _wrapped_field(name: str) -> str:
    """The parameter through which a kvpress press takes the press it wraps ("": it wraps none)."""
    return next((k for k, (tp, _) in _fields(press_classes()[name]).items() if _press_field(tp)), "")


def _own(name: str) -> dict[str, Any]:
    return _fields(press_classes()[name]) if name in press_classes() else {}


def press_params(name: str) -> dict[str, Any]:
    """A press's parameters with their defaults (``<required>`` or ``<press>`` where a spec cannot set them)."""
    if name == NONE:
        return {}
    if name in PARAMS:
        return {k: d for k, (_, d) in PARAMS[name].items()}
    out = {}
    for k, (tp, default) in _fields(press_classes()[name]).items():
        out[k] = ("<required>" if default is dataclasses.MISSING else default) if _spec_type(tp) else "<press>"
    return out


def press_catalog() -> dict[str, dict[str, Any]]:
    """Every press spec name (``none``, ``quantized``, kvpress's) -> its parameters, for ``attn-bench list``."""
    names = [NONE, QUANTIZED, *OWN, *press_classes()]
    return {n: press_params(n) for n in names}


@dataclass(frozen=True)
class PressSpec:
    """A validated press spec: its name, the parameters it set (kvpress's defaults fill the rest) and, for a press that
    wraps another (``adakv(snapkv)``: AdaKV, ChunkKV, CriticalKV...), the press it wraps."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()
    inner: PressSpec | None = None

    @property
    def label(self) -> str:
        return (self.name + (f"({self.inner.label})" if self.inner else "")
                + (":" + ",".join(f"{k}={v}" for k, v in self.params) if self.params else ""))

    @property
    def all_params(self) -> dict[str, Any]:
        """Every parameter the press runs with (defaults included), as rows record them: a wrapper's own, the press it
        wraps (``press``) and that press's compression ratio, which is the wrapper's."""
        full = {k: v for k, v in press_params(self.name).items() if not str(v).startswith("<")}
        if self.inner is None:
            return {**full, **dict(self.params)}
        wraps = {"press": self.inner.label, "compression_ratio": self.inner.ratio}
        return {**full, **wraps, **dict(self.params)}

    def at(self, **params: Any) -> PressSpec:
        """This press with ``params`` set as numbers (a budget's ``compression_ratio``), as a spec given them would be:
        a budget sizes a press without writing a spec string and parsing it again. A wrapper's ratio is its press's."""
        if self.inner is not None and "compression_ratio" in params and "compression_ratio" not in _own(self.name):
            ratio = params.pop("compression_ratio")
            return dataclasses.replace(self, inner=self.inner.at(compression_ratio=ratio)).at(**params)
        return dataclasses.replace(self, params=tuple({**dict(self.params), **params}.items()))

    @property
    def ratio(self) -> float:
        """The requested compression ratio (fraction of the context's tokens removed): 0 for none and quantized."""
        return float(self.all_params.get("compression_ratio", 0.0) or 0.0)

    def build(self) -> Any:
        """The kvpress press (None for ``none`` and ``quantized``; ours for ``oracle`` and ``retrieval``)."""
        if self.name in (NONE, QUANTIZED):
            return None
        if self.name in OWN:
            return OWN[self.name](**dict(self.params))
        wraps = {} if self.inner is None else {_wrapped_field(self.name): self.inner.build()}
        return press_classes()[self.name](**wraps, **dict(self.params))

    def columns(self, query_aware: bool | None = None) -> dict[str, Any]:
        """What every row of this press says about it (cost and accuracy alike); ``query_aware``: the accuracy
        protocol's switch (None: a cost row, which has no question)."""
        cols = {"press": self.name, "press_spec": self.label,
                "press_params": json.loads(json.dumps(self.all_params, default=str)), "compression_ratio": self.ratio}
        if query_aware is not None:
            cols |= {"query_aware": query_aware, "press_protocol": "context compressed with the question" if query_aware
                     else "context compressed, then question and answer decoded against it"}
            if self.name == RETRIEVAL:  # a retriever reads the question by nature
                cols |= {"query_aware": True, "press_protocol": Retrieval.PROTOCOL}
        return cols

    def new_cache(self, config: Any) -> Any:
        """An empty cache of the kind this press decodes against (``QuantizedCache`` for ``quantized``)."""
        from transformers import DynamicCache, QuantizedCache

        if self.name == QUANTIZED:
            return QuantizedCache(backend="quanto", config=config, **dict(self.params))
        return DynamicCache()


def split_wrapped(text: str) -> tuple[str, str | None]:
    """``"adakv(snapkv:compression_ratio=0.5):alpha_safeguard=0.1"`` -> (``"adakv:alpha_safeguard=0.1"``,
    ``"snapkv:compression_ratio=0.5"``); a spec wrapping no press -> (itself, None). ValueError on unbalanced
    parentheses."""
    colon, paren = text.find(":"), text.find("(")
    if paren < 0 or (0 <= colon < paren):
        if "(" in text or ")" in text:
            raise ValueError(f"press {shorten(text)}: a wrapped press goes right after the name: adakv(snapkv)")
        return text, None
    depth = 0
    for i in range(paren, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            rest = text[i + 1:]
            if rest and not rest.startswith(":"):
                raise ValueError(f"press {shorten(text)}: parameters follow the wrapped press after ':'")
            return text[:paren] + rest, text[paren + 1:i]
    raise ValueError(f"press {shorten(text)}: unbalanced parentheses")


def parse_press(text: str) -> PressSpec:
    """``"snapkv:compression_ratio=0.5"`` -> a validated :class:`PressSpec`; ``"adakv(snapkv):alpha_safeguard=0.1"``: a
    press wrapping another (kvpress's AdaKV, ChunkKV, CriticalKV, the decoding wrappers: any whose parameter is a press).
    ValueError (one line) for an unknown press or parameter, a value of the wrong type, or one kvpress refuses;
    ImportError-worded ValueError without kvpress."""
    outer, wrapped = split_wrapped(text.strip())
    inner = None if wrapped is None else parse_press(wrapped)
    name, raw = parse_spec(outer)
    if inner is not None and (name in (NONE, QUANTIZED) or name in OWN):
        raise ValueError(f"press {name} wraps no press")
    if name == NONE:
        if raw:
            raise ValueError("press none takes no parameters")
        return PressSpec(NONE)
    if name == QUANTIZED:
        spec = PressSpec(QUANTIZED, _coerced(name, raw, {k: tp for k, (tp, _) in QUANTIZED_PARAMS.items()}))
        why = unavailable("optimum.quanto", INSTALL)
        if why is not None:
            raise ValueError(f"press quantized needs optimum-quanto: {why}")
        from transformers import LlamaConfig

        try:
            spec.new_cache(LlamaConfig(num_hidden_layers=1)).layers  # noqa: B018  (transformers checks nbits, axes)
        except (ValueError, ImportError) as e:
            raise ValueError(f"press {spec.label}: {e}") from None
        return spec
    if name in OWN:
        spec = PressSpec(name, _coerced(name, raw, {k: tp for k, (tp, _) in PARAMS[name].items()}))
        try:
            spec.build()
        except ValueError as e:
            raise ValueError(f"press {spec.label}: {e}") from None
        return spec
    try:
        classes = press_classes()
    except ImportError as e:
        raise ValueError(f"press {shorten(name)} needs kvpress: {e}") from None
    if name not in classes:
        raise ValueError(f"unknown press {shorten(name)}; valid: {NONE}, {QUANTIZED}, {', '.join([*OWN, *classes])} "
                         "(attn-bench list shows their parameters)")
    fields = _fields(classes[name])
    settable = {k: tp for k, (tp, _) in fields.items() if _spec_type(tp)}
    wraps = _wrapped_field(name)
    if inner is not None and not wraps:
        raise ValueError(f"press {name} wraps no press")
    missing = [k for k, (tp, d) in fields.items() if d is dataclasses.MISSING and k not in raw and k != (
        wraps if inner is not None else None)]
    if missing:
        if missing[0] == wraps:
            raise ValueError(f"press {name} wraps another press: give it one, {name}(snapkv)")
        raise ValueError(f"press {name} needs {missing[0]}=" if _spec_type(fields[missing[0]][0]) else
                         f"press {name} needs {missing[0]}=, which a press spec cannot give")
    spec = PressSpec(name, _coerced(name, raw, settable), inner)
    try:
        spec.build()
    except (AssertionError, ValueError, TypeError) as e:  # kvpress checks its parameters with assert
        raise ValueError(f"press {spec.label}: kvpress refuses it ({type(e).__name__}: {e or 'assertion failed'})"
                         ) from None
    return spec


def _coerced(name: str, raw: dict[str, str], types: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    unknown = [k for k in raw if k not in types]
    if unknown:
        raise ValueError(f"press {name} has no parameter {shorten(unknown[0])}; it takes {', '.join(types) or 'none'}")
    return tuple((k, coerce(v, types[k], f"press {name}: {k}")) for k, v in raw.items())


def language_model(model: Any) -> Any:
    return model.model.language_model if hasattr(model.model, "language_model") else model.model


def press_unsupported(variant: str, layer_specs: dict[str, str] | None, window: int | None = None) -> str | None:
    """Why presses cannot run on this setting (None: they can). A press prunes cache entries by content, so a variant
    that picks keys by their position (a window, blocks) would see the kept keys as if they were contiguous. A model
    with layer types runs presses on its own pattern (``window``: its sliding window): kvpress's rule for Gemma 3, the
    global layers pressed and the sliding ones left to their window (:func:`attn.hf.layers.window_layers`)."""
    from attn.hf.layers import own_pattern

    if layer_specs is not None:
        if own_pattern(layer_specs, window):
            return None
        return ("a model with layer types runs presses on its own pattern only (its sliding layers at the model's "
                "window, the others full): a press prunes by content what another window or pattern picks by position")
    if variant != "full":
        return (f"{variant} selects keys by position, and a press leaves the kept keys' positions behind (the cache "
                "holds them as if contiguous): presses compose with full only")
    return None


# -- what a compressed cache holds ------------------------------------------------------------------------------

def kept_tokens(cache: Any) -> list[int]:
    """Tokens each layer's cache holds (a quantized layer: all it has seen)."""
    return [int(cache.get_seq_length(i)) for i in range(len(cache.layers))]


def _nbytes(t: Any) -> int:
    if t is None or not isinstance(t, torch.Tensor):
        return 0
    if hasattr(t, "__tensor_flatten__") and type(t) is not torch.Tensor:  # quanto's packed tensors: their parts
        names, _ = t.__tensor_flatten__()
        return sum(_nbytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def layer_bytes(cache: Any) -> list[int]:
    """Bytes each layer's tensors hold: keys and values (a quantized layer: its packed data, scales and shifts, plus
    the full-precision residual it has not quantized yet)."""
    return [_nbytes(getattr(layer, "keys", None)) + _nbytes(getattr(layer, "values", None))
            + _nbytes(getattr(layer, "_quantized_keys", None)) + _nbytes(getattr(layer, "_quantized_values", None))
            for layer in cache.layers]


def cache_bytes(cache: Any) -> int:
    """Bytes the cache's tensors hold (:func:`layer_bytes`, summed)."""
    return sum(layer_bytes(cache))


def cache_columns(cache: Any) -> dict[str, Any]:
    """What a cache holds once pressed: tokens per layer (min, mean, max) and its bytes, as rows record them."""
    kept = kept_tokens(cache)
    return {"kv_tokens_min": min(kept), "kv_tokens_mean": sum(kept) / len(kept), "kv_tokens_max": max(kept),
            "kv_cache_bytes": cache_bytes(cache)}


__all__ = ["INSTALL", "NONE", "QUANTIZED", "PressSpec", "cache_bytes", "cache_columns", "kept_tokens", "language_model",
           "layer_bytes", "parse_press", "press_catalog", "press_classes", "press_name", "press_params",
           "press_unsupported"]
