"""Named checkpoint evaluations (``attn-bench accuracy --preset NAME``): a pretrained checkpoint, no training.

Each is one checkpoint and a list of groups, each group one plan (variants x positions x lengths x tasks); groups run
in order into one results file, most telling first, so a run cut short keeps the rows that matter. Sized for the
2-core CPU (results/README.md's checkpoint runs say what was cut). Backends are pinned where ``auto`` would compile
Flex: prompts of a real task vary in length, and Flex compiles one kernel per shape, so ``sliding_window`` runs
``blocked`` and ``block_sparse`` runs ``gathered`` (both exact, tested against the reference).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WINDOW = "sliding_window:window=1024,backend=blocked"
SINKS = "sliding_window:window=1024,sinks=4,backend=blocked"  # StreamingLLM: the window plus 4 attention sinks
# block-sparse with the window's budget: a 1024-token local band of 128-token blocks plus the first block, global
BLOCKS = "block_sparse:block_size=128,local_blocks=8,global_blocks=1,backend=gathered"
SMOLLM2_VARIANTS = ["full", WINDOW, SINKS, BLOCKS]
DEPTHS = (0.0, 0.5, 1.0)
# 2x the trained 8192 positions: each scaling with factor 2 (original_max_position_embeddings: the checkpoint's)
SCALINGS = ["checkpoint", "rope_yarn:factor=2", "rope_ntk:factor=2", "rope_dynamic:factor=2"]


# What a group gives each task unless it says otherwise (its examples per cell aside: ``Group.examples``)
BASE_CONFIG: dict[str, dict[str, Any]] = {"passkey": {"depths": DEPTHS}, "ruler": {"tasks": ("niah_single_1",)},
                                          "lm": {"eval_bytes": 1 << 15}, "selection": {"eval_bytes": 1 << 15}}


@dataclass(frozen=True)
class Group:
    """One plan of a checkpoint preset (``pretrained.plan``'s arguments). ``config``: task -> its fields over
    :data:`BASE_CONFIG`; ``examples``: per cell, for each task whose config counts them and ``config`` does not."""

    tasks: tuple[str, ...]
    variants: tuple[str, ...]
    eval_lens: tuple[int, ...]
    positions: tuple[str, ...] = ("checkpoint",)
    config: dict[str, dict[str, Any]] = field(default_factory=dict)
    examples: int = 3
    presses: tuple[str, ...] = ()  # KV presses, arms of every setting sharing its prefill (harness/accuracy/prefill.py)
    equal_memory: bool = False
    budgets: tuple[str, ...] = ()  # KV budgets sizing the presses and the `sized` variants (harness/accuracy/budgets.py)
    sized: tuple[str, ...] = ()
    query_aware: bool = False  # the presses compress the context with the question (kvpress's query_aware)

    def params(self) -> dict[str, dict[str, Any]]:
        """Each of its tasks' config fields (the examples per cell aside)."""
        return {t: {**BASE_CONFIG.get(t, {}), **self.config.get(t, {})} for t in self.tasks}


def ruler_config(*subtasks: str) -> dict[str, dict[str, Any]]:
    return {"ruler": {"tasks": subtasks}}  # RULER's subtasks in a group's config


@dataclass(frozen=True)
class CheckpointPreset:
    model: str
    groups: tuple[Group, ...]
    doc: str


def _smollm2() -> CheckpointPreset:
    v = tuple(SMOLLM2_VARIANTS)
    # ~2 h of one core here (measured when passkey's keys shared a haystack): a 16K prompt takes 3-7 min on one thread,
    # 8K ~1.5 min; each passkey example has a haystack of its own, so it costs a full prefill
    return CheckpointPreset("smollm2-135m", (
        Group(("passkey", "ruler", "lm"), v, (2048, 4096)),
        Group(("ruler",), v, (2048,), config=ruler_config("niah_multikey_1", "vt")),
        Group(("passkey", "ruler"), ("full",), (16384,), positions=tuple(SCALINGS), examples=1),
        Group(("passkey", "ruler", "lm"), v, (8192,), examples=1),
    ), "SmolLM2-135M: full, a 1024 window, the window + 4 sinks and block-sparse at 2K-8K; RoPE scalings at 16K")


def _gemma3() -> CheckpointPreset:
    # its own 5:1 pattern (the sliding layers' backend pinned: `own` would let auto compile Flex), all-global, all-local
    patterns = ("sliding_attention=sliding_window:backend=blocked", "full", "sliding_window:window=512,backend=blocked")
    return CheckpointPreset("gemma3-270m", (
        Group(("passkey", "ruler"), patterns, (4096, 8192)),
        Group(("passkey", "ruler"), patterns, (16384,), examples=1),  # all-global: ~7 min a 16K prompt on one thread
    ), "Gemma 3 270M: its own 5 sliding : 1 global pattern against all-global and all-local, 4K-16K")


# kvpress's presses most compared (its leaderboard), by their kvpress names
PRESSES = ("streaming_llm", "snapkv", "tova", "knorm", "expected_attention", "pyramidkv")


def _kvpress_smollm2() -> CheckpointPreset:
    def at(ratio: float) -> tuple[str, ...]:
        return tuple(f"{p}:compression_ratio={ratio}" for p in PRESSES)

    # one prefill per prompt serves every press (prefill.SharedPrefill); the equal-memory variants prefill their own
    return CheckpointPreset("smollm2-135m", (
        Group(("passkey", "ruler"), ("full",), (4096,), examples=8, presses=("none", *at(0.5)), equal_memory=True),
        Group(("passkey", "ruler"), ("full",), (4096,), examples=8, presses=at(0.75), equal_memory=True),
        Group(("ruler",), ("full",), (4096,), config=ruler_config("niah_multikey_1", "vt"), examples=8,
              presses=("none", *at(0.5))),
        Group(("passkey", "ruler"), ("full",), (8192,), examples=8, presses=("none", *at(0.5)), equal_memory=True),
    ), "SmolLM2-135M under kvpress's presses at ratios 0.5 and 0.75, beside the window, the window + sinks and "
       "block-sparse holding as many tokens, 4K (8K last)")


def _selective_smollm2() -> CheckpointPreset:
    # 512 keys per query (1/8 of 4K): a window, the window + 4 sinks, block-sparse (the first block and 7 local ones),
    # MoBA (its block and 7 routed 64-token blocks) and Quest (its page and 31 bounded 16-token pages); then the two
    # selectors at their defaults (256 keys) beside the 256 window
    budget = ("sliding_window:window=512,backend=blocked", "sliding_window:window=508,sinks=4,backend=blocked",
              "block_sparse:block_size=64,local_blocks=7,global_blocks=1,backend=gathered", "moba:block_size=64,topk=8",
              "quest:page_size=16,token_budget=512")
    defaults = ("sliding_window:window=256,backend=blocked", "moba", "quest")
    answered = ("full", budget[0], *budget[2:])
    return CheckpointPreset("smollm2-135m", (
        Group(("selection",), (*budget, *defaults), (4096, 8192)),
        # 4K only: after the cached prefix, a prompt's suffix is a call with Lq < Lk, where Quest selects (150 s an
        # example at 4K on 2 cores, 13x full's), so passkey and RULER at 8K did not fit the session that ran this
        Group(("passkey", "ruler"), answered, (4096,), examples=8),
    ), "SmolLM2-135M with attention that selects by content (MoBA, Quest) beside the window and block-sparse at the "
       "same 512-key budget: full attention's mass on the kept keys per layer at 4K and 8K, then passkey and RULER at 4K")


# -- the memory-quality frontier (harness/accuracy/budgets.py) ---------------------------------------------------
# Every press that runs on CPU with these models, the oracle (the ceiling of any selector of the budget), quantized
# caches at the bytes they meet, and full; the budgets as shares of the context. Passkey's 5 depths x 4 examples are
# one 20-example cell in the analysis (the same 20 prompts for every arm: paired).
FRONTIER_PRESSES = ("none", "oracle", *PRESSES, "keydiff", "quantized:nbits=4", "quantized:nbits=2")
FRONTIER_BUDGETS = ("1/2", "1/4", "1/8", "1/16")
FRONTIER_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
FRONTIER_RULER = ("niah_single_1", "niah_multikey_1")


def frontier_config(*subtasks: str) -> dict[str, dict[str, Any]]:  # passkey: 5 depths x 4 keys; RULER: the group's 20
    return {"passkey": {"depths": FRONTIER_DEPTHS, "eval_examples": 4}, **ruler_config(*subtasks)}


def _frontier_presses(L: int, ruler: tuple[str, ...], tasks: tuple[str, ...] = ("passkey", "ruler"),
                      budgets: tuple[str, ...] = FRONTIER_BUDGETS, variant: str = "full") -> Group:
    """Every press arm at each budget, the oracle, quantized caches and full: one shared prefill per prompt."""
    return Group(tasks, (variant,), (L,), config=frontier_config(*ruler), examples=20, presses=FRONTIER_PRESSES, budgets=budgets)


def _frontier_variants(L: int, ruler: tuple[str, ...], tasks: tuple[str, ...] = ("passkey", "ruler"),
                       sized: tuple[str, ...] = ("sliding_window", "sinks", "block_sparse", "moba", "quest")) -> Group:
    """The attention variants sized to 1/8 of the cache: each a model with a prefill of its own."""
    return Group(tasks, (), (L,), config=frontier_config(*ruler), examples=20, budgets=("1/8",), sized=sized)


def _frontier_smollm2() -> CheckpointPreset:
    # groups in the order a cut run keeps most: the press grid at 4K, the sized variants there (passkey: each is a
    # prefill of its own per prompt), 8K (the length the frontier is quoted at; RULER there at 1/8 only), the presses
    # query-aware, Quest (13x full's time a prompt) last
    pk, fixed = ("passkey",), ("sliding_window", "sinks", "block_sparse", "moba")
    return CheckpointPreset("smollm2-135m", (
        _frontier_presses(4096, FRONTIER_RULER), _frontier_variants(4096, FRONTIER_RULER, pk, fixed),
        _frontier_presses(8192, FRONTIER_RULER, pk), _frontier_variants(8192, FRONTIER_RULER, pk, fixed[:3]),
        _frontier_presses(8192, ("niah_single_1",), ("ruler",), ("1/8",)), _frontier_variants(8192, FRONTIER_RULER, pk,
                                                                                             fixed[3:]),
        Group(("passkey", "ruler"), ("full",), (4096,), config=frontier_config("niah_single_1"), examples=20,
              presses=(*PRESSES, "keydiff"),
              budgets=("1/8",), query_aware=True),
        _frontier_variants(4096, FRONTIER_RULER, pk, ("quest",)),
    ), "SmolLM2-135M: every press at 1/2-1/16 of the cache, the oracle, quantized caches and full, then the variants "
       "sized to 1/8; passkey (5 depths x 4) and RULER, 20 examples a cell; 4K, then 8K; the presses query-aware at "
       "1/8 and 4K")


def _frontier_qwen() -> CheckpointPreset:
    # ~4x SmolLM2's time a prompt: at 8K the budgets are cut to 1/8 (the one the frontier is quoted at), and 8K comes
    # before the second RULER task and the variants (results/README.md)
    pk = ("passkey",)
    return CheckpointPreset("qwen2.5-coder-0.5b", (
        _frontier_presses(4096, ("niah_single_1",)), _frontier_presses(8192, FRONTIER_RULER, pk, ("1/8",)),
        _frontier_presses(4096, ("niah_multikey_1",), ("ruler",)),
        _frontier_variants(4096, FRONTIER_RULER, pk, ("sliding_window", "sinks", "block_sparse", "moba")),
        _frontier_variants(8192, FRONTIER_RULER, pk, ("sliding_window", "sinks", "block_sparse", "moba")),
    ), "Qwen2.5-Coder-0.5B (14 query / 2 KV heads): the frontier grid of frontier-smollm2-cpu, 4K first; at 8K the "
       "presses at 1/8 only")


def _frontier_gemma3() -> CheckpointPreset:
    # its own pattern (5 sliding layers of 512 : 1 global), the presses and the oracle on its global layers only
    # (kvpress's rule: attn/hf/layers.py window_layers); no sized variants (a budget for its global layers alone is
    # not built); 8K at 1/8 only, as for Qwen
    own, pk = "sliding_attention=sliding_window:backend=blocked", ("passkey",)
    return CheckpointPreset("gemma3-270m", (
        _frontier_presses(4096, FRONTIER_RULER, pk, variant=own),
        _frontier_presses(8192, FRONTIER_RULER, pk, ("1/8",), variant=own),
        _frontier_presses(4096, ("niah_single_1",), ("ruler",), ("1/8",), variant=own),
        _frontier_presses(4096, ("niah_multikey_1",), ("ruler",), ("1/8",), variant=own),
    ), "Gemma 3 270M, its own 5 sliding : 1 global pattern: every press on the global layers at 1/2-1/16, the oracle, "
       "quantized caches and full; passkey at 4K, then 8K at 1/8, then RULER at 4K at 1/8")


RULER_TASKS = ("niah_single_1", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "niah_multivalue",
               "niah_multiquery", "vt", "cwe", "fwe")  # every RULER task the project generates (ruler_data.py)


def _frontier_gpu() -> CheckpointPreset:
    return CheckpointPreset("qwen2.5-coder-0.5b", tuple(
        g for L in (8192, 16384, 32768) for g in (_frontier_presses(L, RULER_TASKS), _frontier_variants(L, RULER_TASKS))),
        "Qwen2.5-Coder-0.5B at 8K-32K on a GPU: every RULER task (docs/gpu.md)")


# -- the task probe (harness/analysis/probe.py) ----------------------------------------------------------------------
# Full attention (Gemma 3: its own pattern) on 8 examples of every RULER task at each length: a task enters a model's
# frontier at a length where full scores between 0.5 and 0.95 there, room above for a method to lose and below 1 for
# the oracle to show a gap. Shortest length first, so a cut run keeps whole lengths.
def _probe(model: str, variant: str, lens: tuple[int, ...], doc: str) -> CheckpointPreset:
    return CheckpointPreset(model, tuple(Group(("ruler",), (variant,), (L,), config=ruler_config(*RULER_TASKS), examples=8)
                                         for L in lens), doc)


# -- dynamic sparse prefill (attn/attention/prompt_sparse.py) on the frontier ----------------------------------------
# The three methods at about 1/8 and 1/4 of the prefill's causal pairs (budgets.PREFILL_AT), block_sparse at 1/16 of
# the cache beside them (512 keys a query at 8K: about 1/8 of the causal pairs, its prefill density), the same
# passkey and RULER prompts as frontier-smollm2-cpu (paired with its rows: read both files together). Two presets
# so two processes share the 2 cores: 8K passkey, then 8K RULER with the selection task. The settings were measured
# at 4K (budgets.PREFILL_AT); at 8K the "1/8" ones compute about 1/14 of the pairs and the "1/4" ones about 1/8.
PREFILL_METHODS = ("xattention", "flexprefill", "vertical_slash")
# what budgets.prefill_sized and budgets.sized give at 8K for 1/8 and for 512 keys (tests/test_prompt_sparse.py checks
# it; presets cannot import budgets, which imports the plan)
PREFILL_AT_8K = ("xattention:threshold=0.5", "flexprefill:gamma=0.6,min_budget=128",
                 "vertical_slash:vertical_size=100,slash_size=180")
BLOCK_SPARSE_512 = "block_sparse:block_size=64,local_blocks=7,global_blocks=1,backend=gathered"


def _prefill_group(L: int, tasks: tuple[str, ...], budget: str, sized: tuple[str, ...] = PREFILL_METHODS) -> Group:
    return Group(tasks, (), (L,), config=frontier_config("niah_single_1"), examples=20, budgets=(budget,), sized=sized)


def _prefill_passkey() -> CheckpointPreset:
    pk = ("passkey",)
    return CheckpointPreset("smollm2-135m", (
        _prefill_group(8192, pk, "1/8"), _prefill_group(8192, pk, "1/4"), _prefill_group(4096, pk, "1/8"),
        _prefill_group(4096, pk, "1/4"),
    ), "SmolLM2-135M: vertical_slash, flexprefill and xattention at ~1/8, then ~1/4 of the prefill's pairs on passkey "
       "(5 depths x 4), 8K then 4K")


def _prefill_ruler() -> CheckpointPreset:
    return CheckpointPreset("smollm2-135m", (
        _prefill_group(8192, ("ruler",), "1/8"), Group(("selection",), (*PREFILL_AT_8K, BLOCK_SPARSE_512), (8192,)),
        _prefill_group(8192, ("ruler",), "1/16", ("block_sparse",)), _prefill_group(8192, ("ruler",), "1/4"),
    ), "SmolLM2-135M: the three dynamic prefills at ~1/8 of the prefill's pairs on RULER niah_single_1 (20), the "
       "attention mass each keeps (selection), block_sparse at about the same density, then ~1/4 on RULER; 8K")


# -- retrieval (attn/hf/retrieval.py) on the frontier ----------------------------------------------------------------
# BM25 and dense retrieval at the frontier's budgets on its prompts (pairs with frontier-*-cpu's rows), the model's own
# keys at 1/8; in SmolLM2 at 8K an aggregation task (fwe: full scores 0 on cwe there) with every press, the oracle, full
# and the best sized variant beside retrieval. A retrieval arm prefills only what it keeps: it shares no prefill.
RETRIEVERS, KEYS = ("retrieval:retriever=bm25", "retrieval:retriever=dense"), ("retrieval:retriever=keys",)
AGGREGATION, THREE = "fwe", FRONTIER_BUDGETS[1:]
PK_RULER = ("passkey", "ruler")


def _retrieval_group(L: int, tasks: tuple[str, ...], ruler: tuple[str, ...], presses: tuple[str, ...] = RETRIEVERS,
                     budgets: tuple[str, ...] = THREE) -> Group:
    return Group(tasks, ("full",), (L,), config=frontier_config(*ruler), examples=20, presses=presses, budgets=budgets)


def _retrieval_smollm2() -> CheckpointPreset:
    # 1/2 on passkey only (its presses' budgets; ~100 s a prompt with it); fwe: block_sparse, best sized on passkey
    return CheckpointPreset("smollm2-135m", (
        _retrieval_group(8192, ("passkey",), FRONTIER_RULER[:1], budgets=FRONTIER_BUDGETS),
        _retrieval_group(8192, ("ruler",), FRONTIER_RULER[:1]), _retrieval_group(8192, PK_RULER, ("niah_single_1",),
                                                                                 KEYS, ("1/8",)),
        _retrieval_group(8192, ("ruler",), (AGGREGATION,), (*FRONTIER_PRESSES, *RETRIEVERS, *KEYS), ("1/8",)),
        Group(("ruler",), (), (8192,), config=ruler_config(AGGREGATION), examples=20, budgets=("1/8",),
              sized=("block_sparse",)),
    ), "SmolLM2-135M at 8K: BM25 and dense retrieval at 1/2-1/16 of the context on passkey (5 depths x 4), 1/4-1/16 on "
       "RULER niah_single_1, the model's own keys at 1/8; fwe with every press, the oracle, full and block-sparse at 1/8 "
       "beside retrieval")


def _retrieval_smollm2_4k() -> CheckpointPreset:
    # a file of its own, so it ran beside the 8K one once the Qwen run had finished
    return CheckpointPreset("smollm2-135m", (
        _retrieval_group(4096, PK_RULER, FRONTIER_RULER), _retrieval_group(4096, PK_RULER, FRONTIER_RULER, KEYS, ("1/8",)),
    ), "SmolLM2-135M at 4K: BM25 and dense retrieval at 1/4-1/16 of the context, the model's own keys at 1/8, on "
       "passkey (5 depths x 4), RULER niah_single_1 and niah_multikey_1")


def _retrieval_qwen() -> CheckpointPreset:
    groups = (_retrieval_group(8192, PK_RULER, FRONTIER_RULER[:1]),
              _retrieval_group(4096, PK_RULER, FRONTIER_RULER[:1], budgets=FRONTIER_BUDGETS))
    return CheckpointPreset("qwen2.5-coder-0.5b", groups, "Qwen2.5-Coder-0.5B: BM25 and dense retrieval on passkey (5 "
                            "depths x 4) and RULER niah_single_1, at 1/4-1/16 of the context at 8K, then 1/2-1/16 at 4K")


# -- the frontier where it discriminates: Qwen2.5-Coder-0.5B (trained to 32K) at 4K, 8K and 16K -----------------------
# Each length's RULER tasks are the ones its probe keeps (probe-qwen-cpu: full between 0.5 and 0.95 on 8 examples); at
# 4K six of nine; 8K uses the same six until its probe has run, 16K those its probe has not put out (results/README.md
# says which probe chose each). Passkey: 5 depths x 4 haystacks, 20 independent draws a cell. The press grid at 1/8
# first at every length (16K first: a cut run drops lengths from the shorter end, never 16K), then the other budgets
# (512 tokens only at 16K: at 4K and 8K it is 1/8 and 1/16 again), the leaders the leaderboard ranks first (AdaKV around
# ExpectedAttention and SnapKV, ChunkKV, CriticalKV), KVzip in groups of its own right after the 1/8 grid (its prefill
# is its own, two to three times a plain one; the other presses that prefill themselves come after the budgets), then
# the sized variants, the dynamic prefills and retrieval at 1/8, the text read after a compressed context (continuation,
# bits per byte: 20 windows) and the presses query-aware.
LEADERS = ("adakv(expected_attention)", "adakv(snapkv)", "chunkkv(snapkv)", "criticalkv(snapkv)")
# every other kvpress press, at 1/8 after the grid: the ones that replay the shared prefill (cheap arms), DuoAttention,
# ThinK and SimLayerKV as given (their budget is not a share of the tokens; DuoAttention's head patterns and
# QFilter's filters are downloads, which their rows say), and those that prefill themselves beside KVzip
OTHERS = ("lagkv", "leveragescore", "cur", "compactor", "noncausalattn", "random", "cap", "qfilter", "observed_attention",
          "expected_attention_stats", "lukv(snapkv)", "block(snapkv)", "keyrerotation(snapkv)",
          "entropygatedchunkkv(snapkv)", "chunk(snapkv)", "merging(snapkv)", "duo_attention:head_compression_ratio=0.875",
          "think:key_channel_compression_ratio=0.875", "simlayerkv")
OWN_PREFILL = ("kvzip", "finch", "kvcompose", "fastkvzip", "restorekv", "kvgrad")
QWEN_4K = ("niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery", "cwe", "fwe")
# 16K: 4K's six less the ones its probe puts out (probe-qwen-cpu at 16K, full on 8 examples: niah_multikey_3 and cwe
# below 0.5), plus one at 4K's ceiling that 16K brings into range (niah_multikey_1: 5 of 8; niah_single_1 stays at 8
# of 8), last: the grid's cells already run keep their order
QWEN_16K = (*(t for t in QWEN_4K if t not in ("niah_multikey_3", "cwe")), "niah_multikey_1")
# 8K: 4K's six less the ones its probe puts out (niah_multikey_3 and cwe below 0.5); fwe, not reached yet, keeps 4K's
QWEN_8K = tuple(t for t in QWEN_4K if t not in ("niah_multikey_3", "cwe"))
PROBED = {4096: QWEN_4K, 8192: QWEN_8K, 16384: QWEN_16K}


def _frontier_probed(probed: dict[int, tuple[str, ...]], variant: str = "full", sized: bool = True) -> tuple[Group, ...]:
    """The groups of a probed frontier (``probed``: length -> the RULER tasks its probe keeps, none: passkey alone);
    ``sized``: with the sized variants and the dynamic prefills (a model of layer types has no budget for them)."""
    order = sorted(probed, key=lambda L: (L != max(probed), L))  # the longest first, then the rest from the shortest
    arms = (*FRONTIER_PRESSES, *LEADERS)

    def group(L: int, presses: tuple[str, ...] = (), budgets: tuple[str, ...] = ("1/8",), **kw: Any) -> Group:
        tasks = ("passkey", "ruler") if probed[L] else ("passkey",)
        return Group(tasks, (variant,) if presses else (), (L,), config=frontier_config(*probed[L]) if probed[L] else
                     {"passkey": frontier_config()["passkey"]}, examples=20, presses=presses, budgets=budgets, **kw)

    families = (("sliding_window", "sinks", "block_sparse", "moba", "quest"), PREFILL_METHODS) if sized else ()
    return (*(group(L, arms, ("1/8", *(("512",) if L >= 16384 else ()))) for L in order),
            *(group(L, OWN_PREFILL[:1]) for L in order),  # KVzip, the leaderboard's first, before the rest
            *(group(L, OTHERS) for L in order),
            *(group(L, arms, ("1/2", "1/4", "1/16")) for L in order),
            *(group(L, OWN_PREFILL[1:]) for L in order),
            *(group(L, sized=f) for f in families for L in order),
            *(group(L, (*RETRIEVERS, "none")) for L in order),
            *(Group(("continuation",), (variant,), (L,), examples=20, presses=arms, budgets=("1/8",)) for L in order),
            *(group(L, FRONTIER_PRESSES[:1] + PRESSES + ("keydiff",), query_aware=True) for L in order))


CHECKPOINT_PRESETS: dict[str, CheckpointPreset] = {
    "smollm2-cpu": _smollm2(), "gemma3-cpu": _gemma3(), "kvpress-smollm2-cpu": _kvpress_smollm2(),
    "selective-smollm2-cpu": _selective_smollm2(),
    # the memory-quality frontier: ~3 h of 2 shared cores for both (results/README.md says what was cut)
    "frontier-smollm2-cpu": _frontier_smollm2(), "frontier-qwen-cpu": _frontier_qwen(),
    "frontier-gemma3-cpu": _frontier_gemma3(), "frontier-gpu": _frontier_gpu(),
    "prefill-passkey-smollm2-cpu": _prefill_passkey(), "prefill-ruler-smollm2-cpu": _prefill_ruler(),
    "retrieval-smollm2-cpu": _retrieval_smollm2(), "retrieval-smollm2-4k-cpu": _retrieval_smollm2_4k(),
    "retrieval-qwen-cpu": _retrieval_qwen(),
    # ~1 h a length of one core for Qwen at 4K in bfloat16, twice that at 8K; SmolLM2 minutes, Gemma 3 tens of minutes
    "probe-qwen-cpu": _probe("qwen2.5-coder-0.5b", "full", (4096, 8192, 16384),
                             "Qwen2.5-Coder-0.5B: full attention on 8 examples of every RULER task at 4K, 8K and 16K; "
                             "~1 hour of one core at 4K in bfloat16, twice that at 8K"),
    "probe-gemma3-cpu": _probe("gemma3-270m", "sliding_attention=sliding_window:backend=blocked", (4096, 8192),
                               "Gemma 3 270M, its own pattern: 8 examples of every RULER task at 4K and 8K"),
    "probe-smollm2-cpu": _probe("smollm2-135m", "full", (4096,), "SmolLM2-135M: 8 examples of every RULER task at 4K"),
    # estimated from the probe's prompt times (Qwen, one arm: ~40 s a 4K prompt on one core) and the arms' batched
    # cost: about 30 hours of 2 cores for the 1/8 grid (100-140 prompts a length; 16K two thirds of it), over 100 for
    # everything -- past the 1/8 grid, a lent GPU's job (frontier-gpu); bfloat16 where the machine runs it faster
    "frontier-qwen-16k-cpu": CheckpointPreset("qwen2.5-coder-0.5b", _frontier_probed(PROBED),
                                              "Qwen2.5-Coder-0.5B at 16K, 4K and 8K on passkey (20 haystacks) and the "
                                              "RULER tasks its probe keeps: every press, the leaders, the oracle, "
                                              "quantized caches and full at 1/8, then KVzip, 1/2-1/16, the sized "
                                              "variants, the dynamic prefills, retrieval, continuation bits per byte, "
                                              "the presses query-aware. Measured on one core in bfloat16: ~1 min a 4K "
                                              "passkey prompt, ~1.7 min a 4K RULER prompt (15 arms), ~6.5 min a 16K "
                                              "prompt (27 arms), ~2 min a 4K prompt for KVzip alone, so the 1/8 grid "
                                              "(20 prompts a task: 140 at 4K, 100 at 8K, 120 at 16K) is ~4 hours at 4K "
                                              "and ~15 at 16K; in float32 on one AVX2 core ~3.5 min an 8K passkey "
                                              "prompt, ~4 min an 8K RULER prompt (15 arms); everything past 100 "
                                              "hours: one process a length (--eval-lens L) or a task (--task, "
                                              "--subtask), resumable (--resume)"),
    # Gemma 3's own pattern, the presses on its global layers (kvpress's rule); its probe keeps no RULER task at 4K
    # (full below 0.5 on each: passkey alone there) and niah_single_1 at 8K; KVzip refuses Gemma 3 (its rows say so).
    # About 6 hours of 2 cores.
    "frontier-gemma3-8k-cpu": CheckpointPreset("gemma3-270m", _frontier_probed(
        {4096: (), 8192: ("niah_single_1",)}, "sliding_attention=sliding_window:backend=blocked", sized=False),
        "Gemma 3 270M, its own pattern, at 8K and 4K on passkey (20 haystacks) and the RULER task its 8K probe keeps "
        "(niah_single_1): every press and the leaders on its "
        "global layers, the oracle, quantized caches and full at 1/8, then 1/2-1/16, retrieval, continuation bits "
        "per byte, the presses query-aware"),
    # SmolLM2 stays at 4K (8K is the end of its context): passkey's 20 haystacks and the one RULER task its probe keeps
    "frontier-smollm2-4k-cpu": CheckpointPreset("smollm2-135m", _frontier_probed({4096: ("niah_multikey_1",)}),
                                                "SmolLM2-135M at 4K on passkey (20 haystacks) and the RULER task its "
                                                "probe keeps (niah_multikey_1): every press, the leaders, the oracle, "
                                                "quantized caches and full at 1/8, then KVzip, the other presses, "
                                                "1/2-1/16, the sized variants, the dynamic prefills, retrieval, "
                                                "continuation bits per byte, the presses query-aware. Measured on one "
                                                "core in float32 (AVX2): under a minute a prompt for the 1/8 grid's 15 "
                                                "arms (40 prompts), ~2.5 min a prompt for KVzip alone, ~2.5 min a "
                                                "continuation window for its 16 arms with KVzip (20 windows)"),
}


__all__ = ["BASE_CONFIG", "CHECKPOINT_PRESETS", "RULER_TASKS", "CheckpointPreset", "Group", "frontier_config",
           "ruler_config"]
