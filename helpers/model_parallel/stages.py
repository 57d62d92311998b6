"""Cut a model, given as an ordered list of layers, into K stages on K devices.

This is naive model parallelism: stage k runs on device k, and the activation is
carried to the next device at each cut. Only one stage works at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

Layers = Sequence[tuple[str, nn.Module]]


def validate_split_points(split_points: Sequence[int], num_layers: int) -> list[int]:
    """Validate cut positions: strictly increasing, each in 1..num_layers-1."""
    points = list(split_points)
    if len(points) + 1 > num_layers:
        raise ValueError(
            f"{len(points) + 1} stages requested but the model has {num_layers} layers; "
            f"valid: at most {num_layers} stages ({num_layers - 1} split points)"
        )
    for i, point in enumerate(points):
        if not isinstance(point, int) or not 1 <= point <= num_layers - 1:
            raise ValueError(
                f"split point {point!r} is out of range; valid: integers from 1 to {num_layers - 1} "
                f"(a cut before layer i, for {num_layers} layers)"
            )
        if i and point <= points[i - 1]:
            raise ValueError(
                f"split points {points} are not strictly increasing ({points[i - 1]} then {point}); "
                "valid: each cut after the previous one"
            )
    return points


def split_layers(layers: Layers, split_points: Sequence[int]) -> list[nn.Sequential]:
    """The layers cut before each split point, as one ``nn.Sequential`` per stage."""
    points = validate_split_points(split_points, len(layers))
    bounds = [0, *points, len(layers)]
    return [
        nn.Sequential(OrderedDict(layers[a:b])) for a, b in zip(bounds, bounds[1:], strict=False)
    ]


class StagedModel(nn.Module):
    """Stages run one after another, each on its own device (naive model parallelism)."""

    def __init__(
        self, layers: Layers, split_points: Sequence[int], devices: Sequence[torch.device]
    ):
        super().__init__()
        stages = split_layers(layers, split_points)
        if len(devices) != len(stages):
            raise ValueError(f"{len(stages)} stages but {len(devices)} devices given; "
                             "valid: one device per stage")
        self.devices = [torch.device(d) for d in devices]
        self.stages = nn.ModuleList(
            stage.to(d) for stage, d in zip(stages, self.devices, strict=True)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage, device in zip(self.stages, self.devices, strict=True):
            x = stage(x.to(device))  # the activation crosses to the stage's device
        return x

    def layer_chain(self) -> tuple[list[nn.Module], list[int]]:
        """All stages' layers in forward order, and the split points between the stages.

        (``helpers.memory``'s ``LayerChain`` protocol: what its estimator reads.)
        """
        sizes = [len(stage) for stage in self.stages]
        layers = [layer for stage in self.stages for layer in stage]
        return layers, [sum(sizes[:k]) for k in range(1, len(sizes))]


def input_device(model: nn.Module) -> torch.device:
    """Where a model's input should go: its first stage's device, else its first parameter's."""
    if isinstance(model, StagedModel):
        return model.devices[0]
    return next(model.parameters()).device


def stage_bytes(model: StagedModel) -> list[int]:
    """Bytes of parameters and buffers held by each stage."""
    return [
        sum(t.numel() * t.element_size() for t in (*s.parameters(), *s.buffers()))
        for s in model.stages
    ]
