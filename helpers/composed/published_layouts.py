"""Layouts that others published for Llama and mixture-of-experts training, each with the
source it is read from.

Each entry says what ran (or what a preset configures): the model, the GPUs, the tensor-
(``tp``), context- (``cp``), pipeline- (``pp``) and data-parallel (``dp``) degrees, the
expert-parallel degree (``ep``, ranks borrowed from ``dp``), the sequence length, the
sequences per data-parallel rank and per step, and the activation checkpointing, as the
source states them; a value the source does not state is ``None`` (or ``-``). Links are
pinned to the commit read. Only the Llama 2 70B entries have this course's
``LLAMA_70B_SHAPE``: Llama 3 models have another vocabulary (and 8B its own widths).

``PUBLISHED_MOE``: DeepSeek-V3's training run, from its technical report, and Megatron-LM's
reference mapping for Mixtral 8x7B. Mixtral's own training layout is not published: its
paper (arXiv:2401.04088) gives the architecture (Table 1), not how it was trained.
:func:`compare_moe` sizes each with the estimator and sets it beside the layout search of
the same cluster; :func:`moe_layout_table` prints both models.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from helpers.composed.layout_search import (
    CARD,
    SHARDING,
    Candidate,
    Search,
    describe,
    search_layouts,
)
from helpers.core.sizes import format_bytes
from helpers.memory.fits import ClusterLayout, per_gpu
from helpers.memory.moe import DEEPSEEK_V3_SHAPE, MIXTRAL_8X7B_SHAPE

_GITHUB = "https://github.com/"
_TT = _GITHUB + "pytorch/torchtitan/blob/"
_TT_2024_04 = _TT + "157a12c562288b3bccb077003a97f18a4ca657aa/"  # 2024-04-24
_TT_2025_06 = _TT + "820504e20d1149fbf0b98c567af24c4b0433b22d/"  # 2025-06-13
_BENCH = _TT_2025_06 + "benchmarks/llama3_h100_202412_torchtitan.md"
_LLAMA3 = "https://arxiv.org/abs/2407.21783"
_DSV3 = "https://arxiv.org/abs/2412.19437"
MOE_SHAPES = {"DEEPSEEK_V3_SHAPE": DEEPSEEK_V3_SHAPE, "MIXTRAL_8X7B_SHAPE": MIXTRAL_8X7B_SHAPE}
_MCORE_MOE = (_GITHUB + "NVIDIA/Megatron-LM/blob/c230e0d7c2986e790c5c10b0e33318d6a4f4a9a5/"
              "megatron/core/transformer/moe/README.md")  # 2024-11-21


@dataclass(frozen=True)
class PublishedLayout:
    """One published layout; ``gpus`` must equal tp x cp x pp x dp."""

    source: str  # who, and which table or file
    url: str
    model: str
    hardware: str
    gpus: int
    tp: int
    pp: int
    dp: int
    sharding: str
    recompute: str  # activation checkpointing, in the source's words
    seq: int | None = None
    per_dp: int | None = None  # sequences per data-parallel rank per step
    global_batch: int | None = None  # sequences per step
    cp: int = 1
    course_shape: str = ""  # the LLAMA_*_SHAPE of this course it matches, if any
    measured: bool = True  # a run that was measured, not a preset configuration
    note: str = ""
    ep: int = 1  # expert-parallel ranks, borrowed from the dp ranks

    def __post_init__(self) -> None:
        if self.ep < 1 or self.dp % self.ep:
            raise ValueError(f"{self.source}: ep={self.ep} does not divide dp={self.dp}; "
                             "valid: a divisor of dp (expert-parallel ranks are dp ranks)")
        if self.tp * self.cp * self.pp * self.dp != self.gpus:
            raise ValueError(f"{self.source}: tp x cp x pp x dp = {self.tp * self.cp * self.pp * self.dp}"
                             f", not the {self.gpus} GPUs it states; valid: a product equal to gpus")
        if None not in (self.per_dp, self.global_batch) and self.per_dp * self.dp != self.global_batch:
            raise ValueError(f"{self.source}: {self.per_dp} per rank x dp {self.dp} != global "
                             f"batch {self.global_batch}; valid: per_dp * dp == global_batch")

    def layout(self) -> str:
        """The degrees, e.g. 'TP 8 x PP 16 x FSDP 64' or 'PP 16 x ZeRO-1 128 (EP 64)'."""
        parts = [f"TP {self.tp}", f"CP {self.cp}", f"PP {self.pp}", f"{self.sharding} {self.dp}"]
        text = " x ".join(p for p in parts if not p.endswith(" 1")) or "one GPU"
        return text + (f" (EP {self.ep})" if self.ep > 1 else "")


PUBLISHED = (
    PublishedLayout(
        "torchtitan docs/performance.md, Llama 2 table (70B, local batch 2, full AC)",
        _TT_2024_04 + "docs/performance.md", "Llama 2 70B", "A100 80GB", 64, tp=1, pp=1, dp=64,
        sharding="FSDP", recompute="full", seq=4096, per_dp=2, global_batch=128,
        course_shape="LLAMA_70B_SHAPE",
        note="measured (353 WPS, 50.5% MFU); seq: the page's 'default sequence length in "
             "Llama 2', 4096"),
    PublishedLayout(
        "torchtitan train_configs/llama2_70b.toml (preset for 64 A100 GPUs)",
        _TT_2024_04 + "train_configs/llama2_70b.toml", "Llama 2 70B", "A100", 64, tp=8, pp=1,
        dp=8, sharding="FSDP", recompute="full", seq=4096, per_dp=16, global_batch=128,
        course_shape="LLAMA_70B_SHAPE", measured=False,
        note="data_parallel_degree = -1 (the rest of the GPUs); the tensor-parallel plan "
             "splits the norms by sequence (SequenceParallel, torchtitan/parallelisms/"
             "parallelize_llama.py of the same commit)"),
    PublishedLayout(
        "torchtitan llama3_8b.toml (preset for 64 A100 GPUs)",
        _TT_2025_06 + "torchtitan/models/llama3/train_configs/llama3_8b.toml", "Llama 3 8B",
        "A100", 64, tp=1, pp=1, dp=64, sharding="FSDP", recompute="selective", seq=8192,
        per_dp=1, global_batch=64, measured=False,
        note="data_parallel_shard_degree = -1 (the rest of the GPUs)"),
    PublishedLayout(
        "torchtitan llama3_70b.toml (preset for 64 A100 GPUs)",
        _TT_2025_06 + "torchtitan/models/llama3/train_configs/llama3_70b.toml", "Llama 3 70B",
        "A100", 64, tp=8, pp=1, dp=8, sharding="FSDP", recompute="full", seq=8192, per_dp=8,
        global_batch=64, measured=False,
        note="data_parallel_shard_degree = -1 (the rest of the GPUs)"),
    PublishedLayout(
        "torchtitan benchmark (Dec 2024), Table 1", _BENCH, "Llama 3.1 8B", "H100 96GB", 8,
        tp=1, pp=1, dp=8, sharding="FSDP", recompute="selective", per_dp=2, global_batch=16,
        note="measured: 82.4 GiB peak (without compile or Float8)"),
    PublishedLayout(
        "torchtitan benchmark (Dec 2024), Table 4", _BENCH, "Llama 3.1 70B", "H100 96GB", 256,
        tp=8, pp=1, dp=32, sharding="FSDP", recompute="full", per_dp=16, global_batch=512,
        note="with torch.compile and Float8"),
    PublishedLayout(
        "torchtitan benchmark (Dec 2024), Table 5", _BENCH, "Llama 3.1 405B", "H100 96GB", 512,
        tp=8, pp=8, dp=8, sharding="FSDP", recompute="full", per_dp=32, global_batch=256,
        note="1F1B and interleaved 1F1B; with torch.compile, Float8, async TP"),
    PublishedLayout(
        "Llama 3 paper (arXiv:2407.21783), Table 4, first row", _LLAMA3, "Llama 3 405B",
        "H100 80GB", 8192, tp=8, pp=16, dp=64, sharding="FSDP", recompute="none", seq=8192,
        per_dp=32, global_batch=2048,
        note="16M tokens per batch; weights not resharded after forward; 8K sequences trained "
             "without activation checkpointing (Section 3.3.2)"),
    PublishedLayout(
        "Llama 3 paper (arXiv:2407.21783), Table 4, second row", _LLAMA3, "Llama 3 405B",
        "H100 80GB", 16384, tp=8, pp=16, dp=128, sharding="FSDP", recompute="none", seq=8192,
        per_dp=16, global_batch=2048, note="as above, on twice the GPUs: half the batch per rank"),
)


PUBLISHED_MOE = (
    PublishedLayout(
        "DeepSeek-V3 technical report (arXiv:2412.19437), Sections 3.1, 3.2 and 4.2", _DSV3,
        "DeepSeek-V3", "H800 80GB", 2048, tp=1, pp=16, dp=128, ep=64, sharding="ZeRO-1",
        recompute="selective", seq=4096, per_dp=120, global_batch=15360,
        course_shape="DEEPSEEK_V3_SHAPE",
        note="measured: 180K H800 GPU hours per trillion tokens, 3.7 days on the 2048 GPUs; "
             "2664K GPU hours for the 14.8T tokens of pre-training (Section 1, Table 1). "
             "EP 64 spans 8 nodes, no TP (Section 3.2); DualPipe keeps two copies of the "
             "parameters and PP + 1 micro-batches of activations (Section 3.2.1, Table 2); "
             "RMSNorm and the MLA up-projections recomputed (Section 3.2.3); FP8 mixed "
             "precision, some activations cached in FP8, AdamW moments in BF16 (Section 3.3); "
             "4K sequences, batch 15360 after a ramp from 3072 (Section 4.2)"),
    PublishedLayout(
        "Megatron-LM MoE README, 'Reference Best Parallel Mapping' (MCore v0.8), Mixtral "
        "8x7B (dropless)", _MCORE_MOE, "Mixtral 8x7B", "H100 80GB", 64, tp=1, pp=4, dp=16,
        ep=8, sharding="ZeRO-1", recompute="-", seq=4096, per_dp=16, global_batch=256,
        course_shape="MIXTRAL_8X7B_SHAPE", measured=False,
        note="a reference mapping, no throughput given for it; micro-batch 1, virtual "
             "pipeline 8, BF16. ZeRO-1: the same README's Mixtral 8x7B script runs "
             "--use-distributed-optimizer; the table states no sharding and no "
             "recomputation. Mixtral's own training layout is not published"),
)


def cite(url: str) -> str:
    """A source short enough for one line: a pinned GitHub file as
    ``owner/repo@commit path`` (the commit cut to 7 digits), any other link as it is."""
    if url.startswith(_GITHUB) and "/blob/" in url:
        repo, rest = url[len(_GITHUB):].split("/blob/", 1)
        commit, path = rest.split("/", 1)
        return f"{repo}@{commit[:7]} {path}"
    return url


def format_published(rows: tuple[PublishedLayout, ...] = PUBLISHED, width: int = 100) -> str:
    """A numbered table of the layouts (a value the source does not state: "-"), then each
    one's source, its note and where to read it."""
    wide = max([24] + [len(r.layout()) + 1 for r in rows])
    lines = [f"{'':<4}{'model':<15}{'GPUs':>5}{'':<14}{'layout':<{wide}}{'seq':>5}"
             f"{'rank/step':>11}  {'AC':<10}kind"]
    for k, r in enumerate(rows, 1):
        batch = f"{r.per_dp or '-'}/{r.global_batch or '-'}"
        lines.append(f"{k:>2}  {r.model:<15}{r.gpus:>5} x {r.hardware:<11}{r.layout():<{wide}}"
                     f"{r.seq or '-':>5}{batch:>11}  {r.recompute:<10}"
                     f"{'run' if r.measured else 'preset'}")
    lines += ["seq: tokens per sequence; rank/step: sequences per data-parallel rank and per "
              "step;", "AC: activation checkpointing (recomputation); -: not stated", ""]
    for k, r in enumerate(rows, 1):
        text = f"{r.source}: {r.note}" if r.note else r.source
        lines += textwrap.wrap(text, width, initial_indent=f"{k:>2}  ", subsequent_indent="    ",
                               break_on_hyphens=False)
        lines.append(f"    {cite(r.url)}")
    return "\n".join(lines)


