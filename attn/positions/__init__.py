"""Position methods; importing this package registers the built-in ones."""
from attn.positions import none  # noqa: F401
from attn.positions.base import Position

__all__ = ["Position"]
