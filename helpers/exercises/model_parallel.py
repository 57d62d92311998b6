"""Checkers for lessons 01 (the toy model) and 02 (ResNet50 in stages)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from helpers.exercises.feedback import Wrong, answer, checker
from helpers.memory import measure_training_memory
from helpers.model_parallel.resnet import resnet50, resnet_layers
from helpers.models.toy import ToyModel
from helpers.pipeline.stage_cuts import balanced_split_points


def _adam_cases() -> list[tuple[str, nn.Module, int, int]]:
    torch.manual_seed(0)
    return [
        ("nn.Linear(10, 5)", nn.Linear(10, 5), 10, 5),
        ("nn.Linear(300, 7, bias=False)", nn.Linear(300, 7, bias=False), 300, 7),
        ("ToyModel('cpu', 'cpu', 1000, 10, 5)", ToyModel("cpu", "cpu", 1000, 10, 5), 1000, 5),
    ]


def adam_reference(module: nn.Module, in_features: int, out_features: int) -> int:
    """Adam's state after one real step, as ``measure_training_memory`` counts it."""
    ledger = measure_training_memory(module, torch.randn(4, in_features),
                                     torch.randn(4, out_features), optimizer="adam")
    return ledger.sum().optimizer_state


@checker("01.1", "Write the body of adam_bytes(module), then run this cell again.")
def check_adam_bytes(adam_bytes: Callable[[nn.Module], int]) -> str:
    """Bytes of Adam's state for a module's parameters, against one measured Adam step."""
    for label, module, n_in, n_out in _adam_cases():
        got = answer(adam_bytes, module)
        want = adam_reference(module, n_in, n_out)
        if got == want:
            continue
        params = list(module.parameters())
        numel = sum(p.numel() for p in params)
        if got == want - 4 * len(params):
            hint = ("the moments are not all Adam keeps: its bias correction needs the "
                    "number of steps taken, so it keeps a step counter per parameter tensor")
        elif got in (numel * 4, numel):
            hint = ("one running average per parameter is not Adam: it keeps two, of the "
                    "gradient and of its square, each as large as the parameter")
        elif got == want // 4 or got == (want - 4 * len(params)) // 4:
            hint = "that counts elements; memory is counted in bytes, and a float32 holds 4"
        else:
            hint = ("Adam's state follows the parameters: for each parameter tensor, running "
                    "averages of the gradient and of its square, and how many steps it took")
        raise Wrong(f"For {label} you said {got:,} bytes; one measured Adam step keeps "
                    f"{want:,} bytes of state", hint)
    return ("Your count matches one real Adam step on every module tried (Linear with and "
            "without bias, the toy model).")


def crossing_reference(layers: nn.Sequential, cut: int, batch: int) -> int:
    """Bytes that cross a cut before ``layers[cut]`` in one training step, measured.

    Forward, the output of ``layers[cut - 1]`` goes to the next device; backward, its
    gradient (same shape and dtype) comes back.
    """
    if not 0 < cut < len(layers):
        raise ValueError(f"cut={cut}; valid: 1..{len(layers) - 1} (a cut between two layers)")
    seen: list[torch.Tensor] = []
    handle = layers[cut - 1].register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        x = torch.randn(batch, layers[0].in_features)
        out = layers(x)
    finally:
        handle.remove()
    grads = torch.autograd.grad(out.sum(), seen[0])
    return sum(t.numel() * t.element_size() for t in (seen[0], *grads))


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 16), nn.ReLU(),
                         nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 8))


