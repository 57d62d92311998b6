"""Where to cut a layer list so that the pipeline's stages cost about the same."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers.model_parallel.resnet import resnet50, resnet_layers
from helpers.model_parallel.stages import Layers


def layer_flops(layers: Layers, example: torch.Tensor) -> list[int]:
    """Forward FLOPs of each layer for ``example``, as torch's FlopCounterMode counts them:
    convolutions and matrix products only (no BatchNorm, ReLU, pooling or addition)."""
    flops = []
    with torch.no_grad():
        for _, layer in layers:
            with FlopCounterMode(display=False) as counter:
                example = layer(example)
            flops.append(counter.get_total_flops())
    return flops


def balanced_split_points(costs: Sequence[float], stages: int) -> list[int]:
    """Cut positions that make the costliest stage as cheap as possible (contiguous stages)."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"stages={stages!r} for {n} layers; valid: 1..{n}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: smallest possible max-stage cost putting the first i layers into k stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    points, i = [], n
    for k in range(stages, 0, -1):
        i = cut[k][i]
        points.append(i)
    return sorted(points)[1:]  # drop the leading 0


def balanced_cut_names(stages: int, image_size: int, num_classes: int = 1000) -> list[str]:
    """Names of the ResNet50 blocks to cut before so the stages have about equal FLOPs."""
    layers = resnet_layers(resnet50(num_classes), blocks=True)
    flops = layer_flops(layers, torch.randn(1, 3, image_size, image_size))
    return [layers[i][0] for i in balanced_split_points(flops, stages)]
