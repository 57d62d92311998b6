import copy

import pytest
import torch
from torch import nn

from helpers.core.checks import compare_training_step
from helpers.core.sizes import parameter_count
from helpers.model_parallel.resnet import (
    model_parallel_resnet50,
    one_hot_labels,
    resnet50,
    resnet_layers,
    split_points_at,
    train,
)
from helpers.model_parallel.stages import StagedModel, check_split_points, stage_bytes

CPU = torch.device("cpu")


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
        check_split_points(points, 6)


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
