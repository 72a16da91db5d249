"""attn: attention variants, position methods and the shared Transformer backbone."""
from attn import attention, positions  # noqa: F401  (registers the built-ins)
from attn.attention.base import Attention, Backend, UnsupportedBackend
from attn.attention.state import KVCache
from attn.model import PRESETS, DecodeState, Transformer, TransformerConfig
from attn.patterns import PATTERNS, list_patterns, parse_pattern
from attn.positions.base import Position
from attn.registry import (
    build_attention,
    build_position,
    list_attention,
    list_positions,
    load_plugin,
    parse_spec,
    plugin_errors,
    register_attention,
    register_position,
    resolve_variant,
)

__version__ = "0.1.0"

__all__ = [
    "Attention", "Backend", "DecodeState", "KVCache", "PRESETS", "Position", "Transformer",
    "TransformerConfig", "UnsupportedBackend", "build_attention", "build_position", "list_attention",
    "list_positions", "load_plugin", "parse_spec", "plugin_errors", "register_attention",
    "register_position", "resolve_variant", "__version__", "PATTERNS", "list_patterns", "parse_pattern",
]
