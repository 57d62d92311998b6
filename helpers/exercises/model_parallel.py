"""Checkers for lessons 01 (the toy model) and 02 (ResNet50 in stages)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from helpers.exercises.feedback import Wrong, answer, checker, given
from helpers.memory import measure_training_memory
from helpers.model_parallel.diagrams import busy_shares, naive_timeline
from helpers.model_parallel.resnet import resnet50, resnet_layers
from helpers.models.toy import ToyModel
from helpers.pipeline.stage_cuts import balanced_split_points

DEVICES, KINDS = ("dev0", "dev1"), ("weights", "grads", "optimizer", "activations")
_LEDGER_KIND = {"optimizer": "optimizer_state"}


def batch_growth(small: int = 4, large: int = 8) -> dict[tuple[str, str], int]:
    """Bytes each cell of the toy model's Adam ledger gains from batch ``small`` to ``large``."""
    model = ToyModel("cpu", "cpu", 1000, 10, 5)
    ledgers = [measure_training_memory(model, torch.randn(b, 1000), torch.randn(b, 5),
                                       optimizer="adam", parts={"dev0": model.net1,
                                                                "dev1": model.net2})
               for b in (small, large)]
    return {(d, k): getattr(ledgers[1][d], _LEDGER_KIND.get(k, k))
            - getattr(ledgers[0][d], _LEDGER_KIND.get(k, k)) for d in DEVICES for k in KINDS}


def _cells(grows: object) -> set[tuple[str, str]]:
    try:
        cells = {tuple(cell) for cell in grows}
    except TypeError as error:
        raise Wrong(f"grows = {grows!r}; expected a set of (device, kind) pairs") from error
    for cell in cells:
        if len(cell) != 2 or cell[0] not in DEVICES or cell[1] not in KINDS:
            raise Wrong(f"{cell!r} is not a cell of the ledger",
                        f"a cell is (device, kind): device one of {DEVICES}, kind one of {KINDS}")
    return cells


@checker("01.1", "Set grows to a set of (device, kind) pairs, then run this cell again.")
def check_batch_growth(grows: set[tuple[str, str]]) -> str:
    """Which cells of the Adam ledger grow with the batch, against two measured steps."""
    got, growth = _cells(given(grows)), batch_growth()
    want = {cell for cell, delta in growth.items() if delta > 0}
    fixed = sorted(c for c in got - want)
    if fixed:
        raise Wrong(f"{fixed} do not grow when the batch doubles",
                    "weights, gradients and Adam's moments are sized by the layers' shapes; "
                    "a bigger batch adds rows to the tensors the layers keep, not to the "
                    "layers")
    if ("dev0", "activations") not in got:
        raise Wrong("dev0's activations grow too",
                    "net1 keeps its input, batch x in_features floats, to compute its weight "
                    "gradient later; it keeps it on dev0, where net1 ran")
    if ("dev1", "activations") not in got:
        raise Wrong("dev1's activations grow too",
                    "dev1 keeps its own copy of the activation that crossed the cut, and MSE "
                    "keeps its output and target: one row of each per sample")
    d0, d1 = growth["dev0", "activations"], growth["dev1", "activations"]
    return (f"Only the activations grow, on both devices: from a batch of 4 to 8, dev0 keeps "
            f"{d0:,} B more and dev1 {d1:,} B more. The layers' shapes fix the weights, "
            "gradients and Adam's state; what a layer keeps for backward has one row per "
            "sample and stays on the device where the layer ran.")


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


