import pytest
import torch

from helpers.core.checks import compare_training_step
from helpers.models.toy import ToyModel, copy_to_one_device, parameter_table


def test_split_toy_model_matches_single_device():
    torch.manual_seed(0)
    split = ToyModel("cpu", "cpu", 100, 10, 5)
    single = copy_to_one_device(split, "cpu")
    x, y = torch.rand(4, 100), torch.randn(4, 5)
    result = compare_training_step(single, split, x, y, lr=0.1)
    assert max(result.output, result.loss, result.grads, result.weights) == 0.0
    assert "OK" in result.check(atol=1e-6)


def test_check_catches_a_wrong_weight():
    torch.manual_seed(0)
    split = ToyModel("cpu", "cpu", 100, 10, 5)
    wrong = copy_to_one_device(split, "cpu")
    with torch.no_grad():
        wrong.net1.bias[3] += 0.5
    x, y = torch.rand(4, 100), torch.randn(4, 5)
    with pytest.raises(AssertionError, match="differs beyond tolerance"):
        compare_training_step(split, wrong, x, y).check(atol=1e-6)


def test_parameter_table_lists_device_and_dtype():
    table = parameter_table(ToyModel("cpu", "cpu", 20, 4, 2))
    assert "net2.bias" in table and "torch.float32" in table and "cpu" in table
