"""The 3-D trainer's typed config: the layout, the model, the batch and the run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from helpers.composed.layout import Layout
from helpers.core.flags import flags_of, parse
from helpers.models.llama import LMConfig

WORKER = "helpers.runs.llama_3d.worker"
DTYPES = {"float32": torch.float32, "float64": torch.float64}
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class ModelRun:
    """The model, the batch and the run: what every layout of a comparison shares."""

    microbatches: int = 2
    steps: int = 3
    seed: int = 0
    vocab: int = 64
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    layers: int = 4
    seq: int = 16
    batch: int = 8  # sequences per step, over all data-parallel ranks
    lr: float = 1e-2
    dtype: str = "float32"  # or float64: the weights, activations and optimizer state
    device: str = "auto"  # cuda (NCCL, one GPU per rank), cpu (gloo), auto: cuda if enough

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def lm(self) -> LMConfig:
        return LMConfig(vocab=self.vocab, hidden=self.hidden, blocks=self.layers, ffn=self.ffn,
                        heads=self.heads, kv_heads=self.kv_heads, rope=True)

    def shared(self) -> dict:
        """The fields of :class:`ModelRun`, by name."""
        return {f.name: getattr(self, f.name) for f in fields(ModelRun)}


@dataclass(frozen=True)
class TrainerConfig(ModelRun):
    """What ``torchrun -m helpers.runs.llama_3d.worker`` takes, one ``--flag`` per field."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    reference: bool = False
    checkpoint_dir: str = ""  # a checkpoint after every step, here (none when empty)
    resume: bool = False  # start after the newest checkpoint in checkpoint_dir, if any
    kill_rank: int = -1  # on the first attempt, this rank SIGKILLs itself ...
    kill_step: int = -1  # ... as this step starts (-1: nobody is killed)

    @property
    def layout(self) -> Layout:
        return Layout(self.pp, self.dp, self.tp)

    def validate(self, world_size: int | None = None) -> TrainerConfig:
        """Refuse a bad layout, model or batch before any launch (see ``Layout.validate``)."""
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype}; valid choices: {', '.join(DTYPES)}")
        if self.device not in DEVICES:
            raise ValueError(f"--device {self.device}; valid choices: {', '.join(DEVICES)}")
        if self.steps < 1:
            raise ValueError(f"--steps {self.steps}; valid: an integer >= 1")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume without --checkpoint-dir; valid: --checkpoint-dir DIR "
                             "--resume (DIR holding checkpoints of the same model)")
        if (self.kill_rank >= 0) != (self.kill_step >= 0):
            raise ValueError(f"--kill-rank {self.kill_rank} --kill-step {self.kill_step}; valid: "
                             "both set (a rank and a step) or neither")
        if self.kill_rank >= self.layout.world_size or self.kill_step >= self.steps:
            raise ValueError(f"--kill-rank {self.kill_rank} --kill-step {self.kill_step}; valid: "
                             f"a rank below {self.layout.world_size} and a step below "
                             f"{self.steps}")
        if self.kill_step >= 0 and not (self.checkpoint_dir and self.resume):
            raise ValueError("--kill-step without --checkpoint-dir DIR --resume: the restarted "
                             "ranks would start again from step 0; valid: add both")
        self.layout.validate(self.lm, batch=self.batch, microbatches=self.microbatches,
                             world_size=world_size)
        return self

    def args(self) -> list[str]:
        """The command line, every flag given."""
        return flags_of(self)

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> TrainerConfig:
        """The inverse of :meth:`args`."""
        return parse(cls, f"torchrun --nproc-per-node=P -m {WORKER}", argv)
