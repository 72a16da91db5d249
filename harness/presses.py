"""The press registry as the harness uses it, for cost and accuracy alike: a list of press specs validated into
:class:`attn.hf.presses.PressSpec` (kvpress's presses by name, ``none``, ``quantized``), and what a press that fails
inside a model becomes in a row. The mechanism (hooks, replay, caches, the row columns of a press and of its cache)
is :mod:`attn.hf.presses`."""
from __future__ import annotations

from collections.abc import Iterable

from attn.hf.presses import PressSpec, parse_press
from harness.messages import is_oom, one_line


def parse_presses(texts: Iterable[str], where: str = "--press") -> list[PressSpec]:
    """Press specs validated (ValueError, one line naming ``where``), duplicates dropped, in order."""
    out: list[PressSpec] = []
    for text in texts:
        try:
            spec = parse_press(text)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if spec not in out:
            out.append(spec)
    return out


def press_refusal(label: str, err: BaseException) -> BaseException:
    """A press that refuses a model or an attention is ``unsupported``, with its reason (kvpress asserts what it needs,
    e.g. eager attention weights: AssertionError, NotImplementedError); anything else (running out of memory, a bug)
    stays the error it is."""
    from attn.attention.base import UnsupportedBackend

    if is_oom(err) or not isinstance(err, (AssertionError, NotImplementedError)):
        return err
    return UnsupportedBackend(one_line(f"press {label} cannot run here: {type(err).__name__}: {err or 'assertion failed'}"))


__all__ = ["parse_presses", "press_refusal"]
