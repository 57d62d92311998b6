"""Layouts that others published for Llama training, each with the source it is read from.

Each entry says what ran (or what a preset configures): the model, the GPUs, the tensor-
(``tp``), context- (``cp``), pipeline- (``pp``) and data-parallel (``dp``) degrees, the
sequence length, the sequences per data-parallel rank and per step, and the activation
checkpointing, as the source states them; a value the source does not state is ``None``.
Links are pinned to the commit read. Only the Llama 2 70B entries have this course's
``LLAMA_70B_SHAPE``: Llama 3 models have another vocabulary (and 8B its own widths).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

_GITHUB = "https://github.com/"
_TT = _GITHUB + "pytorch/torchtitan/blob/"
_TT_2024_04 = _TT + "157a12c562288b3bccb077003a97f18a4ca657aa/"  # 2024-04-24
_TT_2025_06 = _TT + "820504e20d1149fbf0b98c567af24c4b0433b22d/"  # 2025-06-13
_BENCH = _TT_2025_06 + "benchmarks/llama3_h100_202412_torchtitan.md"
_LLAMA3 = "https://arxiv.org/abs/2407.21783"


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

    def __post_init__(self) -> None:
        if self.tp * self.cp * self.pp * self.dp != self.gpus:
            raise ValueError(f"{self.source}: tp x cp x pp x dp = {self.tp * self.cp * self.pp * self.dp}"
                             f", not the {self.gpus} GPUs it states; valid: a product equal to gpus")
        if None not in (self.per_dp, self.global_batch) and self.per_dp * self.dp != self.global_batch:
            raise ValueError(f"{self.source}: {self.per_dp} per rank x dp {self.dp} != global "
                             f"batch {self.global_batch}; valid: per_dp * dp == global_batch")

    def layout(self) -> str:
        """The degrees, e.g. 'TP 8 x PP 16 x DP 64'."""
        parts = [f"TP {self.tp}", f"CP {self.cp}", f"PP {self.pp}", f"{self.sharding} {self.dp}"]
        return " x ".join(p for p in parts if not p.endswith(" 1")) or "one GPU"


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
    lines = [f"{'':<4}{'model':<15}{'GPUs':>5}{'':<14}{'layout':<24}{'seq':>5}"
             f"{'rank/step':>11}  {'AC':<10}kind"]
    for k, r in enumerate(rows, 1):
        batch = f"{r.per_dp or '-'}/{r.global_batch or '-'}"
        lines.append(f"{k:>2}  {r.model:<15}{r.gpus:>5} x {r.hardware:<11}{r.layout():<24}"
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
