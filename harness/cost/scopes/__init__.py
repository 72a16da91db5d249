"""The cost scopes, one file each, registered with :func:`harness.cost.cells.register_scope` as ``attn`` registers
variants: ``op`` (the attention call alone), ``model`` (the shared backbone), ``hf`` (a transformers model). A new
scope is one file here with a :class:`~harness.cost.cells.Scope` subclass, plus its import below."""
from harness.cost.scopes import op, model, hf  # noqa: F401, I001  (registers them in this order: --scope's valid list)