@checker("01.2", "Write the body of crossing_bytes(layers, cut, batch), then run this cell again.")
def check_crossing_bytes(crossing_bytes: Callable[[nn.Sequential, int, int], int]) -> str:
    """Bytes crossing a cut per training step, against hooks on a real forward and backward."""
    layers = _mlp()
    costs = {}
    for cut in range(1, len(layers)):
        for batch in (1, 32):
            got = answer(crossing_bytes, layers, cut, batch)
            want = crossing_reference(layers, cut, batch)
            if got != want:
                hint = ("the forward pass is half of a training step: the backward pass "
                        "sends the gradient of that activation back across the cut, and a "
                        "gradient is as large as its tensor" if got * 2 == want else
                        "that counts elements; memory is counted in bytes, and a float32 "
                        "holds 4" if got * 4 in (want, want // 2)
                        else "what crosses is what the device before the cut hands over: the "
                        "activation leaving its last layer, as wide as that layer's output")
                raise Wrong(f"crossing_bytes(layers, cut={cut}, batch={batch}) = {got:,}; "
                            f"measured with hooks: {want:,} bytes", hint)
            costs[cut] = want
    best = min(costs, key=costs.get)
    return (f"Every cut of the 7-layer MLP tried is right. The cheapest place to cut it is "
            f"before layers[{best}] ({costs[best]:,} bytes per step at batch 32): cut where "
            f"the activation is narrow.")


@checker("02.1", "Write the body of three_stage_cut(costs), then run this cell again.")
def check_three_stage_cut(three_stage_cut: Callable[[Sequence[float]], Sequence[int]],
                          flops: Sequence[float]) -> str:
    """Two cut points whose costliest stage is as cheap as the balanced cut's."""
    cases = [("this lesson's ResNet50 blocks", list(flops)),
             ("costs [1, 1, 1, 1, 1, 1]", [1.0] * 6),
             ("costs [9, 1, 1, 1, 1, 1, 1, 1, 1]", [9.0] + [1.0] * 8)]
    for label, costs in cases:
        got = answer(three_stage_cut, costs)
        try:
            i, j = (int(p) for p in got)
        except (TypeError, ValueError) as error:
            raise Wrong(f"three_stage_cut returned {got!r}; expected two indices [i, j]",
                        "stage 1 is costs[:i], stage 2 costs[i:j], stage 3 costs[j:]") from error
        if not 0 < i < j < len(costs):
            raise Wrong(f"For {label} you cut at {[i, j]}; every stage needs at least one layer",
                        f"indices must satisfy 0 < i < j < {len(costs)}")
        stages = [sum(costs[:i]), sum(costs[i:j]), sum(costs[j:])]
        best_i, best_j = balanced_split_points(costs, 3)
        best = max(sum(costs[:best_i]), sum(costs[best_i:best_j]), sum(costs[best_j:]))
        if max(stages) > best:
            shares = ", ".join(f"{s / sum(costs):.0%}" for s in stages)
            even = (i, j) == (len(costs) // 3, 2 * len(costs) // 3)
            raise Wrong(f"For {label} your stages take {shares} of the cost; the slowest takes "
                        f"{max(stages) / sum(costs):.1%}, but a cut exists whose slowest stage "
                        f"takes {best / sum(costs):.1%}",
                        ("equal numbers of layers are not equal work: the layers cost "
                         "different amounts, and the pipeline runs at the pace of its slowest "
                         "stage" if even else
                         "the pipeline runs at the pace of its slowest stage, so the best cut "
                         "is the one whose costliest stage is cheapest, whatever the other "
                         "two cost: evening out two stages can leave the third too heavy"))
    i, j = balanced_split_points(list(flops), 3)
    shares = [sum(flops[:i]), sum(flops[i:j]), sum(flops[j:])]
    return ("Your cuts make the slowest stage as cheap as it can be. For ResNet50: "
            + ", ".join(f"{s / sum(flops):.0%}" for s in shares) + " of the FLOPs per stage.")


def resnet_blocks() -> list[tuple[str, nn.Module]]:
    """ResNet50 as the lesson's block list, in eval mode (only the shapes matter here)."""
    return [(name, m.eval()) for name, m in resnet_layers(resnet50(10), blocks=True)]


def block_input(layers: list[tuple[str, nn.Module]], block: str, batch: int,
                image_size: int) -> torch.Tensor:
    """The tensor a cut before ``block`` (e.g. "layer3_0") carries, from a real forward."""
    names = [name for name, _ in layers]
    if block not in names or not block.startswith("layer"):
        valid = [n for n in names if n.startswith("layer")]
        raise ValueError(f"block={block!r}; valid: {', '.join(valid)}")
    first = nn.Sequential(*(m for _, m in layers[:names.index(block)]))
    with torch.no_grad():
        return first(torch.randn(batch, 3, image_size, image_size))


CUT_CASES = (("layer3_0", 1, 64), ("layer3_0", 2, 224), ("layer1_0", 3, 64), ("layer2_0", 1, 96),
             ("layer2_3", 2, 64), ("layer4_0", 1, 100), ("layer4_2", 2, 128))


@checker("02.2", "Write the body of cut_bytes(block, batch, image_size), then run this cell again.")
def check_cut_bytes(cut_bytes: Callable[[str, int, int], int]) -> str:
    """Bytes of the activation at a cut before a bottleneck block, against a real forward."""
    layers = resnet_blocks()
    for block, batch, size in CUT_CASES:
        got = answer(cut_bytes, block, batch, size)
        out = block_input(layers, block, batch, size)
        want = out.numel() * out.element_size()
        if got != want:
            hint = ("count bytes: a float32 element is 4 bytes" if got * 4 == want else
                    "check how many times height and width have been halved (rounding up) "
                    "before that block" if got in (want * 4, want // 4) else
                    "the cut carries the output of the block just before it: how many "
                    "channels does that stage put out?")
            raise Wrong(f"cut_bytes({block!r}, batch={batch}, image_size={size}) = {got:,}; the "
                        f"tensor that crosses has {want:,} bytes", hint)
    sizes = {b: block_input(layers, b, 1, 224) for b in ("layer2_0", "layer3_0", "layer4_0")}
    return ("Every cut tried matches. Per 224 x 224 image: "
            + ", ".join(f"before {b} {t.numel() * 4 / 2**20:.2f} MiB" for b, t in sizes.items())
            + ": deeper cuts carry less, because the resolution falls faster than the channels grow.")
