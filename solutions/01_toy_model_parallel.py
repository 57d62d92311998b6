"""Lesson 01's exercises, solved. Try them in the notebook first."""

import torch
from torch import nn


# %% Exercise 01.1: Adam's state for a module
def adam_bytes(module: nn.Module) -> int:
    """Two float32 moments per parameter element, plus one float32 step count per tensor."""
    params = list(module.parameters())
    return sum(2 * p.numel() * 4 for p in params) + 4 * len(params)


# %% Exercise 01.2: bytes across a cut
def crossing_bytes(layers: nn.Sequential, cut: int, batch: int) -> int:
    """The output of layers[cut - 1] goes forward, its gradient (same size) comes back."""
    with torch.no_grad():
        activation = layers[:cut](torch.zeros(batch, layers[0].in_features))
    return 2 * activation.numel() * activation.element_size()


ANSWERS = {"01.1": adam_bytes, "01.2": crossing_bytes}