@dataclass(frozen=True)
class MoEComparison:
    """A published MoE layout beside the search of its cluster at its tokens per step."""

    published: PublishedLayout
    search: Search
    no_tp: Search | None  # without TP, where the run used none and the rule's choice does
    sized: tuple[Candidate, Candidate]  # the published layout, without and with recompute


def compare_moe(published: PublishedLayout, *, micro_batch: int = 1,
                gpu_bytes: int = CARD) -> MoEComparison:
    """The search on the published run's GPUs, sequence length and sequences per step (in
    micro-batches of ``micro_batch``, which DeepSeek-V3's report does not state), and the
    published layout sized as 1F1B (DualPipe's second copy of the parameters not counted)
    without and with every block recomputed (a selective recomputation lies between)."""
    if published.course_shape not in MOE_SHAPES:
        raise ValueError(f"{published.model}: course_shape={published.course_shape!r}; "
                         f"valid: one of {sorted(MOE_SHAPES)}")
    shape = MOE_SHAPES[published.course_shape]
    run = {"model": published.model, "seq": published.seq, "micro_batch": micro_batch,
           "global_batch": published.global_batch, "gpu_bytes": gpu_bytes}
    search = search_layouts(shape, published.gpus, **run)
    no_tp = (search_layouts(shape, published.gpus, tp=(1,), **run)
             if published.tp == 1 and search.chosen and search.chosen.tp > 1 else None)
    m = published.per_dp // micro_batch
    zero = {name: stage for stage, name in SHARDING.items()}[published.sharding]
    sized = []
    for r in (False, True):
        layout = ClusterLayout(published.layout(), tp=published.tp, pp=published.pp,
                               dp=published.dp, zero=zero, recompute=r, ep=published.ep)
        sized.append(Candidate(layout, m, per_gpu(shape, layout, seq=published.seq,
                                                  micro_batch=micro_batch, microbatches=m,
                                                  sequence_parallel=published.tp > 1)))
    return MoEComparison(published, search, no_tp, (sized[0], sized[1]))


