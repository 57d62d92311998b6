"""ResNet50 built locally, seen as an ordered list of layers, and the source's training loop."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet

from helpers.model_parallel.stages import Layers, StagedModel, input_device

# Where the source cuts ResNet50: stage 1 = conv1 .. layer2, stage 2 = layer3 .. fc.
SOURCE_SPLIT = ("layer3",)


def resnet50(num_classes: int = 1000) -> ResNet:
    """torchvision's ResNet50 architecture with fresh random weights (nothing downloaded)."""
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes=num_classes)


def resnet_layers(model: ResNet, *, blocks: bool = False) -> list[tuple[str, nn.Module]]:
    """The forward pass as a layer list: conv1, bn1, relu, maxpool, layer1..4, avgpool, flatten, fc.

    With ``blocks=True`` each of layer1..4 is opened into its bottleneck blocks
    (``layer3_0``, ``layer3_1``, ...: module names cannot contain dots), which gives
    finer places to cut.
    The modules are the model's own (shared, not copied).
    """
    layers: list[tuple[str, nn.Module]] = []
    for name in ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4"):
        module = getattr(model, name)
        if blocks and name.startswith("layer"):
            layers += [(f"{name}_{i}", block) for i, block in enumerate(module)]
        else:
            layers.append((name, module))
    layers += [("avgpool", model.avgpool), ("flatten", nn.Flatten(1)), ("fc", model.fc)]
    return layers


def split_points_at(layers: Layers, names: Sequence[str]) -> list[int]:
    """Indices of the named layers: a cut is made before each of them."""
    index = {name: i for i, (name, _) in enumerate(layers)}
    unknown = [n for n in names if n not in index]
    if unknown:
        raise ValueError(f"unknown layer name(s) {unknown}; valid: {list(index)}")
    return [index[n] for n in names]


def model_parallel_resnet50(
    devices: Sequence[torch.device], num_classes: int = 1000, model: ResNet | None = None
) -> StagedModel:
    """The source's two-stage ResNet50: conv1..layer2 on devices[0], layer3..fc on devices[1]."""
    layers = resnet_layers(model if model is not None else resnet50(num_classes))
    return StagedModel(layers, split_points_at(layers, SOURCE_SPLIT), devices)


def one_hot_labels(indices: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(batch, num_classes) zeros with a single 1 per row, made with ``scatter_`` as the source."""
    return torch.zeros(indices.shape[0], num_classes).scatter_(1, indices.view(-1, 1), 1)


def train(
    model: nn.Module,
    *,
    num_batches: int,
    batch_size: int,
    image_size: int,
    num_classes: int = 1000,
    lr: float = 0.01,
    seed: int | None = None,
) -> float:
    """The source's loop: random images, one-hot labels, MSELoss, SGD; returns the last loss."""
    for name, value in (
        ("batch_size", batch_size),
        ("num_batches", num_batches),
        ("image_size", image_size),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}; valid: an integer >= 1")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    model.train(True)
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    indices = torch.randint(0, num_classes, (batch_size,), generator=generator)
    device = input_device(model)
    loss = torch.tensor(float("nan"))
    for _ in range(num_batches):
        inputs = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
        labels = one_hot_labels(indices, num_classes)
        optimizer.zero_grad()
        outputs = model(inputs.to(device))
        loss = loss_fn(outputs, labels.to(outputs.device))
        loss.backward()
        optimizer.step()
    return loss.item()


def split_tolerance(device: torch.device) -> float:
    """Largest difference allowed between the split and the single ResNet50 (lesson 02).

    On the CPU both run the same float32 kernels in the same order: the bits agree, and
    1e-6 leaves room only for that. On CUDA, convolutions run in TF32 by default and some
    of cuDNN's convolution algorithms are not deterministic, so the bits can differ even
    between two runs on one GPU: 1e-3, chosen, the bound ``make gpu-check`` applies there
    (relative, to values of order 1).
    """
    return 1e-6 if torch.device(device).type == "cpu" else 1e-3
