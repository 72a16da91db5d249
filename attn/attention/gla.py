"""Gated Linear Attention (Yang et al. 2024, "Gated Linear Attention Transformers with Hardware-Efficient Training").

S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t (D_k x D_v), o_t = scale * q_t S_t, scale = D^-1/2: a data-dependent
per-channel decay of the state's rows. The log decay g_t <= 0 is a token input ``gk``, (B, H_kv, L, D_k), that
the layer makes as fla's GLA layer does, ``logsigmoid(gk_proj(x)) / 16`` (the 16, fla's
``gate_logit_normalizer``, keeps a fresh layer's decays weak: ~0.95 per token). Like retention, the output is
not normalised by the op; the layer RMS-normalises each head (``output_norm``). Causal only.

Forms: the parallel form with explicit decays exp(b_i - b_j), b = cumsum(g) (``reference``), the chunkwise
form of the paper's sec. 4 (``chunked``) and the recurrence (``recurrent``: the decode path).

Numerics of the chunked form: inside a chunk, with b_i the log decay from the chunk's start to token i, the
paper factorises exp(b_i - b_j) = exp(b_i) exp(-b_j), so the intra-chunk weights are one matmul. exp(-b_j) grows
as the decays strengthen: a token at logsigmoid(-20) = -20 per channel overflows fp32 within 5 tokens. A chunk
whose |b| stays within ``SAFE_LOG_RANGE`` is factorised (every factor within e^+-60: no overflow, no underflow);
any other chunk takes fla's secondary chunking (:func:`_strong_intra`), whose factors are all <= 1 and whose
diagonal sub-blocks form exp(b_i - b_j) explicitly. Which chunks are which is decided for the whole call at once
(one host sync). The carried state's factors (exp(b_i) for the queries, exp(b_last - b_j) for the keys) are <= 1
in every chunk. g must be <= 0 (the activation makes it so). Sums and state in fp32 (fp64 for fp64 inputs).
Measured once on the shared 2-core development CPU (1 thread, B=1, H=4, L=4096, D=64, forward, under load):
15-25 ms with fresh-layer decays (every chunk factorised), 130-210 ms with every chunk at logsigmoid(-20)
decays (sub-blocked), ~600 ms for the recurrence.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attn.attention import gqa
from attn.attention.base import ALL_MODES, Backend, have_module, modes
from attn.attention.matrix_state import MatrixState, MatrixStateAttention, compute_dtype
from attn.attention.token_inputs import TokenInput
from attn.registry import check, register_attention

GATE_LOGIT_NORMALIZER = 16  # fla's GatedLinearAttention default
# |log decay| a chunk may span and still be factorised: e^60 ~ 1e26 leaves fp32 (max ~3e38) room for |q| |k| D.
SAFE_LOG_RANGE = 60.0
SUB_BLOCK = 16  # rows per sub-block where a chunk is not factorised (fla's BC)


def gla_log_decay(x: torch.Tensor) -> torch.Tensor:
    """A raw gate projection -> GLA's log decay, logsigmoid(x) / 16 (<= 0), as fla's GLA layer makes it."""
    return F.logsigmoid(x) / GATE_LOGIT_NORMALIZER


@dataclass(frozen=True)
class GLAConfig:
    chunk_size: int = 64  # chunked backend: tokens per chunk (linear's measured CPU choice; not re-measured here)

    def __post_init__(self) -> None:
        check(self.chunk_size >= 1, f"chunk_size must be >= 1, got {self.chunk_size}")


def _absorb(k, v, gk, S):
    """Add T keys to the state at once: diag(exp(b_T)) S + sum_j (k_j exp(b_T - b_j))^T v_j, b = cumsum(gk);
    every factor is <= 1. k, gk: (..., T, D_k), v: (..., T, D_v), S: (..., D_k, D_v)."""
    b = gk.cumsum(-2)
    last = b[..., -1, :]  # (..., D_k)
    return S * last.exp()[..., None] + (k * (last[..., None, :] - b).exp()).transpose(-1, -2) @ v


def _strong_intra(q, k, b, mask, sub=SUB_BLOCK):
    """Intra-chunk weights A[i, j] = sum_d q_id k_jd exp(b_id - b_jd), j <= i, for decays too strong to factorise
    over the chunk. q: (X, g, n, D), k, b: (X, n, D) -> (X, g, n, n).

    fla's secondary chunking: rows in sub-blocks of ``sub``; keys of earlier sub-blocks are factorised about the
    log decay r just before the rows' sub-block, exp(b_i - r) exp(r - b_j), both <= 1 (an underflow to 0 stands
    for a product below e^-87); the diagonal sub-block forms exp(b_i - b_j) explicitly, (sub, sub, D) per row block.
    """
    n, rows = k.shape[1], []
    for i0 in range(0, n, sub):
        i1 = min(i0 + sub, n)
        qi, bi = q[:, :, i0:i1], b[:, i0:i1]
        rel = (bi[:, :, None] - bi[:, None]).masked_fill(~mask[:i1 - i0, :i1 - i0, None], -torch.inf).exp()
        parts = [torch.einsum("xgid,xjd,xijd->xgij", qi, k[:, i0:i1], rel)]
        if i0:
            r = b[:, i0 - 1:i0]  # (X, 1, D)
            parts.insert(0, (qi * (bi - r).exp()[:, None]) @ (k[:, :i0] * (r - b[:, :i0]).exp()).transpose(1, 2)[:, None])
        parts.append(q.new_zeros(*qi.shape[:3], n - i1))
        rows.append(torch.cat(parts, -1))
    return torch.cat(rows, 2)


@register_attention("gla", config=GLAConfig)
class GatedLinearAttention(MatrixStateAttention):
    """GLA: causal linear attention whose state decays per channel by a data-dependent gate; O(1) decoding state."""

    supports_bidirectional = False
    supports_gqa = True  # one state per key head (decayed by that head's gk), read by its group of query heads
    output_norm = True  # GLA's per-head RMSNorm before the output projection
    exact = False  # not softmax attention
    token_inputs = (TokenInput("gk", activation=gla_log_decay,
                               doc="per-channel log decay g_t <= 0 of the state (fla: logsigmoid(gk_proj(x)) / 16)"),)
    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="parallel form, explicit (Lq, Lk, D) decays"),
        Backend("chunked", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="chunkwise parallel, O(L c d + L d^2)"),
        Backend("recurrent", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="token by token, (D x D) state; decode path"),
        Backend(
            "fla",
            {"cuda": modes("forward", "backward")},
            dtypes=(torch.float32, torch.bfloat16, torch.float16),
            requires=have_module("fla.ops.gla", " (the kernels ship in fla-core: pip install 'attn-bench[gpu]')"),
            note="flash-linear-attention chunk_gla (Triton)",
        ),
    )
    # The same order as linear's, whose forms these mirror (linear measured chunked 8.2x faster than the
    # per-token Python loop at 16K on CPU); not re-measured for GLA. Decoding: one rank-1 update per token.
    auto_order = {"cpu/forward": ("chunked", "recurrent"), "cpu/backward": ("chunked", "recurrent"),
                  "cpu/decode": ("recurrent", "chunked"), "cuda/decode": ("recurrent", "chunked")}

    # -- the causal sum in its forms ------------------------------------------------------------
    # q: (B, H, T, D) already scaled, k, gk: (B, H_kv, T, D), v: (B, H_kv, T, D_v), all in the compute dtype;
    # S: (B, H_kv, D, D_v), the state of the keys before these tokens. Each returns (out, S).

    def _chunked(self, q, k, v, gk, S):
        """Chunkwise parallel (Yang et al. 2024, sec. 4): decayed quadratic inside a chunk + the decayed state.

        Batch and key heads are flattened and a key head's g query heads folded into its query rows, as in
        linear.py.
        """
        B, H, T, D = q.shape
        Hkv, Dv = k.shape[1], v.shape[-1]
        g, bh, c = H // Hkv, B * Hkv, min(self.config.chunk_size, T)  # a short call is one chunk of its length
        nc = -(-T // c)
        # chunk-local cumulative log decays: b[:, m, i] = sum of gk over chunk m's tokens 0..i; the padding
        # (log decay 0) leaves the real positions' values as they are
        b = F.pad(gk.flatten(0, 1), (0, 0, 0, nc * c - T)).view(bh, nc, c, D).cumsum(2)
        unsafe = (b.abs().amax(dim=(0, 2, 3)) > SAFE_LOG_RANGE).tolist()
        mask = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        q4, S = q.reshape(bh, g, T, D), S.flatten(0, 1)
        outs = []
        chunks = zip(q4.split(c, 2), k.flatten(0, 1).split(c, 1), v.flatten(0, 1).split(c, 1), b.unbind(1), unsafe,
                     strict=True)
        for qs, ks, vs, bc, strong in chunks:
            n = ks.shape[1]
            bc = bc[:, :n]  # (B H_kv, n, D)
            qg = (qs * bc.exp()[:, None]).reshape(bh, g * n, D)  # q_i exp(b_i): decays <= 1
            if strong:
                a = _strong_intra(qs, ks, bc, mask).reshape(bh, g * n, n)
            else:
                a = torch.bmm(qg, (ks * (-bc).exp()).transpose(1, 2))  # (B H_kv, g n, n)
                a.view(bh, g, n, n).tril_()
            outs.append(torch.baddbmm(qg @ S, a, vs).view(bh, g, n, Dv))
            last = bc[:, -1]  # (B H_kv, D)
            S = torch.baddbmm(S * last.exp()[..., None], (ks * (last[:, None] - bc).exp()).transpose(1, 2), vs)
        return torch.cat(outs, 2).reshape(B, H, T, Dv), S.unflatten(0, (B, Hkv))

    @staticmethod
    def _recurrent(q, k, v, gk, S):
        """The RNN view: S <- diag(exp(g_t)) S + k_t^T v_t, then read it with q_t."""
        B, H, T, D = q.shape
        q5 = q.reshape(B, k.shape[1], H // k.shape[1], T, D)  # GQA: (B, H_kv, g, T, D)
        outs = []
        for t in range(T):
            S = gk[:, :, t, :, None].exp() * S + k[:, :, t, :, None] * v[:, :, t, None, :]
            outs.append(q5[:, :, :, t] @ S)  # (B, H_kv, g, D_v)
        return torch.stack(outs, 3).reshape(B, H, T, -1), S

    @staticmethod
    def _state_form(q, k, v, gk, form):
        """Cast, absorb the keys before the queries (bottom-right: queries are the last Lq positions), run ``form``."""
        dtype, cdt = q.dtype, compute_dtype(q.dtype)
        q, k, v, gk = (x.to(cdt) for x in (q, k, v, gk))
        S = k.new_zeros(*k.shape[:2], k.shape[-1], v.shape[-1])
        p = k.shape[2] - q.shape[2]
        if p:
            S = _absorb(k[:, :, :p], v[:, :, :p], gk[:, :, :p], S)
        return form(q * q.shape[-1] ** -0.5, k[:, :, p:], v[:, :, p:], gk[:, :, p:], S)[0].to(dtype)

    # -- backends -------------------------------------------------------------------------------
    def backend_reference(self, q, k, v, causal, gk):
        dtype, cdt = q.dtype, compute_dtype(q.dtype)
        q, k, v, gk = (x.to(cdt) for x in (q, k, v, gk))
        B, H, Lq, D = q.shape
        Hkv, Lk = k.shape[1], k.shape[2]
        b = gk.cumsum(2)  # (B, H_kv, Lk, D): log decay from the start to each token, inclusive
        visible = torch.arange(Lq, device=q.device)[:, None] + (Lk - Lq) >= torch.arange(Lk, device=q.device)
        rel = (b[:, :, Lk - Lq:, None] - b[:, :, None]).masked_fill(~visible[..., None], -torch.inf).exp()  # (B, H_kv, Lq, Lk, D)
        scores = torch.einsum("bhgid,bhjd,bhijd->bhgij", q.reshape(B, Hkv, H // Hkv, Lq, D), k, rel) * D**-0.5
        return (scores @ v[:, :, None]).reshape(B, H, Lq, -1).to(dtype)

    def backend_chunked(self, q, k, v, causal, gk):
        return self._state_form(q, k, v, gk, self._chunked)

    def backend_recurrent(self, q, k, v, causal, gk):
        return self._state_form(q, k, v, gk, self._recurrent)

    def backend_fla(self, q, k, v, causal, gk):
        """fla's ``chunk_gla`` on (B, T, H, K) inputs; its GQA is not this one (it groups values), so keys, values and
        gates are repeated to the query heads. The decays go in fp32 (fla then keeps their cumsum for the backward);
        the keys before the queries are absorbed here into an fp32 initial state."""
        from fla.ops.gla import chunk_gla

        from attn.attention.linear import limit_fla_autotune

        limit_fla_autotune()
        dtype, cdt = q.dtype, compute_dtype(q.dtype)
        kernel_dtype = dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32
        g, p = gqa.kv_groups(q, k), k.shape[2] - q.shape[2]
        S0 = None
        if p:
            k0, v0, g0 = (x[:, :, :p].to(cdt) for x in (k, v, gk))
            S0 = gqa.repeat_kv(_absorb(k0, v0, g0, k0.new_zeros(*k.shape[:2], k.shape[-1], v.shape[-1])), g)
            S0 = S0.float().contiguous()
        bthd = lambda x, dt=kernel_dtype: gqa.repeat_kv(x[:, :, -q.shape[2]:], g).transpose(1, 2).to(dt).contiguous()
        o, _ = chunk_gla(q.transpose(1, 2).to(kernel_dtype).contiguous(), bthd(k), bthd(v), bthd(gk, torch.float32),
                         scale=q.shape[-1] ** -0.5, initial_state=S0, output_final_state=False)
        return o.transpose(1, 2).to(dtype)

    # -- cost -----------------------------------------------------------------------------------
    def flops(self, batch: int, heads: int, q_len: int, k_len: int, head_dim: int, causal: bool = True,
              kv_heads: int | None = None) -> int:
        """Useful FLOPs of one call in the recurrent form, 2 per MAC; linear in length, never L^2.

        Per key, per key head: exp of its D log decays, D; decay the state's rows, diag(exp(g)) S, D^2; add
        k^T v, 2 D^2. Per query, per query head: scale q, D, and read q S, 2 D^2. The gate's projection and
        logsigmoid belong to the layer, not the op. The chunked form's intra-chunk products and cumsums are an
        implementation cost, not counted (as in linear.py). With GQA the state is updated once per key head
        (``kv_heads``) and read once per query head (``heads``).
        """
        per_key, per_query = 3 * head_dim * head_dim + head_dim, 2 * head_dim * head_dim + head_dim
        return batch * ((heads if kv_heads is None else kv_heads) * k_len * per_key + heads * q_len * per_query)

    # -- incremental decoding -------------------------------------------------------------------
    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: MatrixState, gk: torch.Tensor) -> torch.Tensor:
        """New tokens q: (B, H, T, D), k, gk: (B, H_kv, T, D), v: (B, H_kv, T, D_v) -> (B, H, T, D_v); T == 1 runs the
        recurrence, T > 1 (a prefill) the chunks."""
        dtype, cdt = q.dtype, compute_dtype(q.dtype)
        q, k, v, gk = (x.to(cdt) for x in (q, k, v, gk))
        S = state.S if state.S is not None else k.new_zeros(*k.shape[:2], k.shape[-1], v.shape[-1])
        form, self.last_backend = (self._recurrent, "recurrent") if q.shape[2] == 1 else (self._chunked, "chunked")
        out, S = form(q * q.shape[-1] ** -0.5, k, v, gk, S)
        state.update(S, q.shape[2])
        return out.to(dtype)


__all__ = ["GLAConfig", "GatedLinearAttention", "SAFE_LOG_RANGE", "gla_log_decay"]