def format_moe(comparisons: list[MoEComparison]) -> str:
    """Per model: how many layouts fit, the rule's choice (without TP too where the
    published run had none), and the published layout without and with recomputation."""
    lines = []
    for c in comparisons:
        s, p = c.search, c.published
        lines += [f"{p.model} on {p.gpus} GPUs, {p.global_batch} sequences of {p.seq} tokens "
                  f"per step: {len(s.fitting)} of {len(s.tried)} layouts fit",
                  f"{'':<11}{'layout':<40}{'tp':>3}{'pp':>4}{'dp':>6}{'ep':>4}{'m':>5}"
                  f"{'bubble':>8}{'fullest GPU':>13}  fits"]
        rows = [("rule" if s.chosen else "closest", s.chosen or s.least)]
        rows += [("rule, TP 1", c.no_tp.chosen or c.no_tp.least)] if c.no_tp else []
        for label, x in [*rows, *(("published", x) for x in c.sized)]:
            lines.append(f"{label:<11}{describe(x):<40}{x.tp:>3}{x.pp:>4}{x.dp:>6}{x.layout.ep:>4}"
                         f"{x.microbatches:>5}{x.bubble:>8.1%}{format_bytes(x.memory.total):>13}"
                         f"  {'yes' if x.memory.total <= s.gpu_bytes else 'no'}")
    return "\n".join([*lines, "published: sized as plain 1F1B in BF16 with FP32 Adam; the runs' "
                       "DualPipe, virtual", "stages, FP8 and selective recomputation are not "
                       "modelled (see each source)"])


def moe_layout_table(micro_batch: int = 1) -> str:
    """DeepSeek-V3 and Mixtral 8x7B: each searched on its published cluster, beside the
    published layout (:data:`~helpers.composed.published_layouts.PUBLISHED_MOE`)."""
    return format_moe([compare_moe(p, micro_batch=micro_batch) for p in PUBLISHED_MOE])
