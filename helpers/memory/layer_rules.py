"""Predict saved-for-backward bytes of a layer list from shapes alone, by rule.

Each rule says what one kind of layer keeps for its backward pass and the shape of its
output, with no tensor computed (the modules may live on the meta device). A flag
follows the activation: whether some layer already keeps its storage, so that it is
counted once (an in-place ReLU keeps the same storage that the next convolution keeps).
At a cut between parts the flag is cleared: the next device keeps its own copy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

LOSSES = ("mse", "cross_entropy")
Shape = tuple[int, ...]


def _conv_out(shape: Shape, conv: nn.Conv2d | nn.MaxPool2d) -> Shape:
    def pair(v: int | tuple[int, ...]) -> tuple[int, int]:
        return (v, v) if isinstance(v, int) else (v[0], v[1])

    (kh, kw), (sh, sw) = pair(conv.kernel_size), pair(conv.stride)
    (ph, pw), (dh, dw) = pair(conv.padding), pair(conv.dilation)
    h = (shape[2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    w = (shape[3] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    channels = conv.out_channels if isinstance(conv, nn.Conv2d) else shape[1]
    return (shape[0], channels, h, w)



def _is_bottleneck(layer: nn.Module) -> bool:
    """torchvision's ResNet ``Bottleneck``, recognised without importing torchvision (slow)."""
    kind = type(layer)
    return kind.__name__ == "Bottleneck" and kind.__module__.startswith("torchvision.")

class LayerWalk:
    """Walk layers in order, adding up the bytes each keeps for backward (element bytes ``e``)."""

    def __init__(self, shape: Shape, e: int = 4) -> None:
        self.shape, self.e, self.kept, self.total = tuple(shape), e, False, 0

    def _bytes(self, shape: Shape, e: int | None = None) -> int:
        return math.prod(shape) * (e or self.e)

    def keep_input(self) -> None:
        """The layer keeps its input (once per storage)."""
        if not self.kept:
            self.total += self._bytes(self.shape)
        self.kept = True

    def output(self, shape: Shape, *, kept: bool = False) -> None:
        """A new output tensor (``kept``: the layer itself keeps it)."""
        self.shape, self.kept = tuple(shape), kept
        if kept:
            self.total += self._bytes(shape)

    def step(self, layer: nn.Module) -> None:
        """Apply one layer's rule."""
        if isinstance(layer, nn.Linear):
            self.keep_input()
            self.output((*self.shape[:-1], layer.out_features))
        elif isinstance(layer, (nn.ReLU, nn.Sigmoid, nn.Tanh)):  # keep their output
            if layer.__dict__.get("inplace") and not self.kept:
                self.output(self.shape, kept=True)
            elif not layer.__dict__.get("inplace"):
                self.output(self.shape, kept=True)
        elif isinstance(layer, (nn.GELU, nn.SiLU)):  # keep their input
            self.keep_input()
            self.output(self.shape)
        elif isinstance(layer, nn.Conv2d):
            self.keep_input()
            self.output(_conv_out(self.shape, layer))
        elif isinstance(layer, nn.BatchNorm2d):  # input, plus the batch mean and 1/std
            self.keep_input()
            self.total += 2 * self.shape[1] * 4
            self.output(self.shape)
        elif isinstance(layer, nn.MaxPool2d):  # input, plus int64 indices of the output
            self.keep_input()
            out = _conv_out(self.shape, layer)
            self.total += self._bytes(out, 8)
            self.output(out)
        elif isinstance(layer, nn.AdaptiveAvgPool2d):  # a mean: keeps nothing
            size = layer.output_size
            hw = (size, size) if isinstance(size, int) else size
            self.output((*self.shape[:2], *hw))
        elif isinstance(layer, nn.Flatten):  # a view: same storage, same flag
            self.shape = (self.shape[0], math.prod(self.shape[1:]))
        elif isinstance(layer, nn.Identity):
            pass
        elif _is_bottleneck(layer):
            self.bottleneck(layer)
        elif isinstance(layer, nn.Sequential):
            for sub in layer:
                self.step(sub)
        else:
            raise ValueError(
                f"no memory rule for layer type {type(layer).__name__}; valid: Linear, ReLU, "
                "GELU, SiLU, Conv2d, BatchNorm2d, MaxPool2d, AdaptiveAvgPool2d, Flatten, "
                "Identity, Bottleneck, Sequential of these"
            )

    def bottleneck(self, block: nn.Module) -> None:
        """conv-bn-relu x2, conv-bn, (+ downsample(x)), add, relu: torchvision's order."""
        x_shape = self.shape
        for conv, bn in ((block.conv1, block.bn1), (block.conv2, block.bn2)):
            self.step(conv)
            self.step(bn)
            self.step(block.relu)
        self.step(block.conv3)
        self.step(block.bn3)
        out_shape = self.shape
        if block.downsample is not None:
            branch = LayerWalk(x_shape, self.e)
            branch.kept = True  # conv1 already keeps x
            branch.step(block.downsample)
            self.total += branch.total
        self.output(out_shape, kept=True)  # out += identity (no save), then ReLU keeps out

    def loss(self, kind: str) -> None:
        """What the loss keeps: MSE its input and target; cross-entropy log-probs and labels."""
        if kind not in LOSSES:
            raise ValueError(f"unknown loss {kind!r}; valid choices: {', '.join(LOSSES)}")
        if kind == "mse":
            self.keep_input()
            self.total += self._bytes(self.shape)
        else:
            rows = math.prod(self.shape[:-1])
            self.total += self._bytes(self.shape) + rows * 8 + 4


def activation_bytes(
    layers: Sequence[nn.Module],
    input_shape: Shape,
    split_points: Sequence[int] = (),
    *,
    loss: str = "mse",
    element_size: int = 4,
) -> list[int]:
    """Saved-for-backward bytes per part of ``layers`` cut before each split point."""
    bounds = [0, *split_points, len(layers)]
    shape, out = tuple(input_shape), []
    for k, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        walk = LayerWalk(shape, element_size)
        for layer in layers[a:b]:
            walk.step(layer)
        if k == len(bounds) - 2:
            walk.loss(loss)
        out.append(walk.total)
        shape = walk.shape
    return out
