"""The two size profiles of the series, in one place.

``small`` makes the whole series run in minutes on a 2-core CPU (CI).
``full`` uses the source documents' sizes. ``auto`` picks ``full`` when a CUDA GPU
is present, else ``small``. The environment variable ``TUTORIAL_PROFILE`` chooses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

ENV_VAR = "TUTORIAL_PROFILE"
CHOICES = ("small", "full", "auto")


@dataclass(frozen=True)
class Profile:
    """Sizes used by the lessons; every notebook prints the one in use."""

    name: str
    # timing (all lessons): untimed warm-up runs, then timed repeats
    warmup: int
    repeats: int
    # lesson 01: toy model (the source's sizes are tiny, so both profiles use them)
    toy_batch: int
    toy_in: int
    toy_hidden: int
    toy_out: int
    # lesson 02: ResNet50 training loop
    resnet_batch: int
    image_size: int
    num_batches: int
    num_classes: int
    # lesson 03: pipeline parallelism
    pipe_batch: int
    pipe_image_size: int
    pipe_microbatches: int
    # lesson 04: pipeline schedules on a stack of equal MLP blocks
    sched_width: int
    sched_blocks: int
    sched_batch: int
    sched_microbatches: int
    # lessons 06 and 07: tensor-parallel FFN (the source's flags)
    hidden_size: int
    ffn_size: int
    seq_len: int
    ffn_batch: int
    world_size: int
    ffn_iters: int
    ffn_warmup: int
    # lesson 05: device_map="auto" on a Llama-shaped model (MLP width 4x hidden, 64 per head)
    lm_vocab: int
    lm_hidden: int
    lm_blocks: int
    lm_batch: int
    lm_seq: int

    def describe(self, topic: str | None = None) -> str:
        """One line naming the profile and the sizes that ``topic`` (a lesson's subject) uses."""
        sizes = {
            "toy": f"toy model {self.toy_in} -> {self.toy_hidden} -> {self.toy_out}, batch {self.toy_batch}",
            "resnet": f"ResNet50 batch {self.resnet_batch} at {self.image_size}x{self.image_size}, "
            f"{self.num_batches} batches",
            "pipeline": f"ResNet50 batch {self.pipe_batch} at {self.pipe_image_size}x"
            f"{self.pipe_image_size}, {self.pipe_microbatches} micro-batches",
            "schedules": f"{self.sched_blocks} MLP blocks of width {self.sched_width}, batch "
            f"{self.sched_batch}, {self.sched_microbatches} micro-batches",
            "lm": f"Llama-shaped model: vocab {self.lm_vocab}, hidden {self.lm_hidden}, "
            f"{self.lm_blocks} blocks; batch {self.lm_batch} x {self.lm_seq} tokens",
            "ffn": f"FFN hidden {self.hidden_size}, ffn {self.ffn_size}, seq {self.seq_len}, "
            f"batch {self.ffn_batch}, world size {self.world_size}",
        }
        if topic is not None and topic not in sizes:
            raise ValueError(f"unknown topic {topic!r}; valid choices: {', '.join(sizes)}")
        chosen = [sizes[topic]] if topic else list(sizes.values())
        timing = f"{self.warmup} warm-up run(s), {self.repeats} timed repeats"
        return f"profile '{self.name}': " + "; ".join([*chosen, timing])


PROFILES: dict[str, Profile] = {
    "small": Profile(
        name="small",
        warmup=2,
        repeats=3,
        toy_batch=20,
        toy_in=10000,
        toy_hidden=10,
        toy_out=5,
        resnet_batch=16,
        image_size=64,
        num_batches=2,
        num_classes=1000,
        pipe_batch=16,
        pipe_image_size=128,
        pipe_microbatches=4,
        sched_width=256,
        sched_blocks=8,
        sched_batch=512,
        sched_microbatches=4,
        hidden_size=128,
        ffn_size=512,
        seq_len=64,
        ffn_batch=2,
        world_size=4,
        ffn_iters=12,
        ffn_warmup=2,
        lm_vocab=4096,
        lm_hidden=128,
        lm_blocks=6,
        lm_batch=4,
        lm_seq=32,
    ),
    "full": Profile(
        name="full",
        warmup=2,
        repeats=10,
        toy_batch=20,
        toy_in=10000,
        toy_hidden=10,
        toy_out=5,
        resnet_batch=120,
        image_size=128,
        num_batches=3,
        num_classes=1000,
        pipe_batch=32,
        pipe_image_size=128,
        pipe_microbatches=4,
        sched_width=1024,
        sched_blocks=8,
        sched_batch=2048,
        sched_microbatches=8,
        hidden_size=512,
        ffn_size=4096,
        seq_len=512,
        ffn_batch=8,
        world_size=4,
        ffn_iters=32,
        ffn_warmup=4,
        lm_vocab=32000,
        lm_hidden=1024,
        lm_blocks=8,
        lm_batch=8,
        lm_seq=256,
    ),
}


def resolve_name(name: str | None = None) -> str:
    """Turn ``name`` (or ``$TUTORIAL_PROFILE``, default ``auto``) into ``small`` or ``full``."""
    chosen = (name if name is not None else os.environ.get(ENV_VAR, "auto")).strip().lower()
    if chosen not in CHOICES:
        source = "argument" if name is not None else f"${ENV_VAR}"
        raise ValueError(
            f"unknown profile {chosen!r} (from {source}); valid choices: {', '.join(CHOICES)}"
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
