"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"): softmax -> phi(q) phi(k)^T.

out_i = phi(q_i) S_i / max(phi(q_i) . z_i, eps),  S_i = sum_j phi(k_j)^T v_j (d_phi x D),  z_i = sum_j phi(k_j),
summing over j <= i (causal) or every j (bidirectional). One variant, three equal forms:
the quadratic parallel form (``reference``), the chunkwise-parallel form (``chunked``: quadratic inside
a chunk, a carried state between chunks; Yang et al. 2024, "Gated Linear Attention Transformers with
Hardware-Efficient Training", sec. 3 without gates) and the recurrence (``recurrent``: one token at a
time, constant memory -- the decoding path). ``fla`` runs flash-linear-attention's Triton kernel.

Scale: ``elu1`` and ``relu`` see raw q and k, as in Katharopoulos et al. (for relu a D^-1/2 would cancel
anyway); ``favor`` scales q and k by D^-1/4 each, so it estimates softmax(q k^T / sqrt(D)) like ``full``.

Numerics: after the inputs everything runs in fp32 (fp64 for fp64 inputs) -- features, state and
normaliser -- and the output is cast back: a bf16 running sum over thousands of tokens drifts. z rides
along as an extra all-ones column of v, so one matmul yields numerator and normaliser together.

favor stabiliser: each key's features are divided by exp of its largest logit M_j (so nothing
overflows) and query i rescales key j by exp(M_j - R_i), R_i = max_{j<=i} M_j. This is the paper's
"subtract the max over all keys" made causal, as in online softmax: no query depends on a later key
even through rounding, and the decoder's state stays constant-size (S, z, R).
"""
from __future__ import annotations

import functools
import inspect
import math
import os
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from attn.attention import gqa
from attn.attention.base import ALL_MODES, Backend, RecurrentAttention, have_module, modes
from attn.attention.feature_maps import ELEMENTWISE, favor_features, favor_logits, orthogonal_gaussian
from attn.attention.masks import causal_mask
from attn.attention.state import OneStepUndo
from attn.registry import check, register_attention

FeatureMap = Literal["elu1", "relu", "favor"]


@dataclass(frozen=True)
class LinearConfig:
    feature_map: FeatureMap = "elu1"
    num_features: int = 64  # favor only: random features m; the estimate's variance falls as 1/m
    seed: int = 0  # favor only: draws the orthogonal random features (fixed, never redrawn)
    chunk_size: int = 64  # chunked backend: tokens per chunk; of 64/128/256, 64 was fastest at 16K-32K on a 2-core CPU
    eps: float = 1e-6  # normaliser clamp: relu features of a query can all be zero

    def __post_init__(self) -> None:
        check(self.feature_map in get_args(FeatureMap),
              f"feature_map must be one of {', '.join(get_args(FeatureMap))}, got {self.feature_map!r}")
        check(self.num_features >= 1, f"num_features must be >= 1, got {self.num_features}")
        check(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        check(self.chunk_size >= 1, f"chunk_size must be >= 1, got {self.chunk_size}")
        check(math.isfinite(self.eps) and self.eps > 0, f"eps must be a positive finite float, got {self.eps}")


@dataclass
class LinearState(OneStepUndo):
    """Decoding state, the same size at every length: kv = [S | z] (B, H, d_phi, D + 1), fp32.

    ``log_scale`` (B, H) is favor's running max key logit (None otherwise). A recurrent state cannot
    forget tokens, so ``truncate`` can only undo the last step (the harness rewinds one timed step).
    """

    UNDO_FIELDS = ("kv", "log_scale")
    KIND = "linear-attention state"
    kv: torch.Tensor | None = None
    log_scale: torch.Tensor | None = None

    @property
    def S(self) -> torch.Tensor | None:  # noqa: N802  (the paper's name)
        return None if self.kv is None else self.kv[..., :-1]  # (B, H, d_phi, D)

    @property
    def z(self) -> torch.Tensor | None:
        return None if self.kv is None else self.kv[..., -1]  # (B, H, d_phi)

    def update(self, kv: torch.Tensor, log_scale: torch.Tensor | None, new_tokens: int) -> None:
        self.remember()
        self.kv, self.log_scale, self.length = kv, log_scale, self.length + new_tokens

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv, self.log_scale) if t is not None)


def _ones_column(v: torch.Tensor) -> torch.Tensor:
    """(..., T, D) -> [v | 1] (..., T, D + 1): the last column of phi(k)^T [v | 1] accumulates z."""
    return torch.cat([v, torch.ones_like(v[..., :1])], -1)


# chunked backend: tokens per step, in whole chunks. A step's temporaries, ~GROUP_TOKENS (g c + d D / c) floats per
# (batch, key head), 1 MB at c = d = D = 64 and 8 heads, stay in cache and in malloc's reused heap; at 4096 they
# were fresh pages each step (8 MB) and 1.4x the CPU time. 256-1024 were within noise at 128K on one thread.
GROUP_TOKENS = 512


FLA_AUTOTUNE_ENV = "ATTN_BENCH_FLA_AUTOTUNE_CONFIGS"


@functools.cache
def limit_fla_autotune(default: int = 2) -> int:
    """Cut each of fla's Triton autotuners to a few configs (``ATTN_BENCH_FLA_AUTOTUNE_CONFIGS``, default 2;
    0 keeps fla's own search). Returns how many autotuners were cut.

    fla tunes e.g. ``chunk_fwd_kernel_h`` over 48 configs, compiling and timing each, per dtype and
    head count, forward and backward: minutes of a first call, which a GPU check with ~8 minutes in all
    cannot spend. Kept: the configs with 4 warps first, then 3 stages, then the largest tiles -- the
    shapes fla's own tuning picks most on Hopper. The fastest config may be among those cut: fla's
    numbers are then a lower bound, and docs/gpu.md says so.
    """
    keep = int(os.environ.get(FLA_AUTOTUNE_ENV, default))
    if keep <= 0:
        return 0
    import sys

    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:  # no triton: no real fla kernels to tune (a test's stand-in)
        return 0

    def rank(cfg) -> tuple:
        tiles = 1
        for v in cfg.kwargs.values():
            tiles *= v if isinstance(v, int) else 1
        return (cfg.num_warps != 4, cfg.num_stages != 3, -tiles)

    cut = 0
    for name, module in list(sys.modules.items()):
        # every fla module, not only fla.ops: gated_delta_rule calls fla.modules.norm.l2norm, whose
        # kernels tune over 25 configs each way
        if not name.startswith("fla.") or module is None:
            continue
        for obj in list(vars(module).values()):
            for _ in range(4):  # @triton.heuristics wraps the Autotuner: follow .fn down to it
                if isinstance(obj, Autotuner) or not hasattr(obj, "fn"):
                    break
                obj = obj.fn
            if isinstance(obj, Autotuner) and len(obj.configs) > keep:
                obj.configs = sorted(obj.configs, key=rank)[:keep]
                cut += 1
    return cut


@register_attention("linear", config=LinearConfig)
class LinearAttention(RecurrentAttention):
    """Kernelised linear attention phi(q)(phi(k)^T v): O(L d^2) time, constant-size decoding state."""

    supports_gqa = True  # one [S | z] state per key head, read by its group of query heads

    exact = False  # not softmax attention (favor estimates it; elu1/relu are different kernels)
    backends = (
        Backend("reference", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="quadratic parallel form, explicit causal mask"),
        Backend("chunked", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="chunkwise parallel, O(L c d + L d^2)"),
        Backend("recurrent", {"cpu": ALL_MODES, "cuda": ALL_MODES}, note="token by token, (d_phi x D) state; decode path"),
        Backend(
            "fla",
            {"cuda": modes("forward", "backward")},
            dtypes=(torch.float32, torch.bfloat16, torch.float16),
            requires=have_module("fla.ops.linear_attn", " (the kernels ship in fla-core: pip install 'attn-bench[gpu]')"),
            note="flash-linear-attention chunk_linear_attn (Triton) on the features",
        ),
    )
    # Forward on the 2-core development CPU (quiet) at 16K: chunked 8.2x faster than recurrent (79 vs
    # 651 ms; the recurrence is a Python loop per token).
    # Command: attn-bench sweep --config results/targets-cpu.toml (results/targets-cpu.jsonl).
    # Decoding (a few queries after a long prefix): the recurrence is one rank-1 update per token, on
    # every device; the chunked form would pad each token to a chunk.
    auto_order = {"cpu/forward": ("chunked", "recurrent"), "cpu/decode": ("recurrent", "chunked"),
                  "cuda/decode": ("recurrent", "chunked")}

    def __init__(self, config: LinearConfig, backend: str = "auto"):
        super().__init__(config, backend)
        # favor's random features: a buffer (moves with .to()), not saved (redrawn from seed), drawn
        # lazily because the head dim is only known at the first call.
        self.register_buffer("projection", None, persistent=False)

    # -- features -------------------------------------------------------------------------------
    def feature_dim(self, head_dim: int) -> int:
        return self.config.num_features if self.config.feature_map == "favor" else head_dim

    def random_features(self, head_dim: int, device: torch.device) -> torch.Tensor:
        """favor's (num_features, head_dim) orthogonal projection, the same for every call and device."""
        p, m = self.projection, self.config.num_features
        if p is None or p.shape != (m, head_dim) or p.device != device or p.dtype not in (torch.float32, torch.float64):
            self.projection = orthogonal_gaussian(m, head_dim, self.config.seed).to(device=device, dtype=torch.float32)
        return self.projection

    def phi_query(self, q: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., d_phi). For favor a query's own scale is dropped: it cancels in the ratio."""
        if self.config.feature_map != "favor":
            return ELEMENTWISE[self.config.feature_map](q)
        return favor_features(favor_logits(q, self.random_features(q.shape[-1], q.device).to(q.dtype)))[0]

    def phi_key(self, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(..., D) -> features (..., d_phi) and, for favor, their log scale (...) to carry; else None."""
        if self.config.feature_map != "favor":
            return ELEMENTWISE[self.config.feature_map](k), None
        return favor_features(favor_logits(k, self.random_features(k.shape[-1], k.device).to(k.dtype)))

    @staticmethod
    def compute_dtype(dtype: torch.dtype) -> torch.dtype:
        return torch.float64 if dtype == torch.float64 else torch.float32  # state and sums in fp32 at least

    def _normalise(self, out: torch.Tensor) -> torch.Tensor:
        # out: (..., D + 1) = [phi(q) S | phi(q) . z] -> (..., D)
        return out[..., :-1] / out[..., -1:].clamp(min=self.config.eps)

    # -- the causal sum in its three forms -------------------------------------------------------
    # q, k, v: (B, H, T, D) in the compute dtype; kv: (B, H, d, D + 1) = [S | z] of the keys before
    # these tokens, at favor's key scale r: (B, H) (None for elu1/relu). Each returns (out, kv, r).

    def _empty_state(self, k: torch.Tensor):
        B, H, _, D = k.shape
        kv = k.new_zeros(B, H, self.feature_dim(D), D + 1)
        return kv, (k.new_full((B, H), -math.inf) if self.config.feature_map == "favor" else None)

    def _absorb(self, k, v, kv, r):
        """Add T >= 1 keys to the state at once (the prefix before decoding queries; all keys if bidirectional)."""
        phi_k, log_k = self.phi_key(k)
        if log_k is None:
            return kv + phi_k.transpose(-1, -2) @ _ones_column(v), None
        r_new = torch.maximum(r, log_k.amax(-1))  # (B, H)
        phi_k = phi_k * torch.exp(log_k - r_new[..., None])[..., None]  # rescaled to r_new, <= 1
        return kv * torch.exp(r - r_new)[..., None, None] + phi_k.transpose(-1, -2) @ _ones_column(v), r_new

    def _chunked(self, q, k, v, kv, r):
        """Chunkwise parallel: masked quadratic inside each chunk + the carried state of earlier chunks.

        O(T c d + T d D) work. Batch and heads are flattened, and each step takes many chunks at once (about
        ``GROUP_TOKENS`` tokens): their intra-chunk weights, their state increments, and the state before each
        chunk as a prefix sum of the increments, in a few large batched matmuls (one chunk per step was ~10 small
        ops per 64 tokens). Outputs go into one buffer: a list of chunk outputs and their concatenation were twice
        the output in fresh pages per call, and page faults (kernel time) grew faster than the length: at 1M tokens
        on one thread 2.9 s of system time against 1.1 s now. The last chunk may be short; it is a step of its own.
        """
        B, H, T, D = q.shape
        Hkv = k.shape[1]
        g, bh = H // Hkv, B * Hkv  # GQA: a key head's g query heads read one state, as g x n query rows
        q4 = q.reshape(bh, g, T, D)
        k3, v3, kv = k.flatten(0, 1), v.flatten(0, 1), kv.flatten(0, 1)  # (B H_kv, ., .)
        r = None if r is None else r.flatten(0, 1)  # (B H_kv,)
        c = self.config.chunk_size
        step, whole = max(1, GROUP_TOKENS // c) * c, T - T % c
        sizes = [step] * (whole // step) + [s for s in (whole % step, T - whole) if s]
        # Without autograd the steps write into one output buffer. With it, a list and one cat: the backward
        # of a slice write copies the whole gradient, O(steps x length).
        out = None if torch.is_grad_enabled() else q4.new_empty(bh, g, T, D)
        outs, t = [], 0
        # split, not slice: each slice's backward would write its chunk into a zeroed full-length gradient,
        # O(chunks x length) -- 8.6 s of the 8.7 s backward at 16K; split's backward is one concatenation
        for qs, ks, vs in zip(q4.split(sizes, 2), k3.split(sizes, 1), v3.split(sizes, 1), strict=True):
            n = ks.shape[1]
            o, kv, r = self._chunk_step(qs, ks, vs, kv, r, min(c, n))
            if out is None:
                outs.append(o)
            else:
                out[:, :, t:t + n] = o
            t += n
        out = torch.cat(outs, 2) if out is None else out
        return out.reshape(B, H, T, D), kv.unflatten(0, (B, Hkv)), None if r is None else r.unflatten(0, (B, Hkv))

    def _chunk_step(self, qs, ks, vs, kv, r, c):
        """m = t / c whole chunks of c tokens at once: qs (bh, g, t, D), ks, vs (bh, t, D), the state kv (bh, d, D + 1)
        at favor's scale r (bh,) (None for elu1/relu) -> (normalised out (bh, g, t, D), kv, r) after the last chunk."""
        bh, g, t, D = qs.shape
        m = t // c
        qc = self.phi_query(qs)  # (bh, g, t, d)
        d = qc.shape[-1]
        # reshape, not view: an elementwise feature map keeps its input's strides (transformers hands transposed keys)
        qc = qc.reshape(bh, g, m, c, d).transpose(1, 2).reshape(bh * m, g * c, d)  # chunk i's g heads one after another
        kc, lc = self.phi_key(ks)
        kc, vc = kc.reshape(bh * m, c, d), _ones_column(vs).view(bh * m, c, D + 1)
        a = torch.bmm(qc, kc.transpose(1, 2))  # (bh m, g c, c) intra-chunk weights
        if lc is None:
            a.view(bh * m, g, c, c).tril_()
            inc = torch.bmm(kc.transpose(1, 2), vc).view(bh, m, d, D + 1)  # each chunk's [S | z] increment
            states = torch.cat([kv[:, None], inc], 1).cumsum(1)  # (bh, m + 1, d, D + 1): before chunk i; the last after all
            out = torch.baddbmm(torch.bmm(a, vc), qc, states[:, :m].reshape(bh * m, d, D + 1))  # intra + inter
            kv = states[:, m]
        else:  # favor: bring keys and states to each query's scale R_i (see module docstring)
            lc = lc.view(bh, m, c)
            R = torch.maximum(lc.flatten(1).cummax(-1).values, r[:, None]).view(bh, m, c)  # (bh, m, c)
            s = torch.cat([r[:, None], R[:, :, -1]], 1)  # (bh, m + 1): the state's scale before chunk i; the last after all
            decay = torch.exp((lc[:, :, None, :] - R[..., None]).clamp(max=0.0))  # (bh, m, c, c), exact where visible
            a = (a.view(bh, m, g, c, c) * decay[:, :, None]).tril_().view(bh * m, g * c, c)
            kc = kc * torch.exp(lc - s[:, 1:, None]).view(bh * m, c, 1)  # chunk i's keys at its closing scale
            inc = torch.bmm(kc.transpose(1, 2), vc).view(bh, m, d * (D + 1))
            # state i = sum_{p <= i} [kv, inc_0, ...]_p exp(s_p - s_i): every factor <= 1 as the scale only grows;
            # the diagonal is 1 even where s is -inf (the empty state)
            gap = (s[:, None, :] - s[:, :, None]).clamp(max=0.0)  # (bh, m + 1, m + 1) [i, p]
            w = torch.exp(gap.diagonal_scatter(gap.new_zeros(bh, m + 1), dim1=1, dim2=2)).tril_()
            states = torch.bmm(w, torch.cat([kv.view(bh, 1, -1), inc], 1)).view(bh, m + 1, d, D + 1)
            inter = torch.bmm(qc, states[:, :m].reshape(bh * m, d, D + 1)).view(bh, m, g, c, D + 1)
            inter = inter * torch.exp(s[:, :m, None] - R)[:, :, None, :, None]
            out = torch.baddbmm(inter.view(bh * m, g * c, D + 1), a, vc)
            kv, r = states[:, m], s[:, m]
        out = (out[..., :-1] / out[..., -1:].clamp(min=self.config.eps)).view(bh, m, g, c, D)
        return out.transpose(1, 2).reshape(bh, g, t, D), kv, r

    def _recurrent(self, q, k, v, kv, r):
        """The RNN view: per token a rank-1 update of [S | z], then read it with phi(q_t)."""
        phi_q, (phi_k, log_k), v1 = self.phi_query(q), self.phi_key(k), _ones_column(v)
        B, H, T, d = phi_q.shape
        phi_q = phi_q.reshape(B, k.shape[1], H // k.shape[1], T, d)  # GQA: (B, H_kv, g, T, d)
        outs = []
        for t in range(q.shape[2]):
            update = phi_k[:, :, t, :, None] * v1[:, :, t, None, :]  # (B, H, d, D + 1)
            if log_k is None:
                kv = kv + update
            else:
                lt = log_k[..., t]
                r_new = torch.maximum(r, lt)
                kv = kv * torch.exp(r - r_new)[..., None, None] + update * torch.exp(lt - r_new)[..., None, None]
                r = r_new
            outs.append(phi_q[:, :, :, t] @ kv)  # (B, H_kv, g, D + 1)
        return self._normalise(torch.stack(outs, 3).reshape(B, H, T, -1)), kv, r

    def _state_form(self, q, k, v, causal, form):
        dtype = q.dtype
        q, k, v = (x.to(self.compute_dtype(dtype)) for x in (q, k, v))
        kv, r = self._empty_state(k)
        if not causal:  # every query reads the state of all keys
            kv, _ = self._absorb(k, v, kv, r)
            g = gqa.kv_groups(q, k)
            return self._normalise(gqa.unfold(gqa.fold(self.phi_query(q), g) @ kv, g)).to(dtype)
        p = k.shape[2] - q.shape[2]  # bottom-right: queries are the last Lq positions; keys before them are a prefix
        if p:
            kv, r = self._absorb(k[:, :, :p], v[:, :, :p], kv, r)
        return form(q, k[:, :, p:], v[:, :, p:], kv, r)[0].to(dtype)

    # -- backends -------------------------------------------------------------------------------
    def backend_reference(self, q, k, v, causal):
        dtype = q.dtype
        q, k, v = (x.to(self.compute_dtype(dtype)) for x in (q, k, v))
        phi_q, (phi_k, log_k) = self.phi_query(q), self.phi_key(k)
        B, H, Lq, d = phi_q.shape
        phi_q = phi_q.reshape(B, k.shape[1], H // k.shape[1], Lq, d)  # GQA: (B, H_kv, g, Lq, d)
        a = phi_q @ phi_k[:, :, None].transpose(-1, -2)  # (B, H_kv, g, Lq, Lk) unnormalised weights
        if log_k is not None:  # favor: rescale key j to the scale of query i, the max key logit it sees
            R = log_k.cummax(-1).values[..., k.shape[2] - q.shape[2]:] if causal else log_k.amax(-1, keepdim=True)
            a = a * torch.exp((log_k[:, :, None, None, :] - R[:, :, None, :, None]).clamp(max=0.0))
        if causal:
            a = a.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), 0.0)
        out = (a @ v[:, :, None]) / a.sum(-1, keepdim=True).clamp(min=self.config.eps)
        return out.reshape(B, H, Lq, -1).to(dtype)

    def backend_chunked(self, q, k, v, causal):
        return self._state_form(q, k, v, causal, self._chunked)

    def backend_recurrent(self, q, k, v, causal):
        return self._state_form(q, k, v, causal, self._recurrent)

    def backend_fla(self, q, k, v, causal):
        """fla's chunk kernel computes phi(q) S; the clamped normaliser is computed here in fp32 (fla adds 1e-10).

        The kernel is fed features in the inputs' dtype, as fla's own benchmarks do (it accumulates in
        fp32), so a bf16 row is a bf16 kernel. It takes one scale for all keys, so favor's causal
        stabiliser is split: keys are scaled to the global max logit c (exp(M_j - c) <= 1) and each query
        by exp(c - R_i), R_i its running max, which is exactly the other backends' exp(M_j - R_i) -- no
        output depends on a later key. Exact while key logits span less than ~80 (exp's range in fp32
        and bf16); past that the scaled keys underflow.
        """
        if not causal:  # no causal sum to fuse: the bidirectional form is two matmuls
            return self._state_form(q, k, v, causal, None)
        from fla.ops.linear_attn import chunk_linear_attn

        g = gqa.kv_groups(q, k)  # fla's chunk_linear_attn takes one key head per query head
        k, v = gqa.repeat_kv(k, g), gqa.repeat_kv(v, g)

        limit_fla_autotune()
        dtype, cdt = q.dtype, self.compute_dtype(q.dtype)
        kernel_dtype = dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32
        q, k, v = (x.to(cdt) for x in (q, k, v))
        phi_q, (phi_k, log_k) = self.phi_query(q), self.phi_key(k)
        p = k.shape[2] - q.shape[2]
        if log_k is not None:
            c = log_k.amax(-1, keepdim=True)  # (B, H, 1)
            running = log_k.cummax(-1).values[..., p:]  # (B, H, Lq): R_i over keys 0..p+i
            phi_k = phi_k * torch.exp(log_k - c)[..., None]
            phi_q = phi_q * torch.exp(c - running)[..., None]
        kv = phi_k[:, :, :p].transpose(-1, -2) @ _ones_column(v[:, :, :p])  # (B, H, d, D + 1) prefix state, 0 if p == 0
        bthd = lambda x: x.transpose(1, 2).to(kernel_dtype).contiguous()  # fla takes (B, T, H, K)
        kwargs = dict(scale=1.0, initial_state=kv[..., :-1].float().contiguous(), output_final_state=False, normalize=False)
        if "head_first" in inspect.signature(chunk_linear_attn).parameters:  # fla < 0.4 took (B, H, T, K) by default
            kwargs["head_first"] = False
        num, _ = chunk_linear_attn(bthd(phi_q), bthd(phi_k[:, :, p:]), bthd(v[:, :, p:]), **kwargs)
        z = kv[..., -1].unsqueeze(2) + phi_k[:, :, p:].cumsum(2)  # (B, H, Lq, d) running key sums
        den = (phi_q * z).sum(-1, keepdim=True)
        return (num.transpose(1, 2).to(cdt) / den.clamp(min=self.config.eps)).to(dtype)

    # -- cost -----------------------------------------------------------------------------------
    def flops(self, batch: int, heads: int, q_len: int, k_len: int, head_dim: int, causal: bool = True,
              kv_heads: int | None = None) -> int:
        """Useful FLOPs of one call in the linear (recurrent) form, 2 per MAC; the same causal or not, and not L^2.

        Per token, feature map: favor 2 D m (projection) + m (exp); elu1/relu D (one op per element),
        for queries and keys. Per key: phi(k)^T v into S, 2 d D, and phi(k) into z, d. Per query:
        phi(q) S, 2 d D, phi(q) . z, 2 d, and D divisions (d = d_phi). The chunked backend's extra
        intra-chunk products and favor's rescaling of the state (its stabiliser) are implementation
        costs, not counted. A call starts from an empty state, so all ``k_len`` keys are absorbed;
        a decoding step on a carried state absorbs one (:class:`RecurrentAttention`'s ``mode_flops``). With GQA the keys
        are absorbed once per key head (``kv_heads``), the queries read once per query head (``heads``). Training is
        counted 3x forward like every variant, although favor's projection is a fixed buffer with no weight gradient.
        """
        d = self.feature_dim(head_dim)
        feature = 2 * head_dim * d + d if self.config.feature_map == "favor" else head_dim
        per_key = feature + 2 * d * head_dim + d
        per_query = feature + 2 * d * head_dim + 2 * d + head_dim
        return batch * ((heads if kv_heads is None else kv_heads) * k_len * per_key + heads * q_len * per_query)

    def state_elements(self, batch: int, kv_heads: int, head_dim: int) -> int:
        """[S | z]: (d_phi x (D + 1)) per key head, and favor's running max key logit (one per key head)."""
        scale = batch * kv_heads if self.config.feature_map == "favor" else 0
        return batch * kv_heads * self.feature_dim(head_dim) * (head_dim + 1) + scale

    # -- incremental decoding -------------------------------------------------------------------
    def new_state(self, max_len: int = 0) -> LinearState:
        """A constant-size recurrent state; ``max_len`` is not needed (nothing grows with length)."""
        return LinearState()

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: LinearState) -> torch.Tensor:
        """New tokens q, k, v: (B, H, T, D) -> (B, H, T, D); T == 1 runs the recurrence, T > 1 (prefill) the chunks."""
        dtype = q.dtype
        q, k, v = (x.to(self.compute_dtype(dtype)) for x in (q, k, v))
        kv, r = (state.kv, state.log_scale) if state.kv is not None else self._empty_state(k)
        form, self.last_backend = (self._recurrent, "recurrent") if q.shape[2] == 1 else (self._chunked, "chunked")
        out, kv, r = form(q, k, v, kv, r)
        state.update(kv, r, q.shape[2])
        return out.to(dtype)


__all__ = ["LinearAttention", "LinearConfig", "LinearState"]
