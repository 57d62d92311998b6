import copy

import pytest
import torch
from torch import nn

from helpers.core.checks import compare_training_step
from helpers.core.sizes import parameter_count
from helpers.memory.saved import SavedTensorMeter
from helpers.model_parallel.resnet import (
    model_parallel_resnet50,
    one_hot_labels,
    resnet50,
    resnet_layers,
    split_points_at,
    train,
)
from helpers.model_parallel.stages import (
    StagedModel,
    input_device,
    stage_bytes,
    validate_split_points,
)

CPU, META = torch.device("cpu"), torch.device("meta")


def _mlp_layers(n: int = 6) -> list[tuple[str, nn.Module]]:
    torch.manual_seed(0)
    return [(f"l{i}", nn.Sequential(nn.Linear(8, 8), nn.Tanh())) for i in range(n)]


@pytest.mark.parametrize("points", [[3], [1, 4], [1, 2, 3, 4, 5]])
def test_k_stage_split_preserves_parameters_and_outputs(points):
    layers = _mlp_layers()
    reference = nn.Sequential(*[copy.deepcopy(m) for _, m in layers])
    staged = StagedModel(layers, points, [CPU] * (len(points) + 1))
    assert len(staged.stages) == len(points) + 1
    bounds = [0, *points, len(layers)]
    for stage, a, b in zip(staged.stages, bounds, bounds[1:], strict=False):
        assert list(stage._modules) == [f"l{i}" for i in range(a, b)]  # the cut is where asked
    assert parameter_count(staged) == parameter_count(reference)
    assert sum(stage_bytes(staged)) == sum(p.numel() * 4 for p in reference.parameters())
    x = torch.randn(5, 8)
    assert torch.equal(staged(x), reference(x))


def test_resnet50_split_matches_unsplit_in_a_training_step():
    torch.manual_seed(0)
    single = resnet50(10)
    split = model_parallel_resnet50([CPU, CPU], model=copy.deepcopy(single))
    assert parameter_count(split) == parameter_count(single)
    assert [list(s._modules)[0] for s in split.stages] == ["conv1", "layer3"]
    images = torch.randn(2, 3, 32, 32)
    labels = one_hot_labels(torch.tensor([1, 7]), 10)
    comparison = compare_training_step(single, split, images, labels, lr=0.01)
    assert max(comparison.output, comparison.loss, comparison.grads, comparison.weights) <= 1e-6


def test_full_resnet50_has_the_documented_size():
    assert parameter_count(resnet50(1000)) == 25_557_032


def test_one_hot_labels_have_one_one_per_row():
    labels = one_hot_labels(torch.tensor([0, 3, 3]), 5)
    assert labels.sum(dim=1).tolist() == [1, 1, 1] and labels[1, 3] == 1


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([0], r"split point 0 is out of range; valid: integers from 1 to 5"),
        ([6], r"split point 6 is out of range"),
        ([4, 2], r"not strictly increasing \(4 then 2\)"),
        ([2, 2], r"not strictly increasing"),
        ([1, 2, 3, 4, 5, 6], r"7 stages requested but the model has 6 layers"),
        (["3"], r"split point '3' is out of range"),
    ],
)
def test_bad_split_points_name_the_value_and_range(points, message):
    with pytest.raises(ValueError, match=message):
        validate_split_points(points, 6)


def test_device_count_must_match_stage_count():
    with pytest.raises(ValueError, match="2 stages but 3 devices given"):
        StagedModel(_mlp_layers(), [3], [CPU] * 3)


def test_unknown_layer_name():
    with pytest.raises(ValueError, match=r"unknown layer name\(s\) \['layer9'\]"):
        split_points_at(resnet_layers(resnet50(10)), ["layer9"])


@pytest.mark.parametrize("field", ["batch_size", "num_batches", "image_size"])
def test_training_loop_rejects_empty_sizes(field):
    sizes = {"batch_size": 2, "num_batches": 1, "image_size": 32, field: 0}
    with pytest.raises(ValueError, match=f"{field}=0; valid: an integer >= 1"):
        train(resnet50(10), num_classes=10, **sizes)


