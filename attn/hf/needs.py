"""transformers, for the modules of :mod:`attn.hf` that need it. Each imports this first, so that a broken install
(an import that raises RuntimeError, OSError, ... -- a C extension built for another torch) is one ImportError saying
why, which every caller already handles as "transformers is not installed"."""
from __future__ import annotations

from attn.optional import require

INSTALL = "pip install 'attn-bench[hf]'"
transformers = require("transformers", INSTALL)

__all__ = ["INSTALL", "transformers"]
