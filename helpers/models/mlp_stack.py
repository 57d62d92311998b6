"""The pipeline-schedules lesson's model: a stack of equal residual MLP blocks.

Every block costs the same, so a stage's forward, backward and weight-gradient times
can be read straight off a timeline (ResNet50's blocks differ several-fold).
"""

from __future__ import annotations

import torch
from torch import nn


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


def chunk_of(model: nn.Sequential, chunks: int, index: int) -> nn.Sequential:
    """Chunk ``index`` of ``chunks`` equal, contiguous pieces of the block list."""
    per = len(model) // chunks
    return nn.Sequential(*list(model)[index * per:(index + 1) * per])
