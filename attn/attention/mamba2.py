"""Mamba-2's state-space duality (SSD; Dao & Gu 2024, "Transformers are SSMs", arXiv 2405.21060).

In the q/k/v contract (Mamba-2's C, B and x): per key head h, a step size dt_t > 0 from the token
(softplus of a projection), a learned decay rate A_h < 0, a_t = exp(dt_t A_h), and

    S_t = a_t S_{t-1} + dt_t k_t^T v_t,        o_t = q_t S_t + D_h v_t,

i.e. o_t = sum_{s<=t} (prod_{r=s+1..t} a_r) (q_t . k_s) dt_s v_s + D_h v_t: GLA's recurrence with one scalar decay
per head instead of one per channel, no 1/sqrt(D) scale, the input scaled by dt and the skip D. A and D are the
variant's own weights, one per key head (``A_log`` at Mamba-2's init, A spread over [1, 16]; D = 1).
``dt`` is a token input: softplus(x + DT_SHIFT), the shift putting a fresh layer's step at 0.01 as Mamba-2's
dt_bias init (dt in [0.001, 0.1]) does, so decays start near 1 (decay_rate.py, shared with Gated DeltaNet).
The layer RMS-normalises each head (``output_norm``), as Mamba-2's gated RMSNorm does; its z gate and its short
convolution belong to the layer (``short_conv`` is the backbone's), not here.

Forms: the quadratic "attention" form with the explicit (L, L) decay matrix (``reference``), SSD's chunked block
decomposition (``chunked``: GLA's chunk form, the scalar decay broadcast over channels), the recurrence
(``recurrent``: the decode path) and fla's ``chunk_simple_gla`` on CUDA.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attn.attention import gqa
from attn.attention.base import ALL_MODES, Backend, have_module, modes
from attn.attention.decay_rate import initial_a_log, step_size
from attn.attention.gla import GatedLinearAttention, _absorb
from attn.attention.matrix_state import MatrixState, compute_dtype
from attn.attention.token_inputs import TokenInput
from attn.registry import check, register_attention


@dataclass(frozen=True)
class Mamba2Config:
    chunk_size: int = 64  # chunked backend: tokens per chunk (SSD's block; linear's measured CPU choice)
    heads: int = 0  # key heads of A and D; 0 = made at the first call (the backbone gives them at build)

    def __post_init__(self) -> None:
        check(self.chunk_size >= 1, f"chunk_size must be >= 1, got {self.chunk_size}")
        check(self.heads >= 0, f"heads must be >= 0 (0 = A and D are made at the first call), got {self.heads}")


def initial_weights(heads: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(A_log, D) for ``heads`` key heads: A spread evenly over Mamba-2's init range (deterministic), D = 1."""
    return initial_a_log(heads, device), torch.ones(heads, device=device)


