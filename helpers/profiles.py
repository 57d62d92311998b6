"""Every size the series uses, in one table: three profiles, one section per lesson.

``small`` makes the whole series run in minutes on a 2-core CPU (CI).
``full`` uses the source documents' sizes (and is what ``make bench`` and the GPU check run).
``smoke`` is the tiniest that still runs every code path (unit tests, ``gpu-check --smoke``).
``auto`` picks ``full`` when a CUDA GPU is present, else ``small``. The environment
variable ``TUTORIAL_PROFILE`` chooses for the lessons (``small``, ``full`` or ``auto``).
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass

import torch

from helpers.core.sizes import format_bytes
from helpers.models.llama import LMConfig, lm_config
from helpers.profile_sizes import (  # noqa: F401 (re-exported: the lessons' sizes)
    ComposedSizes,
    ContextParallelSizes,
    DataParallelSizes,
    DebuggingSizes,
    ExpertParallelSizes,
    FFNSizes,
    LMSizes,
    PipelineSizes,
    ResNetSizes,
    ScheduleSizes,
    ToySizes,
    TransformerTPSizes,
)

ENV_VAR = "TUTORIAL_PROFILE"
CHOICES = ("small", "full", "auto")  # what $TUTORIAL_PROFILE may say
NAMES = ("smoke", "small", "full")  # what get_profile(name) accepts


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
    context_parallel: ContextParallelSizes
    expert_parallel: ExpertParallelSizes
    debugging: DebuggingSizes
    composed: ComposedSizes

    def describe(self, topic: str | None = None) -> str:
        """One line naming the profile and the sizes that ``topic`` (a lesson's subject) uses."""
        t, r, p, s, f, m = self.toy, self.resnet, self.pipeline, self.schedules, self.ffn, self.lm
        w, d, x, c = self.wide_ffn, self.data_parallel, self.transformer_tp, self.composed
        cp, ep, dbg = self.context_parallel, self.expert_parallel, self.debugging
        lm, xm, cm, pm = m.model, x.model, c.model, cp.model
        sizes = {
            "toy": f"toy model {t.inputs} -> {t.hidden} -> {t.outputs}, batch {t.batch}",
            "resnet": f"ResNet50 batch {r.batch} at {r.image_size}x{r.image_size}, "
            f"{r.batches} batches",
            "pipeline": f"ResNet50 batch {p.batch} at {p.image_size}x{p.image_size} (proofs at "
            f"{p.proof_image_size}x{p.proof_image_size}), {p.microbatches} micro-batches",
            "schedules": f"{s.blocks} MLP blocks of width {s.width}, batch {s.batch}, "
            f"{s.microbatches} micro-batches",
            "lm": f"Llama-shaped model: vocab {lm.vocab}, hidden {lm.hidden}, {lm.blocks} blocks; "
            f"batch {m.batch} x {m.seq} tokens",
            "data_parallel": f"Llama-shaped model: vocab {lm.vocab}, hidden {lm.hidden}, "
            f"{lm.blocks} blocks; global batch {d.batch} x {m.seq} tokens, DDP buckets of "
            f"{d.bucket_cap_mb:g} MiB, collectives timed at {len(d.collective_sizes)} sizes "
            f"up to {format_bytes(d.collective_sizes[-1])}",
            "transformer_tp": f"Llama: vocab {xm.vocab}, hidden {xm.hidden}, {xm.heads} heads "
            f"({xm.kv} key/value), MLP {xm.ffn}, {xm.blocks} blocks; batch {x.batch} x "
            f"{x.seq} tokens; {x.time_steps} timed steps",
            "context_parallel": f"attention layer of {cp.layer_seq} tokens, hidden "
            f"{cp.layer_hidden}, {cp.layer_heads} heads ({cp.layer_kv_heads} key/value); Llama: "
            f"vocab {pm.vocab}, hidden {pm.hidden}, {pm.heads} heads ({pm.kv} key/value), "
            f"{pm.blocks} blocks; batch {cp.batch} x {cp.seq} tokens",
            "expert_parallel": f"MoE layer of {ep.layer_experts} experts (top-{ep.top_k}), "
            f"hidden {ep.layer_hidden}, expert MLP {ep.layer_ffn}, {ep.layer_tokens} tokens per "
            f"rank; MoE Llama: vocab {ep.model.vocab}, hidden {ep.model.hidden}, "
            f"{ep.model.blocks} blocks of {ep.experts} experts (MLP {ep.moe_ffn}); batch "
            f"{ep.batch} x {ep.seq} tokens; {ep.balance_steps} steps per balance run",
            "debugging": f"Llama: vocab {dbg.model.vocab}, hidden {dbg.model.hidden}, "
            f"{dbg.model.blocks} blocks; batch {dbg.batch} x {dbg.seq} tokens per rank, DDP "
            f"buckets of {dbg.bucket_cap_mb:g} MiB; pipeline of {dbg.pipe_blocks} MLP blocks "
            f"of width {dbg.pipe_width}, batch {dbg.pipe_batch} in {dbg.microbatches} "
            f"micro-batches; drills time out after {dbg.hang_seconds:g} s",
            "composed": f"Llama: vocab {cm.vocab}, hidden {cm.hidden}, {cm.heads} heads "
            f"({cm.kv} key/value), MLP {cm.ffn}, {cm.blocks} blocks; batch {c.batch} x "
            f"{c.seq} tokens in {c.microbatches} micro-batches; {c.steps} steps",
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


def llama(vocab: int, hidden: int, blocks: int, *, ffn: int, heads: int, kv_heads: int
          ) -> LMConfig:
    """The small Llama of lessons 09 to 13: grouped-query attention and RoPE."""
    return LMConfig(vocab=vocab, hidden=hidden, blocks=blocks, ffn=ffn, heads=heads,
                    kv_heads=kv_heads, rope=True)


SMALL_LM = LMSizes(lm_config(vocab=4096, hidden=128, blocks=6), batch=4, seq=32)
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
        transformer_tp=TransformerTPSizes(llama(250, 64, 2, ffn=192, heads=8, kv_heads=4),
                                          seq=16, batch=2, time_steps=2),
        context_parallel=ContextParallelSizes(llama(32, 32, 2, ffn=64, heads=4, kv_heads=2),
                                              seq=16, batch=2, layer_seq=64, layer_hidden=32,
                                              layer_heads=4, layer_kv_heads=2),
        expert_parallel=ExpertParallelSizes(
            layer_tokens=16, layer_hidden=32, layer_ffn=32, layer_experts=4,
            top_k=2, capacity_factor=1.0, model=llama(32, 16, 2, ffn=32, heads=2, kv_heads=1), moe_ffn=24,
            experts=4, batch=4, seq=8, balance_steps=4),
        debugging=DebuggingSizes(llama(64, 32, 2, ffn=64, heads=4, kv_heads=2), batch=2,
                                 seq=16, bucket_cap_mb=0.01, pipe_width=32, pipe_blocks=2,
                                 pipe_batch=16, microbatches=2, peak_size=128,
                                 hang_seconds=1.0),
        composed=ComposedSizes(llama(32, 32, 2, ffn=64, heads=4, kv_heads=2),
                               seq=8, batch=8, microbatches=2, steps=4),
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
        transformer_tp=TransformerTPSizes(llama(1002, 256, 2, ffn=768, heads=8, kv_heads=4),
                                          seq=64, batch=4, time_steps=5),
        context_parallel=ContextParallelSizes(llama(64, 64, 2, ffn=128, heads=4, kv_heads=2),
                                              seq=32, batch=2, layer_seq=1024, layer_hidden=64,
                                              layer_heads=4, layer_kv_heads=2),
        expert_parallel=ExpertParallelSizes(
            layer_tokens=64, layer_hidden=64, layer_ffn=128, layer_experts=4,
            top_k=2, capacity_factor=1.0, model=llama(64, 32, 2, ffn=64, heads=2, kv_heads=2), moe_ffn=32,
            experts=16, batch=32, seq=32, balance_steps=40),
        debugging=DebuggingSizes(llama(1024, 128, 4, ffn=512, heads=4, kv_heads=2), batch=4,
                                 seq=64, bucket_cap_mb=0.5, pipe_width=256, pipe_blocks=8,
                                 pipe_batch=256, microbatches=4, peak_size=512,
                                 hang_seconds=2.0),
        composed=ComposedSizes(llama(64, 64, 4, ffn=128, heads=4, kv_heads=2),
                               seq=16, batch=8, microbatches=2, steps=3),
    ),
    "full": Profile(
        "full", warmup=2, repeats=10, toy=ToySizes(),
        resnet=ResNetSizes(batch=120, image_size=128, batches=3),
        pipeline=PipelineSizes(batch=32, image_size=128, microbatches=4, proof_image_size=128),
        schedules=ScheduleSizes(width=512, blocks=8, batch=1024, microbatches=8),
        ffn=SOURCE_FFN,
        wide_ffn=SOURCE_FFN,
        lm=LMSizes(lm_config(vocab=32000, hidden=1024, blocks=8), batch=8, seq=256),
        data_parallel=DataParallelSizes(batch=8, accumulation=2, bucket_cap_mb=25.0,
                                        collective_sizes=tuple(2**k for k in range(10, 29, 2))),
        transformer_tp=TransformerTPSizes(llama(32002, 1024, 4, ffn=2816, heads=16, kv_heads=4),
                                          seq=256, batch=4, time_steps=10),
        context_parallel=ContextParallelSizes(llama(1024, 256, 4, ffn=768, heads=8, kv_heads=4),
                                              seq=256, batch=4, layer_seq=4096, layer_hidden=512,
                                              layer_heads=8, layer_kv_heads=4),
        expert_parallel=ExpertParallelSizes(
            layer_tokens=1024, layer_hidden=512, layer_ffn=1024, layer_experts=8,
            top_k=2, capacity_factor=1.0, model=llama(256, 64, 4, ffn=128, heads=4, kv_heads=2), moe_ffn=64,
            experts=16, batch=32, seq=64, balance_steps=200),
        debugging=DebuggingSizes(llama(4096, 512, 8, ffn=1536, heads=8, kv_heads=4), batch=4,
                                 seq=256, bucket_cap_mb=25.0, pipe_width=1024, pipe_blocks=8,
                                 pipe_batch=512, microbatches=8, peak_size=2048,
                                 hang_seconds=5.0),
        composed=ComposedSizes(llama(1024, 256, 4, ffn=768, heads=8, kv_heads=4),
                               seq=64, batch=16, microbatches=4, steps=12),
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
        print(textwrap.fill(f"Using {profile.describe(topic)}", 100, subsequent_indent="  ",
                            break_long_words=False, break_on_hyphens=False))
    return profile