def test_training_loop_updates_every_stage():
    torch.manual_seed(0)
    model = model_parallel_resnet50([CPU, CPU], num_classes=10)
    before = [
        model.stages[0].conv1.weight.detach().clone(),
        model.stages[1].fc.weight.detach().clone(),
    ]
    loss = train(model, num_batches=2, batch_size=4, image_size=32, num_classes=10, seed=0)
    assert torch.isfinite(torch.tensor(loss))
    after = [model.stages[0].conv1.weight, model.stages[1].fc.weight]
    assert all(not torch.equal(b, a) for b, a in zip(before, after, strict=True))


def _layers() -> list[tuple[str, nn.Module]]:
    torch.manual_seed(0)
    return [("l0", nn.Linear(4, 6)), ("act", nn.Tanh()), ("l1", nn.Linear(6, 3))]


def test_split_point_messages_give_the_valid_range():
    with pytest.raises(ValueError, match=r"valid: at most 3 stages \(2 split points\)$"):
        validate_split_points([1, 2, 3], 3)
    with pytest.raises(ValueError, match=r"\(2 then 1\); valid: each cut after the previous one$"):
        validate_split_points([2, 1], 3)


class _Where(nn.Module):
    """Passes its input through, noting the device it arrived on."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.device] = []

    def forward(self, x):
        self.seen.append(x.device)
        return x


def test_each_stage_lives_on_its_device_and_the_activation_follows():
    staged = StagedModel(_layers(), [2], [CPU, META])
    assert staged.stages[0].l0.weight.device == CPU
    assert staged.stages[1].l1.weight.device == META
    first, second = _Where(), _Where()
    out = StagedModel([("a", first), ("b", second)], [1], [CPU, META])(torch.randn(5, 4))
    assert first.seen == [CPU] and second.seen == [META] and out.device == META
    assert input_device(staged) == CPU
    assert input_device(StagedModel(_layers(), [1], [META, CPU])) == META
    assert input_device(nn.Linear(2, 2, device=META)) == META  # not staged: first parameter


def saved_activation_bytes(model: StagedModel, x: torch.Tensor) -> list[int]:
    """Peak bytes kept for backward per stage, for one training-mode forward (the meter's)."""
    parts = {str(k): stage for k, stage in enumerate(model.stages)}
    model.train()
    with SavedTensorMeter(model, parts) as meter:
        model(x)
        return [meter.peak.get(name, 0) for name in parts]


def test_saved_activations_are_counted_once_per_stage_without_the_weights():
    torch.manual_seed(0)
    x = torch.randn(5, 4)  # 80 bytes; the Tanh output is 5 x 6 floats = 120 bytes
    cut_after_tanh = StagedModel(_layers(), [2], [CPU, CPU])
    # stage 0: l0 keeps its input, Tanh its output; stage 1: l1 keeps that output again
    assert saved_activation_bytes(cut_after_tanh, x) == [200, 120]
    cut_before_tanh = StagedModel(_layers(), [1], [CPU, CPU])
    # stage 1: Tanh's output and l1's input are one tensor, counted once
    assert saved_activation_bytes(cut_before_tanh, x) == [80, 120]
    layers = [*_layers()[:2], ("drop", nn.Dropout(0.5)), ("l1", nn.Linear(6, 3))]
    dropping = StagedModel(layers, [2], [CPU, CPU])
    per_stage = saved_activation_bytes(dropping, x)  # dropout keeps its mask in training
    assert per_stage[0] == 200 and per_stage[1] > 120
    where = _Where()
    assert saved_activation_bytes(
        StagedModel([("a", _Where()), ("b", where)], [1], [CPU, META]), x
    ) == [0, 0]
    assert where.seen == [META]  # the activation went to the next stage's device


def test_the_layer_chain_is_every_stage_in_order_with_its_split_points():
    """What helpers.memory's estimator reads: the layers in forward order, cut between stages."""
    layers = [nn.Linear(4, 4) for _ in range(6)]
    staged = StagedModel([(f"l{i}", m) for i, m in enumerate(layers)], [2, 5],
                         [torch.device("cpu")] * 3)
    chain, points = staged.layer_chain()
    assert [id(m) for m in chain] == [id(m) for m in layers] and points == [2, 5]