@register_attention("mamba2", config=Mamba2Config)
class Mamba2Attention(GatedLinearAttention):
    """Mamba-2 (SSD): a per-head scalar, data-dependent decay and a skip term; O(1) decoding state."""

    learned_per_head = "key"  # A and D: one per key head (the backbone sets ``heads``)
    token_inputs = (TokenInput("dt", width=1, activation=step_size,
                               doc="step size dt_t > 0 per key head (softplus(dt_proj(x) + dt_bias))"),)
    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="quadratic SSD form, explicit (L, L) decays"),
        Backend("chunked", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="SSD block decomposition, O(L c d + L d^2)"),
        Backend("recurrent", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="token by token, (D x D) state; decode path"),
        Backend(
            "fla",
            {"cuda": modes("forward", "backward")},
            dtypes=(torch.float32, torch.bfloat16, torch.float16),
            requires=have_module("fla.ops.simple_gla", " (the kernels ship in fla-core: pip install 'attn-bench[gpu]')"),
            note="flash-linear-attention chunk_simple_gla (Triton)",
        ),
    )

    def __init__(self, config: Mamba2Config, backend: str = "auto"):
        super().__init__(config, backend)
        if config.heads:
            a_log, d = initial_weights(config.heads)
            self.A_log, self.D = nn.Parameter(a_log), nn.Parameter(d)
        else:
            self.register_parameter("A_log", None)
            self.register_parameter("D", None)

    def weights(self, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(A (H_kv,) < 0, D (H_kv,)) in k's compute dtype, made at the first call when ``heads`` was not given."""
        if self.A_log is None:
            a_log, d = initial_weights(k.shape[1], k.device)
            self.A_log, self.D = nn.Parameter(a_log), nn.Parameter(d)
        check(self.A_log.shape[0] == k.shape[1], f"mamba2: A and D are for {self.A_log.shape[0]} key heads, the call "
                                                 f"has {k.shape[1]} (one module serves one head count: build another)")
        cdt = compute_dtype(k.dtype)
        return -self.A_log.to(cdt).exp(), self.D.to(cdt)

    def _inputs(self, q, k, v, dt):
        """Cast; -> (q, k dt, v, log decay dt A broadcast over k's channels, D) for GLA's forms, which decay per channel."""
        cdt = compute_dtype(q.dtype)
        q, k, v, dt = (x.to(cdt) for x in (q, k, v, dt))
        A, D = self.weights(k)
        g = (dt * A[:, None, None]).expand(*k.shape)  # (B, H_kv, L, D_k)
        return q, k * dt, v, g, D

    def _skip(self, out, q, v, D):
        """out + D_h v_t for the queries (the last Lq positions), each query head reading its key head."""
        skip = gqa.repeat_kv(v[:, :, v.shape[2] - q.shape[2]:] * D[:, None, None], q.shape[1] // v.shape[1])
        return out + skip

    def _state_form(self, q, k, v, dt, form):
        dtype = q.dtype
        q, k, v, g, D = self._inputs(q, k, v, dt)
        S = k.new_zeros(*k.shape[:2], k.shape[-1], v.shape[-1])
        p = k.shape[2] - q.shape[2]
        if p:  # keys before the queries (bottom-right alignment) go into the state first
            S = _absorb(k[:, :, :p], v[:, :, :p], g[:, :, :p], S)
        out = form(q, k[:, :, p:], v[:, :, p:], g[:, :, p:], S)[0]
        return self._skip(out, q, v, D).to(dtype)

    # -- backends -------------------------------------------------------------------------------
    def backend_reference(self, q, k, v, causal, dt):
        dtype = q.dtype
        q, k, v, g, D = self._inputs(q, k, v, dt)
        B, H, Lq, _ = q.shape
        Hkv, Lk = k.shape[1], k.shape[2]
        b = g[..., 0].cumsum(2)  # (B, H_kv, Lk): log decay from the start to each token, inclusive
        visible = torch.arange(Lq, device=q.device)[:, None] + (Lk - Lq) >= torch.arange(Lk, device=q.device)
        decay = (b[:, :, Lk - Lq:, None] - b[:, :, None]).masked_fill(~visible, -torch.inf).exp()  # (B, H_kv, Lq, Lk)
        scores = q.reshape(B, Hkv, H // Hkv, Lq, -1) @ k[:, :, None].transpose(-1, -2) * decay[:, :, None]
        out = (scores @ v[:, :, None]).reshape(B, H, Lq, -1)
        return self._skip(out, q, v, D).to(dtype)

    def backend_chunked(self, q, k, v, causal, dt):
        return self._state_form(q, k, v, dt, self._chunked)

    def backend_recurrent(self, q, k, v, causal, dt):
        return self._state_form(q, k, v, dt, self._recurrent)

    def backend_fla(self, q, k, v, causal, dt):
        """fla's ``chunk_simple_gla`` on (B, T, H, K) inputs with its scalar log decay g (B, T, H), scale 1; keys,
        values and decays repeated to the query heads; the keys before the queries absorbed into the initial state."""
        from fla.ops.simple_gla import chunk_simple_gla

        from attn.attention.linear import limit_fla_autotune

        limit_fla_autotune()
        dtype = q.dtype
        kernel_dtype = dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32
        q, k, v, g, D = self._inputs(q, k, v, dt)
        groups, p = gqa.kv_groups(q, k), k.shape[2] - q.shape[2]
        S0 = None
        if p:
            S0 = gqa.repeat_kv(_absorb(k[:, :, :p], v[:, :, :p], g[:, :, :p],
                                       k.new_zeros(*k.shape[:2], k.shape[-1], v.shape[-1])), groups).float().contiguous()
        bthd = lambda x, dt=kernel_dtype: gqa.repeat_kv(x[:, :, p:], groups).transpose(1, 2).to(dt).contiguous()
        o, _ = chunk_simple_gla(q.transpose(1, 2).to(kernel_dtype).contiguous(), bthd(k), bthd(v),
                                g=bthd(g[..., :1], torch.float32)[..., 0], scale=1.0, initial_state=S0,
                                output_final_state=False)
        return self._skip(o.transpose(1, 2).to(q.dtype), q, v, D).to(dtype)

    # -- cost -----------------------------------------------------------------------------------
    def flops(self, batch: int, heads: int, q_len: int, k_len: int, head_dim: int, causal: bool = True,
              kv_heads: int | None = None) -> int:
        """Useful FLOPs of one call in the recurrent form, 2 per MAC; linear in length.

        Per key, per key head: the decay exp(dt A), 2; scale k by dt, D; decay the state, D^2; add (k dt)^T v,
        2 D^2. Per query, per query head: read q S, 2 D^2; add the skip D v, 2 D. dt's softplus belongs to the layer.
        """
        D = head_dim
        per_key, per_query = 3 * D * D + D + 2, 2 * D * D + 2 * D
        return batch * ((heads if kv_heads is None else kv_heads) * k_len * per_key + heads * q_len * per_query)

    # -- incremental decoding -------------------------------------------------------------------
    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: MatrixState, dt: torch.Tensor) -> torch.Tensor:
        """New tokens -> their outputs; T == 1 runs the recurrence, T > 1 (a prefill) the chunks."""
        dtype = q.dtype
        q, k, v, g, D = self._inputs(q, k, v, dt)
        S = state.S if state.S is not None else k.new_zeros(*k.shape[:2], k.shape[-1], v.shape[-1])
        form, self.last_backend = (self._recurrent, "recurrent") if q.shape[2] == 1 else (self._chunked, "chunked")
        out, S = form(q, k, v, g, S)
        state.update(S, q.shape[2])
        return self._skip(out, q, v, D).to(dtype)


__all__ = ["Mamba2Attention", "Mamba2Config"]
