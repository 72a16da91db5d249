"""Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025, "Gated Delta Networks: Improving Mamba2 with Delta Rule",
arXiv:2412.06464): a decaying fast-weight memory written with the delta rule.

Per key head a state S (D_k x D_v); per token t, with alpha_t = exp(g_t) in (0, 1) and beta_t in (0, 1):

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,        o_t = D^-1/2 S_t^T q_t

i.e. decay the memory, then overwrite what it holds under k_t by v_t with strength beta_t: the write is
beta_t (v_t - alpha_t S_{t-1}^T k_t), the error of the memory's own read-out (the delta rule). q and k are
L2-normalised per head first (``qk_norm``), which keeps I - beta k k^T a contraction. In the backbone g_t = A_h dt_t,
Mamba-2's decay as the paper and fla's layer have it (decay_rate.py: A_h learned per key head, dt_t from the token),
and beta_t = sigmoid of a projection. Conventions are fla's
(``fla/ops/gated_delta_rule``: ``naive_recurrent_gated_delta_rule`` and ``chunk_gated_delta_rule`` with
``use_qk_l2norm_in_kernel=True``): the state in the (K, V) layout, the decay applied before the write, the scale
D^-1/2 on q, and l2norm(x) = x / sqrt(|x|^2 + 1e-6). With GQA a key head's state is read by its group of query heads.

Forms: the recurrence with an explicit (D x D) transition per token (``reference``: for the delta rule the
recurrence is the definition), the same recurrence as one rank-1 correction per token (``recurrent``, the decoding
path), and the chunkwise-parallel form (``chunked``: Yang et al. 2024, "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length", sec. 3, with the gates of the GDN paper, sec. 3.3): a (c x c) triangular solve per
chunk (the UT form of the WY representation) and one state update per chunk. ``fla`` runs flash-linear-attention's
Triton kernel. After the inputs everything runs in fp32 (fp64 for fp64 inputs) and the output is cast back.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attn.attention import gqa
from attn.attention.base import ALL_MODES, Backend, have_module, modes
from attn.attention.decay_rate import LogDecay
from attn.attention.linear import limit_fla_autotune
from attn.attention.matrix_state import MatrixState, MatrixStateAttention, compute_dtype
from attn.attention.token_inputs import TokenInput
from attn.registry import check, register_attention

L2_EPS = 1e-6  # fla's l2norm: x / sqrt(|x|^2 + eps)


@dataclass(frozen=True)
class GatedDeltaNetConfig:
    # L2-normalise q and k per head (fla's use_qk_l2norm_in_kernel). Without it the update diverges once
    # beta |k|^2 > 2 (an eigenvalue of I - beta k k^T below -1): the caller must keep keys short.
    qk_norm: bool = True
    # chunked backend: tokens per chunk, a (c x c) solve each; of 16/32/64/128, 32 was fastest at 2K and 16K on
    # the 2-core CPU (fla's kernel uses 64)
    chunk_size: int = 32

    def __post_init__(self) -> None:
        check(self.chunk_size >= 1, f"chunk_size must be >= 1, got {self.chunk_size}")


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """(..., D) -> unit vectors along D, as fla's kernel normalises q and k (eps keeps a zero vector finite)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


