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
    e.g. eager attention weights: AssertionError, NotImplementedError), and so is one that needs a part this checkpoint
    has nowhere (:func:`needs_a_part`); anything else (running out of memory, a bug) stays the error it is: an error
    cell runs again on resume, an ``unsupported`` one never."""
    from attn.attention.base import UnsupportedBackend

    if is_oom(err) or not (isinstance(err, (AssertionError, NotImplementedError)) or needs_a_part(err)):
        return err
    return UnsupportedBackend(one_line(f"press {label} cannot run here: {type(err).__name__}: {err or 'assertion failed'}"))


def needs_a_part(err: BaseException) -> bool:
    """kvpress fetches some presses' parts from the Hugging Face Hub by the model's name (QFilter's filters,
    ExpectedAttention's statistics, Fast-KVzip's gates) and keeps LU-KV's budget curves for a few named models: offline,
    or for a local checkpoint whose path is no repository name, they are not there, however often it is tried."""
    from huggingface_hub import errors

    hub = (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled, errors.HFValidationError,
           errors.RepositoryNotFoundError)
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, hub) or (isinstance(seen, KeyError) and "LU-KV budget curve" in str(seen)):
            return True
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)  # the chain a traceback shows
    return False


__all__ = ["needs_a_part", "parse_presses", "press_refusal"]