@checker("01.3", "Write the body of busy_share(forward, backward), then run this cell again.")
def check_busy_share(busy_share: Callable[[list[float], list[float]], list[float]]) -> str:
    """Each device's busy share of a naive step, against the naive timeline's."""
    cases = [([1.0, 1.0], [2.0, 2.0]), ([3.0, 1.0], [6.0, 2.0]), ([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]),
             ([0.5, 4.0], [1.0, 8.0])]
    for forward, backward in cases:
        got = answer(busy_share, forward, backward)
        want = busy_shares(naive_timeline(forward, backward))
        try:
            shares = [float(s) for s in got]
        except (TypeError, ValueError) as error:
            raise Wrong(f"busy_share returned {got!r}; expected one share per device") from error
        if len(shares) == len(want) and all(abs(a - b) < 1e-9 for a, b in zip(shares, want,
                                                                                  strict=True)):
            continue
        call = f"busy_share({forward}, {backward}) = {[round(s, 3) for s in shares]}"
        if sum(shares) > 1 + 1e-9:
            hint = ("your shares add up to more than 1, as if two devices worked at once. "
                    "Device k+1 cannot start its forward before device k's activation "
                    "arrives, and device k's backward needs the gradient that device k+1 "
                    "sends back: the step lasts the sum of all stages' times")
        elif all(abs(s - 1 / len(forward)) < 1e-9 for s in shares):
            hint = ("a device works only while its own stage runs: its forward plus its "
                    "backward, out of the whole step")
        else:
            hint = "each share is that stage's forward plus backward, over the whole step"
        raise Wrong(f"{call}; the timeline gives {[round(s, 3) for s in want]}", hint)
    return ("Your shares add up to 1 in every case: at any moment exactly one device works, "
            "so K devices do the work of one. Lesson 03 cuts the batch into micro-batches so "
            "that the stages overlap.")


@checker("02.3", "Write the body of naive_speedup(stage_times, copy), then run this cell again.")
def check_naive_speedup(naive_speedup: Callable[[list[float], float], float]) -> str:
    """One device's step time over the naive split's, against the naive timeline."""
    cases = [([1.0, 1.0], 0.0), ([3.0, 1.0], 0.0), ([1.0, 1.0], 0.1), ([2.0, 1.0, 1.0], 0.05),
             ([0.6, 0.4], 0.01)]
    for times, copy in cases:
        got = answer(naive_speedup, times, copy)
        split = naive_timeline(times, [0.0] * len(times), copy)[-1].end
        want = sum(times) / split
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise Wrong(f"naive_speedup({times}, {copy}) = {got!r}; expected a number")
        if abs(got - want) < 1e-9:
            continue
        cuts = len(times) - 1
        if abs(got - sum(times) / max(times)) < 1e-9:
            hint = ("that is every stage working at once, a pipeline's best case. In the naive "
                    "split each stage waits for the one before it, so the split takes the sum "
                    "of the stages' times, as one device does, plus the copies")
        elif copy and abs(got - sum(times) / (sum(times) + cuts * copy)) < 1e-9:
            hint = ("the gradient crosses each cut back, too: two copies per cut per step")
        else:
            hint = ("one device takes sum(stage_times); the split takes the same, one stage "
                    "after another, plus a copy each way at every cut")
        raise Wrong(f"naive_speedup({times}, {copy}) = {got!r}; the timeline gives {want:.4f}",
                    hint)
    return ("Whatever the cut, the speed-up is at most 1: the stages take turns, so the split "
            "does one device's work plus the copies. Naive model parallelism buys memory, not "
            "speed; lesson 03 overlaps the stages with micro-batches.")


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
    """ResNet50 as the lesson's block list, in eval mode, on the meta device: only the
    shapes matter here, and a meta tensor has a shape and a dtype but no values."""
    with torch.device("meta"):
        model = resnet50(10)
    return [(name, m.eval()) for name, m in resnet_layers(model, blocks=True)]


def block_input(layers: list[tuple[str, nn.Module]], block: str, batch: int,
                image_size: int) -> torch.Tensor:
    """The tensor a cut before ``block`` (e.g. "layer3_0") carries, from a forward of the
    layers before it: every layer's own shape rule, without arithmetic on the meta device."""
    names = [name for name, _ in layers]
    if block not in names or not block.startswith("layer"):
        valid = [n for n in names if n.startswith("layer")]
        raise ValueError(f"block={block!r}; valid: {', '.join(valid)}")
    first = nn.Sequential(*(m for _, m in layers[:names.index(block)]))
    with torch.no_grad():
        device = next(first.parameters()).device
        return first(torch.randn(batch, 3, image_size, image_size, device=device))


CUT_CASES = (("layer3_0", 1, 64), ("layer3_0", 2, 224), ("layer1_0", 3, 64), ("layer2_0", 1, 96),
             ("layer2_3", 2, 64), ("layer4_0", 1, 100), ("layer4_2", 2, 128))


@checker("02.2", "Write the body of cut_bytes(block, batch, image_size), then run this cell again.")
def check_cut_bytes(cut_bytes: Callable[[str, int, int], int]) -> str:
    """Bytes of the activation at a cut before a bottleneck block, against a forward of the
    layers before it on the meta device (shapes only)."""
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