def _recurrent(q: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               S: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Token by token: decay, read the memory at k_t, write beta_t times the error (rank 1), read with q_t.

    q: (n, G, T, D) scaled queries (None: only absorb the tokens), k: (n, T, D), v: (n, T, D_v), g, beta: (n, T),
    S: (n, D, D_v), n = B H_kv -> out (n, G, T, D_v) and S. O(D D_v) a token; unbind, not indexing, so the backward
    is one stack rather than a zeroed full-length gradient per token.
    """
    outs = []
    qs = q.unbind(2) if q is not None else [None] * k.shape[1]
    for qt, kt, vt, at, bt in zip(qs, k.unbind(1), v.unbind(1), g.exp().unbind(1), beta.unbind(1), strict=True):
        S = S * at[:, None, None]
        err = torch.baddbmm(vt[:, None], kt[:, None], S, alpha=-1)  # (n, 1, D_v): v_t - S^T k_t
        S = torch.baddbmm(S, kt[:, :, None], bt[:, None, None] * err)
        if qt is not None:
            outs.append(torch.bmm(qt, S))  # (n, G, D_v)
    return (torch.stack(outs, 2) if q is not None else None), S


def _chunked(q: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             S: torch.Tensor, c: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Chunkwise parallel, the same shapes as :func:`_recurrent`; O(T c (c + D) + T D D_v) work.

    Inside a chunk with start state S0, Gamma_i = alpha_1 ... alpha_i (in the chunk) and the writes
    u_i = beta_i (v_i - alpha_i S_{i-1}^T k_i), unrolling S_{i-1} gives (I + A) U = beta V - beta Gamma K S0 with
    A_ij = beta_i (Gamma_i / Gamma_j) k_i . k_j for j < i: unit lower-triangular, so one solve gives
    U = U0 - W S0 for all chunks at once. Then, chunk after chunk (only matmuls):
    out_i = Gamma_i q_i S0 + sum_{j <= i} (Gamma_i / Gamma_j) (q_i . k_j) u_j and
    S = Gamma_c S0 + sum_j (Gamma_c / Gamma_j) k_j u_j^T. Decay ratios are exponentiated differences of log
    decays, masked before exp: strong decays underflow to 0, nothing overflows.
    """
    n, T, D = k.shape
    pad = -T % c  # padded tokens have beta = 0 and g = 0: the identity update; their outputs are dropped
    k, v, g, beta = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad)), F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    N = (T + pad) // c
    k, v, g, beta = k.reshape(n, N, c, D), v.reshape(n, N, c, -1), g.reshape(n, N, c), beta.reshape(n, N, c)
    gamma = g.cumsum(-1)  # (n, N, c) log Gamma_i
    below = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
    decay = torch.exp((gamma[..., :, None] - gamma[..., None, :]).masked_fill(~below, -math.inf))  # (n, N, c, c)
    A = (beta[..., None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    rhs = torch.cat([beta[..., None] * v, (beta * gamma.exp())[..., None] * k], -1)  # [beta V | beta Gamma K]
    U0, W = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True).split([v.shape[-1], D], -1)
    k_end = k * torch.exp(gamma[..., -1:] - gamma)[..., None]  # (n, N, c, D) key j decayed to the chunk's end
    a_end = gamma[..., -1].exp()  # (n, N)
    if q is None:
        for u0, w, ke, ae in zip(U0.unbind(1), W.unbind(1), k_end.unbind(1), a_end.unbind(1), strict=True):
            S = torch.baddbmm(ae[:, None, None] * S, ke.transpose(1, 2), torch.baddbmm(u0, w, S, alpha=-1))
        return None, S
    G = q.shape[1]
    q = F.pad(q, (0, 0, 0, pad)).reshape(n, G, N, c, D).transpose(1, 2)  # (n, N, G, c, D)
    q_start = (q * gamma.exp()[:, :, None, :, None]).flatten(2, 3)  # (n, N, G c, D) reads S0
    scores = ((q @ k[:, :, None].transpose(-1, -2)) * decay[:, :, None]).flatten(2, 3)  # (n, N, G c, c)
    outs = []
    for u0, w, ke, ae, qs, a in zip(U0.unbind(1), W.unbind(1), k_end.unbind(1), a_end.unbind(1), q_start.unbind(1),
                                    scores.unbind(1), strict=True):
        u = torch.baddbmm(u0, w, S, alpha=-1)  # (n, c, D_v) this chunk's writes
        outs.append(torch.baddbmm(torch.bmm(a, u), qs, S).view(n, G, c, -1))
        S = torch.baddbmm(ae[:, None, None] * S, ke.transpose(1, 2), u)
    return torch.stack(outs, 2).flatten(2, 3)[:, :, :T], S


@register_attention("gated_deltanet", config=GatedDeltaNetConfig)
class GatedDeltaNetAttention(MatrixStateAttention):
    """Gated DeltaNet: a decayed (D x D) memory per key head written with the delta rule; O(L D^2), causal only."""

    supports_bidirectional = False  # a recurrence: no query sees a later key
    supports_gqa = True  # one state per key head, read by its group of query heads
    exact = False  # not softmax attention
    output_norm = True  # the layer RMS-normalises each head's output (the paper's output norm)
    token_inputs = (
        TokenInput("g", width=1, layer=LogDecay,
                   doc="log decay per key head, g = A dt <= 0 (Mamba-2's, as fla's layer; A learned per key head)"),
        TokenInput("beta", width=1, activation=torch.sigmoid, doc="write strength per key head, in (0, 1)"),
    )
    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="the recurrence, explicit (D x D) transitions"),
        Backend("chunked", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="chunkwise parallel (WY/UT), O(L c D + L D^2)"),
        Backend("recurrent", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="token by token, rank-1 updates; decode path"),
        Backend(
            "fla",
            {"cuda": modes("forward", "backward")},
            dtypes=(torch.float32, torch.bfloat16, torch.float16),
            requires=have_module("fla.ops.gated_delta_rule",
                                 " (the kernels ship in fla-core: pip install 'attn-bench[gpu]')"),
            note="flash-linear-attention chunk_gated_delta_rule (Triton)",
        ),
    )
    # 2-core development CPU, B=1 H=4 D=64 fp32, blocked_autorange medians: at 2K forward chunked 10.8 ms vs
    # recurrent 39.5 ms, forward+backward 38.5 vs 271 ms; at 16K forward 134 vs 370 ms (the recurrence is a
    # Python loop per token). Decoding (one token on a carried state): the recurrence is one rank-1 update,
    # the chunked form would pad it to a chunk.
    auto_order = {"cpu/forward": ("chunked", "recurrent"), "cpu/backward": ("chunked", "recurrent"),
                  "cpu/decode": ("recurrent", "chunked"), "cuda/decode": ("recurrent", "chunked")}

    # -- inputs ---------------------------------------------------------------------------------
    def _queries(self, q: torch.Tensor, groups: int) -> torch.Tensor:
        """(B, H, T, D) -> (B H_kv, G, T, D) in the compute dtype, normalised and scaled by D^-1/2."""
        q = q.to(compute_dtype(q.dtype))
        q = l2norm(q) if self.config.qk_norm else q
        return (q * q.shape[-1] ** -0.5).flatten(0, 1).unflatten(0, (-1, groups))

    def _keys(self, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor):
        """k, v: (B, H_kv, T, D), g, beta: (B, H_kv, T, 1) -> (B H_kv, T, .) and (B H_kv, T), in the compute dtype."""
        cdt = compute_dtype(k.dtype)
        k, v, g, beta = (x.to(cdt).flatten(0, 1) for x in (k, v, g, beta))
        return (l2norm(k) if self.config.qk_norm else k), v, g[..., 0], beta[..., 0]

    def _run(self, q, k, v, g, beta, S, form):
        """q: (B, H, Tq, D) are the last Tq of the T tokens of k, v, g, beta; S: (B, H_kv, D, D_v) before them, or None.

        Returns out (B, H, Tq, D_v) in the compute dtype and the state after all T tokens. Keys before the first
        query (Lq < Lk, bottom-right) are absorbed by the chunked form whatever ``form`` is: the prefix is a state
        to build, as a prefill would (its outputs are never read).
        """
        B, H, Tq, _ = q.shape
        Hkv, p = k.shape[1], k.shape[2] - q.shape[2]
        k, v, g, beta = self._keys(k, v, g, beta)
        S = k.new_zeros(B * Hkv, k.shape[-1], v.shape[-1]) if S is None else S.to(k.dtype).flatten(0, 1)
        c = self.config.chunk_size
        if p:
            _, S = _chunked(None, k[:, :p], v[:, :p], g[:, :p], beta[:, :p], S, c)
        args = (self._queries(q, H // Hkv), k[:, p:], v[:, p:], g[:, p:], beta[:, p:], S)
        out, S = _chunked(*args, c) if form == "chunked" else _recurrent(*args)
        return out.reshape(B, H, Tq, -1), S.unflatten(0, (B, Hkv))

    # -- backends -------------------------------------------------------------------------------
    def backend_reference(self, q, k, v, causal, *, g, beta):
        """The paper's recurrence, each transition alpha_t (I - beta_t k_t k_t^T) a matrix: O(L D^3), obviously right."""
        dtype, (B, H, Lq, D), Lk = q.dtype, q.shape, k.shape[2]
        q = self._queries(q, H // k.shape[1])  # (B H_kv, G, Lq, D)
        k, v, g, beta = self._keys(k, v, g, beta)
        eye = torch.eye(D, dtype=k.dtype, device=k.device)
        S, outs = k.new_zeros(k.shape[0], D, v.shape[-1]), []
        for t in range(Lk):
            kt, vt, a, b = k[:, t, :, None], v[:, t, None, :], g[:, t, None, None].exp(), beta[:, t, None, None]
            S = a * (eye - b * kt @ kt.transpose(1, 2)) @ S + b * kt @ vt
            if t >= Lk - Lq:  # bottom-right: query i is position i + Lk - Lq
                outs.append(q[:, :, t - (Lk - Lq)] @ S)  # (B H_kv, G, D_v)
        return torch.stack(outs, 2).reshape(B, H, Lq, -1).to(dtype)

    def backend_chunked(self, q, k, v, causal, *, g, beta):
        return self._run(q, k, v, g, beta, None, "chunked")[0].to(q.dtype)

    def backend_recurrent(self, q, k, v, causal, *, g, beta):
        return self._run(q, k, v, g, beta, None, "recurrent")[0].to(q.dtype)

    def backend_fla(self, q, k, v, causal, *, g, beta):
        """fla's chunk kernel, fed (B, T, H, .) inputs in the inputs' dtype (g in fp32, as fla's layers pass it).

        fla's grouping is the other way round (more value than key heads), so k, v, g, beta are repeated to the
        query heads (G copies of each state). Keys before the queries become its fp32 initial state, built here
        by the chunked form. The kernel normalises q and k itself (``use_qk_l2norm_in_kernel``).
        """
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        limit_fla_autotune()
        dtype, groups, p = q.dtype, gqa.kv_groups(q, k), k.shape[2] - q.shape[2]
        kernel = dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32
        S0 = None
        if p:
            keys = self._keys(k[:, :, :p], v[:, :, :p], g[:, :, :p], beta[:, :, :p])
            S0 = keys[0].new_zeros(keys[0].shape[0], k.shape[-1], v.shape[-1])
            S0 = _chunked(None, *keys, S0, self.config.chunk_size)[1].unflatten(0, k.shape[:2])
            S0 = gqa.repeat_kv(S0, groups).float().contiguous()  # (B, H, D, D_v)
        rest = (gqa.repeat_kv(x[:, :, p:], groups).transpose(1, 2) for x in (k, v, g, beta))  # (B, Lq, H, .)
        k, v, g, beta = (x.to(kernel).contiguous() for x in rest)
        kwargs = dict(scale=q.shape[-1] ** -0.5, initial_state=S0, output_final_state=False,
                      use_qk_l2norm_in_kernel=self.config.qk_norm)
        if "head_first" in inspect.signature(chunk_gated_delta_rule).parameters:  # fla < 0.4 had a (B, H, T, K) mode
            kwargs["head_first"] = False
        o, _ = chunk_gated_delta_rule(q.transpose(1, 2).to(kernel).contiguous(), k, v,
                                      g[..., 0].float().contiguous(), beta[..., 0].contiguous(), **kwargs)
        return o.transpose(1, 2).to(dtype)

    # -- cost -----------------------------------------------------------------------------------
    def flops(self, batch: int, heads: int, q_len: int, k_len: int, head_dim: int, causal: bool = True,
              kv_heads: int | None = None) -> int:
        """Useful FLOPs of one call in the recurrent form, 2 per MAC (D_k = D_v = D); linear in length, not L^2.

        Per key, on its key head's state: the decay alpha S, D^2; the read S^T k, 2 D^2; the error beta (v - S^T k),
        2 D; the write S + k u^T, 2 D^2; exp(g), 1; and with ``qk_norm`` k's L2 norm, 3 D (squares and sum 2 D,
        the division D; the root not counted). Per query, on each query head: q's norm (3 D) if ``qk_norm``, the
        scale D, the read S^T q, 2 D^2. The chunked form's triangular solve and intra-chunk products are
        implementation costs, not counted. A call starts from an empty state, so all ``k_len`` keys are
        absorbed (once per key head, ``kv_heads``); a decoding step absorbs one (see :meth:`mode_flops`).
        """
        D, norm = head_dim, 3 * head_dim if self.config.qk_norm else 0
        per_key = 5 * D * D + 2 * D + 1 + norm
        per_query = 2 * D * D + D + norm
        return batch * ((heads if kv_heads is None else kv_heads) * k_len * per_key + heads * q_len * per_query)

    # -- incremental decoding -------------------------------------------------------------------
    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: MatrixState, *,
             g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """New tokens q: (B, H, T, D), k, v: (B, H_kv, T, D), g, beta: (B, H_kv, T, 1) -> (B, H, T, D);
        T == 1 runs the recurrence, T > 1 (a prefill) the chunks."""
        form = self.last_backend = "recurrent" if q.shape[2] == 1 else "chunked"
        out, S = self._run(q, k, v, g, beta, state.S, form)
        state.update(S, q.shape[2])
        return out.to(q.dtype)


__all__ = ["GatedDeltaNetAttention", "GatedDeltaNetConfig", "l2norm"]
