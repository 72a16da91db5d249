"""The blocked sliding window's query chunks when they need more than key-span views and one shared bool mask.

Sink tokens in front of every span make the spans copies; ALiBi's bias and the sink logit differ per head; a softcap
needs explicit scores. Formed for all n chunks at once that is O(B H L w) memory (6.5 GB at 1M tokens), so the chunks
go a group at a time, each group's copies and per-head floats bounded by a byte budget.
"""
from __future__ import annotations

import torch

from attn.attention import score_terms
from attn.attention.alibi import alibi_bias


def chunk_groups(qq: torch.Tensor, k_spans: torch.Tensor, v_spans: torch.Tensor, mask: torch.Tensor,
                 sink_kv: tuple[torch.Tensor, torch.Tensor] | None, batch: int, budget: int, *, groups: int = 1,
                 softcap: float = 0.0, positions: tuple[torch.Tensor, torch.Tensor] | None = None,
                 slopes: torch.Tensor | None = None, sink: torch.Tensor | None = None) -> torch.Tensor:
    """Attend every chunk, a group of chunks at a time: -> (n, B H_kv, G c, D).

    qq (n, B H_kv, G c, D): chunk n's queries, the G query heads of a key head one after another (G-major rows);
    k_spans, v_spans (n, B H_kv, span, D); mask (n, G c, keys) bool; ``sink_kv``: the sink tokens' keys and values
    (1, B H_kv, s, D), put in front of every span (keys = s + span); ``positions``: absolute positions of chunk n's
    queries (n, c) and keys (n, keys), for ALiBi's ``slopes`` (H,); ``sink``: sink logits (H,); ``budget``: bytes.
    """
    n, bh, gc, D = qq.shape
    g, kv = groups, bh // batch
    c = gc // g
    keys = k_spans.shape[2] + (0 if sink_kv is None else sink_kv[0].shape[2])
    size = qq.element_size()
    per_chunk = bh * keys * D * size  # the key spans with the sinks in front (and as much for the values)
    if sink is not None:  # queries, keys and values with the sink's channels
        per_chunk += bh * (gc + 2 * keys + 2) * (D + 8) * size
    if slopes is not None or softcap:  # a float32 bias / explicit scores per head, and their masked copy
        per_chunk += bh * gc * (keys + 1) * 8
    step = max(1, budget // per_chunk)
    sink_rows = None
    if sink is not None:  # (1, B H_kv, G c, 1): the logit of each row's query head
        sink_rows = sink.view(1, 1, kv, g, 1).expand(1, batch, kv, g, c).reshape(1, bh, gc, 1)
    outs = []
    for i in range(0, n, step):
        part = slice(i, i + step)
        ks, vs = k_spans[part], v_spans[part]
        m = ks.shape[0]
        if sink_kv is not None:
            ks = torch.cat([sink_kv[0].expand(m, -1, -1, -1), ks], 2)
            vs = torch.cat([sink_kv[1].expand(m, -1, -1, -1), vs], 2)
        bias = None
        if slopes is not None:  # (H, m, c, keys) -> rows as qq holds them: (m, B H_kv, G c, keys)
            bias = alibi_bias(slopes, positions[0][part], positions[1][part]).unflatten(0, (kv, g))
            bias = bias.permute(2, 0, 1, 3, 4)[:, None].expand(m, batch, kv, g, c, keys).reshape(m, bh, gc, keys)
        outs.append(score_terms.masked_attention(qq[part], ks, vs, mask[part][:, None], bias, sink_rows, softcap))
    return torch.cat(outs)


__all__ = ["chunk_groups"]
