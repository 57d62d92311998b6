"""The sizes of each lesson's section of a profile (``helpers.profiles``)."""

from __future__ import annotations

from dataclasses import dataclass

from helpers.models.llama import LMConfig


@dataclass(frozen=True)
class ToySizes:
    """Lesson 01: the toy model (the source's sizes are tiny, so every profile uses them)."""

    batch: int = 20
    inputs: int = 10000
    hidden: int = 10
    outputs: int = 5


@dataclass(frozen=True)
class ResNetSizes:
    """Lesson 02: the ResNet50 training loop."""

    batch: int
    image_size: int
    batches: int
    classes: int = 1000


@dataclass(frozen=True)
class PipelineSizes:
    """Lesson 03: ResNet50 in stages, one process each."""

    batch: int
    image_size: int  # the timed runs'
    microbatches: int
    proof_image_size: int  # the proofs' and the memory measurement's


@dataclass(frozen=True)
class ScheduleSizes:
    """Lesson 04: pipeline schedules on a stack of equal MLP blocks."""

    width: int
    blocks: int
    batch: int
    microbatches: int


@dataclass(frozen=True)
class FFNSizes:
    """Lessons 07 and 08: the tensor-parallel FFN, in the source script's flag names."""

    hidden_size: int
    ffn_size: int
    seq_len: int
    batch_size: int
    world_size: int
    iters: int
    warmup: int


@dataclass(frozen=True)
class LMSizes:
    """Lesson 05: ``device_map="auto"`` on a Llama-shaped model (MLP 4x hidden, 64 per head)."""

    model: LMConfig
    batch: int
    seq: int


@dataclass(frozen=True)
class DataParallelSizes:
    """Lesson 06: data parallelism and ZeRO on lesson 05's Llama-shaped model (``lm``)."""

    batch: int  # sequences per step, over all ranks (of ``lm.seq`` tokens)
    accumulation: int  # micro-steps in the no_sync proof
    bucket_cap_mb: float  # DDP's bucket size
    collective_sizes: tuple[int, ...]  # bytes of the full tensor, for the alpha-beta fit


@dataclass(frozen=True)
class TransformerTPSizes:
    """Lesson 09: tensor parallelism of a whole small Llama (GQA, RoPE) over 2 and 4 ranks."""

    model: LMConfig  # vocab not a multiple of 4: the 4-rank run pads it
    seq: int
    batch: int
    time_steps: int  # timed training steps per setting, after the warm-up


@dataclass(frozen=True)
class ContextParallelSizes:
    """Lesson 10: attention over a sequence split across ranks, then the small Llama."""

    model: LMConfig  # the training step's Llama (GQA, RoPE)
    seq: int  # its tokens per sequence
    batch: int
    layer_seq: int  # one attention layer's tokens, for the launch that times each rank
    layer_hidden: int
    layer_heads: int
    layer_kv_heads: int


@dataclass(frozen=True)
class ExpertParallelSizes:
    """Lesson 11: one MoE layer over ep ranks, then the small Llama as a mixture of experts."""

    layer_tokens: int  # tokens per rank of the launched layer
    layer_hidden: int
    layer_ffn: int  # each expert's inner size (SwiGLU)
    layer_experts: int
    top_k: int
    capacity_factor: float  # the launch that drops
    model: LMConfig  # the MoE Llama's dense parts (its MLPs become MoE layers)
    moe_ffn: int
    experts: int
    batch: int
    seq: int
    balance_steps: int  # steps of each balance run (none, aux, bias)


@dataclass(frozen=True)
class DebuggingSizes:
    """Lesson 12: the traced DDP and pipeline steps, the tensor-parallel plan counted, the
    FLOPs of a step, the hang drills."""

    model: LMConfig  # the small Llama that DDP trains, the plan splits, the FLOPs count
    batch: int  # sequences per rank per step
    seq: int
    bucket_cap_mb: float  # DDP's buckets with overlap on
    pipe_width: int  # the traced pipeline's MLP stack
    pipe_blocks: int
    pipe_batch: int
    microbatches: int
    peak_size: int  # the square matrix multiply that measures this CPU's peak
    hang_seconds: float  # the drills' watchdog


@dataclass(frozen=True)
class ComposedSizes:
    """Lesson 13: the small Llama trained in 3-D, every layout on up to 8 ranks."""

    model: LMConfig
    seq: int
    batch: int  # sequences per step, over all data-parallel ranks
    microbatches: int
    steps: int
