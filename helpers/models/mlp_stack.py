"""The pipeline-schedules lesson's model: a stack of equal residual MLP blocks.

Every block costs the same, so a stage's forward, backward and weight-gradient times
can be read straight off a timeline (ResNet50's blocks differ several-fold).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from torch import nn

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble")
CHUNKS_PER_RANK = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2, "zero_bubble": 2}
WORKER = "helpers.runs.schedules.worker"  # the torchrun entry point that runs them


class MLPBlock(nn.Module):
    """``x + fc2(gelu(fc1(x)))`` with fc1: width -> 4 width, fc2 back."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


def build_stack(width: int, blocks: int, seed: int = 0) -> nn.Sequential:
    """``blocks`` MLP blocks, weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(*(MLPBlock(width) for _ in range(blocks)))


def validate_plan(schedule: str, ranks: int, microbatches: int, blocks: int, batch: int) -> int:
    """Chunks in all (ranks x chunks per rank), after checking every choice; else ValueError."""
    if schedule not in SCHEDULE_NAMES:
        raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULE_NAMES)}")
    if not isinstance(microbatches, int) or microbatches < 1 or batch % microbatches:
        raise ValueError(f"{microbatches!r} micro-batches for a batch of {batch}; valid: a "
                         f"divisor of {batch}")
    chunks = ranks * CHUNKS_PER_RANK[schedule]
    if CHUNKS_PER_RANK[schedule] > 1 and microbatches % ranks:
        raise ValueError(f"{schedule} needs the micro-batches to be a multiple of the ranks; "
                         f"got M={microbatches} for {ranks} ranks (valid: "
                         f"{', '.join(str(ranks * i) for i in range(1, 5))}, ...)")
    if chunks > blocks or blocks % chunks:
        raise ValueError(f"{schedule} on {ranks} ranks cuts the model into {chunks} chunks, but "
                         f"{blocks} blocks do not split into {chunks} equal chunks; valid: a "
                         f"multiple of {chunks} blocks")
    return chunks


def chunk_of(model: nn.Sequential, chunks: int, index: int) -> nn.Sequential:
    """Chunk ``index`` of ``chunks`` equal, contiguous pieces of the block list."""
    per = len(model) // chunks
    return nn.Sequential(*list(model)[index * per:(index + 1) * per])


def rank_chunks(schedule: str, rank: int, ranks: int) -> list[int]:
    """Global chunk (stage) indices that ``rank`` holds: r, r + K, ... (looped placement)."""
    return [rank + i * ranks for i in range(CHUNKS_PER_RANK[schedule])]


@dataclass(frozen=True)
class SchedulesConfig:
    """One launch: which schedules, on how many ranks, at which sizes."""

    microbatches: int
    batch: int
    width: int = 256
    blocks: int = 8
    steps: int = 3
    ranks: int = 2
    schedules: tuple[str, ...] = SCHEDULE_NAMES
    lr: float = 0.01

    def validate(self) -> SchedulesConfig:
        """Raise ValueError naming the first bad choice and what would be valid."""
        for name in self.schedules:
            validate_plan(name, self.ranks, self.microbatches, self.blocks, self.batch)
        return self

    def args(self) -> list[str]:
        """The worker's command line (the ranks are torchrun's ``--nproc-per-node``)."""
        return ["--schedules", ",".join(self.schedules), "--microbatches", str(self.microbatches),
                "--batch", str(self.batch), "--width", str(self.width), "--blocks",
                str(self.blocks), "--steps", str(self.steps), "--lr", str(self.lr)]

    @classmethod
    def from_args(cls, argv: list[str] | None = None, *, ranks: int = 2) -> SchedulesConfig:
        """The inverse of :meth:`args`, as the worker parses it."""
        p = argparse.ArgumentParser(description=f"torchrun -m {WORKER}")
        p.add_argument("--schedules", required=True, help="comma-separated, e.g. gpipe,1f1b")
        p.add_argument("--microbatches", type=int, required=True)
        p.add_argument("--batch", type=int, required=True)
        p.add_argument("--width", type=int, default=cls.width)
        p.add_argument("--blocks", type=int, default=cls.blocks)
        p.add_argument("--steps", type=int, default=cls.steps)
        p.add_argument("--lr", type=float, default=cls.lr)
        ns = p.parse_args(argv)
        return cls(ns.microbatches, ns.batch, ns.width, ns.blocks, ns.steps, ranks,
                   tuple(ns.schedules.split(",")), ns.lr)
