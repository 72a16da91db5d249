"""Retention (Sun et al. 2023, "Retentive Network: A Successor to Transformer for Large Language Models").

o_t = scale * sum_{s<=t} gamma_h^(t-s) (q_t . k_s) v_s, scale = D^-1/2, i.e. the recurrence
S_t = gamma_h S_{t-1} + k_t^T v_t (D_k x D_v), o_t = scale * q_t S_t. The decay is fixed per head,
gamma_h = 1 - 2^(-5-h) for key head h = 0..H_kv-1 (RetNet sec. 2.2, and fla's ``chunk_retention``); with
grouped-query attention it belongs to the key head, whose state its group of query heads reads.
No normaliser: RetNet's layer applies a GroupNorm to each head's output, which the backbone does
(``output_norm``). Causal only: the decay runs forward in time.

Three equal forms, as for ``linear``: the parallel form with the explicit decay matrix
D[i, j] = gamma^(i-j) (``reference``, RetNet eq. 5), the chunkwise form (``chunked``, RetNet eq. 7 /
Yang et al. 2024 sec. 3: quadratic inside a chunk, the state carried across chunks) and the recurrence
(``recurrent``: one token at a time; the decode path). Every decay factor used is gamma^m with m >= 0,
so nothing overflows whatever gamma is. Sums and state in fp32 (fp64 for fp64 inputs), as in linear.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attn.attention import gqa
from attn.attention.base import ALL_MODES, Backend, have_module, modes
from attn.attention.matrix_state import MatrixState, MatrixStateAttention, compute_dtype
from attn.registry import check, register_attention


def retnet_gammas(kv_heads: int) -> list[float]:
    """RetNet's decay per head: 1 - 2^(-5-h), from 0.969 (a ~32-token horizon) towards 1."""
    return [1 - 2.0 ** (-5 - h) for h in range(kv_heads)]


@dataclass(frozen=True)
class RetentionConfig:
    chunk_size: int = 64  # chunked backend: tokens per chunk (linear's measured CPU choice; not re-measured here)
    # None = RetNet's rule per key head; a value in (0, 1] = that decay for every head (one value, not a
    # per-head list, so one spec fits every head count a sweep or check uses)
    gamma: float | None = None

    def __post_init__(self) -> None:
        check(self.chunk_size >= 1, f"chunk_size must be >= 1, got {self.chunk_size}")
        check(self.gamma is None or (math.isfinite(self.gamma) and 0 < self.gamma <= 1),
              f"gamma must be None or in (0, 1], got {self.gamma}")


