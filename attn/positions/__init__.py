"""Position methods; importing this package registers the built-in ones."""
from attn.positions import alibi, learned, none, rope, rope_scaling, sinusoidal  # noqa: F401
from attn.positions.base import Position
from attn.positions.rope import Rotary

__all__ = ["Position", "Rotary"]
