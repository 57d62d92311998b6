"""Lesson 01's exercises, solved. Try them in the notebook first."""

import torch
from torch import nn

# %% Exercise 01.1: what grows with the batch
# Weights, gradients and Adam's two moments are sized by the layers' shapes: the batch
# changes none of them. Every tensor a layer keeps for backward has one row per sample:
# net1's input on dev0 (and the ReLU's output), and on dev1 its copy of the activation that
# crossed the cut and MSE's output and target. They stay where the layers ran.
grows = {("dev0", "activations"), ("dev1", "activations")}


# %% Exercise 01.2: bytes across a cut
def crossing_bytes(layers: nn.Sequential, cut: int, batch: int) -> int:
    """The output of layers[cut - 1] goes forward, its gradient (same size) comes back."""
    with torch.no_grad():
        activation = layers[:cut](torch.zeros(batch, layers[0].in_features))
    return 2 * activation.numel() * activation.element_size()


# %% Exercise 01.3: why only one device works at a time
def busy_share(forward: list[float], backward: list[float]) -> list[float]:
    """Stage k+1 needs stage k's activation, stage k's backward needs the gradient from
    stage k+1: the stages run one after another, so the step is the sum of all their times."""
    step = sum(forward) + sum(backward)
    return [(f + b) / step for f, b in zip(forward, backward, strict=True)]


ANSWERS = {"01.1": grows, "01.2": crossing_bytes, "01.3": busy_share}