@register_attention("retention", config=RetentionConfig)
class RetentionAttention(MatrixStateAttention):
    """RetNet's retention: causal linear attention with a fixed per-head exponential decay; O(1) decoding state."""

    supports_bidirectional = False
    supports_gqa = True  # one state per key head, read by its group of query heads
    output_norm = True  # RetNet's per-head GroupNorm
    exact = False  # not softmax attention
    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="parallel form, explicit decay matrix"),
        Backend("chunked", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="chunkwise parallel, O(L c d + L d^2)"),
        Backend("recurrent", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="token by token, (D x D) state; decode path"),
        Backend(
            "fla",
            {"cuda": modes("forward", "backward")},
            dtypes=(torch.float32, torch.bfloat16, torch.float16),
            requires=have_module("fla.ops.simple_gla", " (the kernels ship in fla-core: pip install 'attn-bench[gpu]')"),
            note="flash-linear-attention chunk_simple_gla with g_gamma (the kernel under chunk_retention; Triton)",
        ),
    )
    # The same order as linear's, whose forms these mirror (linear measured chunked 8.2x faster than the
    # per-token Python loop at 16K on CPU); not re-measured for retention. Decoding: one rank-1 update per token.
    auto_order = {"cpu/forward": ("chunked", "recurrent"), "cpu/backward": ("chunked", "recurrent"),
                  "cpu/decode": ("recurrent", "chunked"), "cuda/decode": ("recurrent", "chunked")}

    # -- decay --------------------------------------------------------------------------------
    def log_gamma(self, kv_heads: int, like: torch.Tensor) -> torch.Tensor:
        """log gamma per key head, (H_kv,), in ``like``'s dtype and device."""
        gamma = self.config.gamma
        values = retnet_gammas(kv_heads) if gamma is None else [gamma] * kv_heads
        return torch.tensor(values, dtype=torch.float64).log().to(device=like.device, dtype=like.dtype)

    # -- the causal sum in its forms ------------------------------------------------------------
    # q: (B, H, T, D), k: (B, H_kv, T, D), v: (B, H_kv, T, D_v) in the compute dtype, already scaled q;
    # lg: (H_kv,) log gamma; S: (B, H_kv, D, D_v), the state of the keys before these tokens. -> (out, S)

    @staticmethod
    def _absorb(k, v, lg, S):
        """Add T keys to the state at once: S gamma^T + sum_j gamma^(T-1-j) k_j^T v_j (a prefix, a chunk)."""
        T = k.shape[2]
        ages = torch.arange(T - 1, -1, -1, device=k.device, dtype=k.dtype)  # T-1-j
        decay = torch.exp(ages * lg[:, None])  # (H_kv, T) <= 1
        return S * torch.exp(T * lg)[:, None, None] + (k * decay[..., None]).transpose(-1, -2) @ v

    def _chunked(self, q, k, v, lg, S):
        """Chunkwise parallel: masked, decayed quadratic inside each chunk + the decayed carried state.

        Batch and key heads are flattened and a key head's g query heads folded into its query rows (as in
        linear.py), so a chunk is a few bmm calls; ``split``, not slicing, keeps the backward O(L).
        """
        B, H, T, D = q.shape
        Hkv, Dv = k.shape[1], v.shape[-1]
        g, bh = H // Hkv, B * Hkv
        c = min(self.config.chunk_size, T)  # a short call is one chunk of its length
        lgb = lg.expand(B, Hkv).reshape(bh)  # (B H_kv,) log gamma per flattened row
        i = torch.arange(c, device=q.device, dtype=q.dtype)
        age = i[:, None] - i[None, :]  # (c, c) i - j
        intra = torch.exp(age.clamp(min=0) * lgb[:, None, None]).masked_fill(age < 0, 0.0)  # (B H_kv, c, c) gamma^(i-j)
        since = torch.exp((i + 1) * lgb[:, None])  # (B H_kv, c) gamma^(i+1): the carried state's decay at row i
        q4, S = q.reshape(bh, g, T, D), S.flatten(0, 1)
        outs = []
        for qs, ks, vs in zip(q4.split(c, 2), k.flatten(0, 1).split(c, 1), v.flatten(0, 1).split(c, 1), strict=True):
            n = ks.shape[1]
            a = torch.bmm(qs.reshape(bh, g * n, D), ks.transpose(1, 2)).view(bh, g, n, n) * intra[:, None, :n, :n]
            inter = (qs * since[:, None, :n, None]).reshape(bh, g * n, D) @ S  # (B H_kv, g n, D_v)
            outs.append(torch.baddbmm(inter, a.view(bh, g * n, n), vs).view(bh, g, n, Dv))
            last = intra[:, n - 1, :n]  # (B H_kv, n) gamma^(n-1-j)
            S = torch.baddbmm(S * since[:, n - 1, None, None], (ks * last[..., None]).transpose(1, 2), vs)
        return torch.cat(outs, 2).reshape(B, H, T, Dv), S.unflatten(0, (B, Hkv))

    @staticmethod
    def _recurrent(q, k, v, lg, S):
        """The RNN view: S <- gamma S + k_t^T v_t, then read it with q_t."""
        B, H, T, D = q.shape
        gamma = torch.exp(lg)[:, None, None]  # (H_kv, 1, 1)
        q5 = q.reshape(B, k.shape[1], H // k.shape[1], T, D)  # GQA: (B, H_kv, g, T, D)
        outs = []
        for t in range(T):
            S = gamma * S + k[:, :, t, :, None] * v[:, :, t, None, :]
            outs.append(q5[:, :, :, t] @ S)  # (B, H_kv, g, D_v)
        return torch.stack(outs, 3).reshape(B, H, T, -1), S

    def _state_form(self, q, k, v, form):
        """Cast, absorb the keys before the queries (bottom-right: queries are the last Lq positions), run ``form``."""
        dtype, cdt = q.dtype, compute_dtype(q.dtype)
        q, k, v = (x.to(cdt) for x in (q, k, v))
        lg = self.log_gamma(k.shape[1], k)
        S = k.new_zeros(*k.shape[:2], k.shape[-1], v.shape[-1])
        p = k.shape[2] - q.shape[2]
        if p:
            S = self._absorb(k[:, :, :p], v[:, :, :p], lg, S)
        return form(q * q.shape[-1] ** -0.5, k[:, :, p:], v[:, :, p:], lg, S)[0].to(dtype)

    # -- backends -------------------------------------------------------------------------------
    def backend_reference(self, q, k, v, causal):
        dtype, cdt = q.dtype, compute_dtype(q.dtype)
        q, k, v = (x.to(cdt) for x in (q, k, v))
        B, H, Lq, D = q.shape
        Hkv, Lk = k.shape[1], k.shape[2]
        age = (torch.arange(Lq, device=q.device)[:, None] + (Lk - Lq) - torch.arange(Lk, device=q.device)).to(cdt)
        lg = self.log_gamma(Hkv, k)
        decay = torch.exp(age.clamp(min=0) * lg[:, None, None]).masked_fill(age < 0, 0.0)  # (H_kv, Lq, Lk)
        scores = q.reshape(B, Hkv, H // Hkv, Lq, D) @ k[:, :, None].transpose(-1, -2) * D**-0.5  # (B, H_kv, g, Lq, Lk)
        return ((scores * decay[:, None]) @ v[:, :, None]).reshape(B, H, Lq, -1).to(dtype)

    def backend_chunked(self, q, k, v, causal):
        return self._state_form(q, k, v, self._chunked)

    def backend_recurrent(self, q, k, v, causal):
        return self._state_form(q, k, v, self._recurrent)

    def backend_fla(self, q, k, v, causal):
        """fla's retention kernel. ``chunk_retention`` is ``chunk_simple_gla`` with g_gamma = log(1 - 2^(-5-h)) over
        the *query* head index h; it is called here with this variant's g_gamma instead, so a GQA group (keys
        repeated to its query heads) keeps its key head's decay and a ``gamma`` override applies. fla takes
        (B, T, H, K) and an fp32 initial state: the keys before the queries are absorbed here, in fp32."""
        from fla.ops.simple_gla import chunk_simple_gla

        from attn.attention.linear import limit_fla_autotune

        limit_fla_autotune()
        dtype, cdt = q.dtype, compute_dtype(q.dtype)
        kernel_dtype = dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32
        g, p = gqa.kv_groups(q, k), k.shape[2] - q.shape[2]
        lg = self.log_gamma(k.shape[1], k.to(cdt))
        S0 = None
        if p:
            S0 = self._absorb(k[:, :, :p].to(cdt), v[:, :, :p].to(cdt), lg, k.new_zeros(
                *k.shape[:2], k.shape[-1], v.shape[-1], dtype=cdt))
            S0 = gqa.repeat_kv(S0, g).float().contiguous()
        bthd = lambda x: x.transpose(1, 2).to(kernel_dtype).contiguous()
        o, _ = chunk_simple_gla(bthd(q), bthd(gqa.repeat_kv(k[:, :, p:], g)), bthd(gqa.repeat_kv(v[:, :, p:], g)),
                                g_gamma=lg.float().repeat_interleave(g).contiguous(), scale=q.shape[-1] ** -0.5,
                                initial_state=S0, output_final_state=False)
        return o.transpose(1, 2).to(dtype)

    # -- cost -----------------------------------------------------------------------------------
    def flops(self, batch: int, heads: int, q_len: int, k_len: int, head_dim: int, causal: bool = True,
              kv_heads: int | None = None) -> int:
        """Useful FLOPs of one call in the recurrent form, 2 per MAC; linear in length, never L^2.

        Per key, per key head: decay the state, gamma S, D^2, and add k^T v, 2 D^2. Per query, per query head:
        scale q, D, and read q S, 2 D^2. A call starts from an empty state, so all ``k_len`` keys are absorbed.
        The chunked form's intra-chunk products are an implementation cost, not counted (as in linear.py).
        With GQA the state is updated once per key head (``kv_heads``) and read once per query head (``heads``).
        """
        per_key, per_query = 3 * head_dim * head_dim, 2 * head_dim * head_dim + head_dim
        return batch * ((heads if kv_heads is None else kv_heads) * k_len * per_key + heads * q_len * per_query)

    # -- incremental decoding -------------------------------------------------------------------
    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: MatrixState) -> torch.Tensor:
        """New tokens q: (B, H, T, D), k, v: (B, H_kv, T, D) -> (B, H, T, D_v); T == 1 runs the recurrence,
        T > 1 (a prefill) the chunks."""
        dtype, cdt = q.dtype, compute_dtype(q.dtype)
        q, k, v = (x.to(cdt) for x in (q, k, v))
        S = state.S if state.S is not None else k.new_zeros(*k.shape[:2], k.shape[-1], v.shape[-1])
        form, self.last_backend = (self._recurrent, "recurrent") if q.shape[2] == 1 else (self._chunked, "chunked")
        out, S = form(q * q.shape[-1] ** -0.5, k, v, self.log_gamma(k.shape[1], k), S)
        state.update(S, q.shape[2])
        return out.to(dtype)


__all__ = ["RetentionAttention", "RetentionConfig", "retnet_gammas"]
