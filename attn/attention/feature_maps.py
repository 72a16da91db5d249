"""Feature maps phi for linear attention: phi(q) . phi(k) stands in for the softmax kernel.

- ``elu1``: elu(x) + 1, positive (Katharopoulos et al. 2020, "Transformers are RNNs", sec. 3.2).
- ``relu``: max(x, 0); a row can be all zero, which is why the normaliser is clamped.
- ``favor``: positive orthogonal random features (Choromanski et al. 2021, "Rethinking Attention
  with Performers", FAVOR+): E[phi(q) . phi(k)] = exp(q . k / sqrt(D)), the softmax kernel.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def elu1(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x).add_(1.0)  # in place: one pass fewer (elu's backward keeps its input, not its output)


def relu(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x)


ELEMENTWISE = {"elu1": elu1, "relu": relu}


def orthogonal_gaussian(num_features: int, dim: int, seed: int) -> torch.Tensor:
    """(num_features, dim) random projection with orthogonal rows in blocks of ``dim`` (Performer sec. 4.2).

    Each block is the Q of a Gaussian matrix; rows are rescaled by the norms of independent Gaussian
    vectors so every row is marginally N(0, I) (the estimator stays unbiased, its variance drops).
    Drawn on CPU in float64 from ``seed``: the same features on every device and run.
    """
    g = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(math.ceil(num_features / dim)):
        q, r = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
        # Without this sign fix QR's Q is not uniformly (Haar) distributed and the estimate is biased,
        # by ~5% even with 1M features (Mezzadri 2007, "How to generate random matrices from the classical groups").
        q = q * torch.sign(torch.diagonal(r))
        blocks.append(q.T)  # rows orthonormal
    w = torch.cat(blocks)[:num_features]
    norms = torch.randn(num_features, dim, generator=g, dtype=torch.float64).norm(dim=1)  # chi(dim)
    return w * norms[:, None]


def favor_logits(x: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """x: (..., D), projection: (m, D) -> (..., m) logits w . x' - |x'|^2 / 2 with x' = x D^(-1/4).

    Scaling both q and k by D^(-1/4) makes q' . k' = q . k / sqrt(D), so the features estimate
    softmax attention with the usual temperature. exp(logits) / sqrt(m) are the positive features.
    """
    x = x * x.shape[-1] ** -0.25
    return x @ projection.T - 0.5 * (x * x).sum(-1, keepdim=True)


def favor_features(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., m) logits -> (features (..., m), log scale (...)): features * exp(log scale) are the true ones.

    Each row is divided by its own largest feature (the Performer code's stabiliser), so nothing
    overflows; the log scale is returned, detached as in the paper, for the caller to carry. For
    queries it cancels between numerator and denominator and can be dropped; for keys it must be
    carried (see ``linear.py``: a running max, so no query ever depends on a later key).
    """
    m = logits.shape[-1]
    shift = logits.amax(-1).detach()
    return torch.exp(logits - shift[..., None]) * m**-0.5, shift


__all__ = ["ELEMENTWISE", "elu1", "favor_features", "favor_logits", "orthogonal_gaussian", "relu"]
