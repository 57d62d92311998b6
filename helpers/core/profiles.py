"""Every size the series uses, in one table: three profiles, one section per lesson.

``small`` makes the whole series run in minutes on a 2-core CPU (CI).
``full`` uses the source documents' sizes (and is what ``make bench`` and the GPU check run).
``smoke`` is the tiniest that still runs every code path (unit tests, ``gpu-check --smoke``).
``auto`` picks ``full`` when a CUDA GPU is present, else ``small``. The environment
variable ``TUTORIAL_PROFILE`` chooses for the lessons (``small``, ``full`` or ``auto``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from helpers.core.sizes import format_bytes

ENV_VAR = "TUTORIAL_PROFILE"
CHOICES = ("small", "full", "auto")  # what $TUTORIAL_PROFILE may say
NAMES = ("smoke", "small", "full")  # what get_profile(name) accepts


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

    vocab: int
    hidden: int
    blocks: int
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

    vocab: int  # not a multiple of 4: the 4-rank run pads it
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    layers: int
    seq: int
    batch: int
    time_steps: int  # timed training steps per setting, after the warm-up


# the source's documented command: torch_tp_demo.py --hidden_size 512 --ffn_size 4096 ...
SOURCE_FFN = FFNSizes(512, 4096, 512, 8, world_size=4, iters=32, warmup=4)


@dataclass(frozen=True)
class Profile:
    """Sizes used by the lessons; every notebook prints the one in use."""

    name: str
    warmup: int  # timing (all lessons): untimed warm-up runs, then timed repeats
    repeats: int
    toy: ToySizes
    resnet: ResNetSizes
    pipeline: PipelineSizes
    schedules: ScheduleSizes
    ffn: FFNSizes
    wide_ffn: FFNSizes  # lesson 08 also times the forward here: wide enough for p = 2 to pay
    lm: LMSizes
    data_parallel: DataParallelSizes
    transformer_tp: TransformerTPSizes

    def describe(self, topic: str | None = None) -> str:
        """One line naming the profile and the sizes that ``topic`` (a lesson's subject) uses."""
        t, r, p, s, f, m = self.toy, self.resnet, self.pipeline, self.schedules, self.ffn, self.lm
        w, d, x = self.wide_ffn, self.data_parallel, self.transformer_tp
        sizes = {
            "toy": f"toy model {t.inputs} -> {t.hidden} -> {t.outputs}, batch {t.batch}",
            "resnet": f"ResNet50 batch {r.batch} at {r.image_size}x{r.image_size}, "
            f"{r.batches} batches",
            "pipeline": f"ResNet50 batch {p.batch} at {p.image_size}x{p.image_size} (proofs at "
            f"{p.proof_image_size}x{p.proof_image_size}), {p.microbatches} micro-batches",
            "schedules": f"{s.blocks} MLP blocks of width {s.width}, batch {s.batch}, "
            f"{s.microbatches} micro-batches",
            "lm": f"Llama-shaped model: vocab {m.vocab}, hidden {m.hidden}, {m.blocks} blocks; "
            f"batch {m.batch} x {m.seq} tokens",
            "data_parallel": f"Llama-shaped model: vocab {m.vocab}, hidden {m.hidden}, "
            f"{m.blocks} blocks; global batch {d.batch} x {m.seq} tokens, DDP buckets of "
            f"{d.bucket_cap_mb:g} MB, collectives timed at {len(d.collective_sizes)} sizes "
            f"up to {format_bytes(d.collective_sizes[-1])}",
            "transformer_tp": f"Llama: vocab {x.vocab}, hidden {x.hidden}, {x.heads} heads "
            f"({x.kv_heads} key/value), MLP {x.ffn}, {x.layers} blocks; batch {x.batch} x "
            f"{x.seq} tokens; {x.time_steps} timed steps",
            "ffn": f"FFN hidden {f.hidden_size}, ffn {f.ffn_size}, seq {f.seq_len}, "
            f"batch {f.batch_size}, world size {f.world_size}",
            "ffn_timing": f"FFN hidden {f.hidden_size}, ffn {f.ffn_size}, seq {f.seq_len}, "
            f"batch {f.batch_size}, world size {f.world_size}; timed also at hidden "
            f"{w.hidden_size}, ffn {w.ffn_size}, seq {w.seq_len}, batch {w.batch_size}",
        }
        if topic is not None and topic not in sizes:
            raise ValueError(f"unknown topic {topic!r}; valid choices: {', '.join(sizes)}")
        chosen = [sizes[topic]] if topic else list(sizes.values())
        timing = f"{self.warmup} warm-up run(s), {self.repeats} timed repeats"
        return f"profile '{self.name}': " + "; ".join([*chosen, timing])


SMALL_LM = LMSizes(vocab=4096, hidden=128, blocks=6, batch=4, seq=32)
DP_SIZES = tuple(2**k for k in range(10, 23, 2))  # 1 KiB .. 4 MiB
SMALL_DP = DataParallelSizes(batch=8, accumulation=2, bucket_cap_mb=2.0, collective_sizes=DP_SIZES)

PROFILES: dict[str, Profile] = {
    "smoke": Profile(
        "smoke", warmup=1, repeats=1, toy=ToySizes(),
        resnet=ResNetSizes(batch=2, image_size=32, batches=1),
        # one image per micro-batch; 48x48 leaves 2x2 after layer4 (BatchNorm needs > 1x1)
        pipeline=PipelineSizes(batch=2, image_size=48, microbatches=2, proof_image_size=48),
        schedules=ScheduleSizes(width=32, blocks=4, batch=16, microbatches=4),
        ffn=FFNSizes(32, 64, 8, 2, world_size=4, iters=3, warmup=1),
        wide_ffn=FFNSizes(64, 256, 16, 2, world_size=4, iters=3, warmup=1),
        lm=SMALL_LM,
        data_parallel=DataParallelSizes(batch=4, accumulation=2, bucket_cap_mb=2.0,
                                        collective_sizes=(2**10, 2**14, 2**18)),
        transformer_tp=TransformerTPSizes(vocab=250, hidden=64, heads=8, kv_heads=4, ffn=192,
                                          layers=2, seq=16, batch=2, time_steps=2),
    ),
    "small": Profile(
        "small", warmup=2, repeats=3, toy=ToySizes(),
        resnet=ResNetSizes(batch=16, image_size=64, batches=2),
        pipeline=PipelineSizes(batch=16, image_size=112, microbatches=4, proof_image_size=48),
        schedules=ScheduleSizes(width=256, blocks=8, batch=512, microbatches=4),
        ffn=FFNSizes(128, 512, 64, 2, world_size=4, iters=12, warmup=2),
        wide_ffn=FFNSizes(512, 4096, 128, 4, world_size=4, iters=7, warmup=2),
        lm=SMALL_LM,
        data_parallel=SMALL_DP,
        transformer_tp=TransformerTPSizes(vocab=1002, hidden=256, heads=8, kv_heads=4, ffn=768,
                                          layers=2, seq=64, batch=4, time_steps=5),
    ),
    "full": Profile(
        "full", warmup=2, repeats=10, toy=ToySizes(),
        resnet=ResNetSizes(batch=120, image_size=128, batches=3),
        pipeline=PipelineSizes(batch=32, image_size=128, microbatches=4, proof_image_size=128),
        schedules=ScheduleSizes(width=512, blocks=8, batch=1024, microbatches=8),
        ffn=SOURCE_FFN,
        wide_ffn=SOURCE_FFN,
        lm=LMSizes(vocab=32000, hidden=1024, blocks=8, batch=8, seq=256),
        data_parallel=DataParallelSizes(batch=8, accumulation=2, bucket_cap_mb=25.0,
                                        collective_sizes=tuple(2**k for k in range(10, 29, 2))),
        transformer_tp=TransformerTPSizes(vocab=32002, hidden=1024, heads=16, kv_heads=4,
                                          ffn=2816, layers=4, seq=256, batch=4, time_steps=10),
    ),
}  # fmt: skip


def resolve_name(name: str | None = None) -> str:
    """Turn ``name`` (or ``$TUTORIAL_PROFILE``, default ``auto``) into a profile's name."""
    chosen = (name if name is not None else os.environ.get(ENV_VAR, "auto")).strip().lower()
    valid = (*NAMES, "auto") if name is not None else CHOICES
    if chosen not in valid:
        source = "argument" if name is not None else f"${ENV_VAR}"
        raise ValueError(
            f"unknown profile {chosen!r} (from {source}); valid choices: {', '.join(valid)}"
        )
    if chosen == "auto":
        return "full" if torch.cuda.is_available() else "small"
    return chosen


def get_profile(
    name: str | None = None, *, verbose: bool = False, topic: str | None = None
) -> Profile:
    """The profile named ``name``, else the one ``$TUTORIAL_PROFILE`` selects.

    ``verbose`` prints it, with the sizes of ``topic`` only when given (e.g. ``"pipeline"``).
    """
    profile = PROFILES[resolve_name(name)]
    if verbose:
        print(f"Using {profile.describe(topic)}")
    return profile
