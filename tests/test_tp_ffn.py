"""The tensor-parallel FFN: shards, the one-process simulation, backward, bad input, cost."""

import pytest
import torch

from helpers.core.devices import resolve_device, resolve_dtype
from helpers.tensor_parallel.comm import tp_cost
from helpers.tensor_parallel.ffn import (
    FeedForward,
    FeedForwardShard,
    check_split,
    make_input,
    make_shards,
    split_weights,
    tp_simulate,
)
from helpers.tensor_parallel.proofs import checksum, checksum_tolerance, output_tolerance


def _model(hidden=32, ffn=64, activation="none"):
    torch.manual_seed(1)
    return FeedForward(hidden, ffn, activation)


def test_shards_hold_rows_of_fc1_and_columns_of_fc2():
    model = _model()
    for rank, shard in enumerate(make_shards(model, 4)):
        assert shard.fc1.weight.shape == (16, 32) and shard.fc2.weight.shape == (32, 16)
        rows = slice(16 * rank, 16 * (rank + 1))
        assert shard.rows() == rows
        assert torch.equal(shard.fc1.weight, model.fc1.weight[rows])
        assert torch.equal(shard.fc2.weight, model.fc2.weight[:, rows])


@pytest.mark.parametrize("activation", ["none", "gelu"])
@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_sum_of_partials_equals_native_in_float32(world_size, activation):
    model = _model(activation=activation)
    x = make_input(2, 5, 32)
    with torch.no_grad():
        y = model(x)
        diff = (tp_simulate(make_shards(model, world_size, activation), x) - y).abs().max()
    assert diff <= output_tolerance(y, torch.float32, world_size)


def test_float16_simulation_within_its_tolerance_and_a_wrong_shard_is_not():
    model = _model()
    x = make_input(2, 5, 32, dtype=torch.float16)
    shards = [s.half() for s in make_shards(model, 4)]
    with torch.no_grad():
        y = model.half()(x)
        tol = output_tolerance(y, torch.float16, 4)
        assert (tp_simulate(shards, x) - y).abs().max() <= tol
        assert abs(checksum(tp_simulate(shards, x))[0] - checksum(y)[0]) <= checksum_tolerance(
            checksum(y)[1], torch.float16
        )
        shards[1].fc2.weight.mul_(-1)  # one rank with a wrong weight
        assert (tp_simulate(shards, x) - y).abs().max() > tol
        assert abs(checksum(tp_simulate(shards[:3], x))[0] - checksum(y)[0]) > checksum_tolerance(
            checksum(y)[1], torch.float16
        )


def test_gelu_needs_the_column_split():
    """Splitting fc1 by its *input* columns gives partial sums; GeLU of a sum is not a sum."""
    model = _model(activation="gelu")
    x = make_input(1, 4, 32)
    with torch.no_grad():
        y = model(x)
        halves = torch.split(model.fc1.weight, 16, dim=1), torch.split(x, 16, dim=-1)
        partial = [xi @ wi.T for wi, xi in zip(*halves, strict=True)]
        wrong = model.fc2(sum(torch.nn.functional.gelu(p) for p in partial))
        right = model.fc2(torch.nn.functional.gelu(sum(partial)))  # communicate first
    assert (wrong - y).abs().max() > 1e-2
    assert torch.allclose(right, y, atol=1e-6)


def test_backward_shard_gradients_are_slices_of_the_full_gradients():
    model = _model(activation="gelu")
    shards = make_shards(model, 4, "gelu")
    x1 = make_input(2, 3, 32).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    target = torch.randn(2, 3, 32)
    torch.nn.functional.mse_loss(model(x1), target).backward()
    torch.nn.functional.mse_loss(tp_simulate(shards, x2), target).backward()
    for s in shards:
        r = s.rows()
        assert torch.allclose(s.fc1.weight.grad, model.fc1.weight.grad[r], atol=1e-7)
        assert torch.allclose(s.fc2.weight.grad, model.fc2.weight.grad[:, r], atol=1e-7)
    assert torch.allclose(x1.grad, x2.grad, atol=1e-7)  # f's backward: the sum over ranks


def test_model_is_the_sources_after_manual_seed_1():
    torch.manual_seed(1)
    fc1 = torch.nn.Linear(32, 64, bias=False)
    fc2 = torch.nn.Linear(64, 32, bias=False)
    model = _model()
    assert torch.equal(model.fc1.weight, fc1.weight) and torch.equal(model.fc2.weight, fc2.weight)


def test_input_is_what_the_sources_tp_mode_draws_after_the_seed():
    torch.manual_seed(1)
    source = torch.rand((2, 5, 32), dtype=torch.float32).half()
    torch.manual_seed(123)  # whatever happened before does not matter
    assert torch.equal(make_input(2, 5, 32, dtype=torch.float16), source)


def test_split_weights_matches_torch_split():
    model = _model()
    (a1, a2), (b1, b2) = split_weights(model, 2)
    assert torch.equal(torch.cat([a1, b1], 0), model.fc1.weight)
    assert torch.equal(torch.cat([a2, b2], 1), model.fc2.weight)


@pytest.mark.parametrize(
    ("ffn", "world", "match"),
    [
        (100, 3, r"ffn_size=100 is not divisible by world_size=3.*valid world sizes.*1, 2, 4, 5"),
        (64, 0, r"world_size=0; valid: an integer >= 1"),
        (64, -2, r"world_size=-2; valid: an integer >= 1"),
    ],
)
def test_bad_splits_are_named(ffn, world, match):
    with pytest.raises(ValueError, match=match):
        check_split(ffn, world)
    with pytest.raises(ValueError, match=match):
        FeedForwardShard(8, ffn, world, 0)


def test_bad_rank_device_dtype_activation():
    with pytest.raises(ValueError, match=r"rank=4; valid: 0 \.\. 3"):
        FeedForwardShard(8, 16, 4, 4)
    with pytest.raises(ValueError, match=r"unknown device 'tpu'; valid choices here: cpu"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match=r"unknown device 'gpu0'"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match=r"'cuda' needs a CUDA GPU.*valid: cpu"):
        resolve_device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"unknown dtype 'half'; valid choices: float32, float16"):
        resolve_dtype("half")
    with pytest.raises(ValueError, match=r"unknown activation 'relu6'; valid choices: none, gelu"):
        FeedForward(8, 16, "relu6")


def test_cost_ring_allreduce_and_flops():
    one, four = tp_cost(8, 512, 512, 4096, 1, 2), tp_cost(8, 512, 512, 4096, 4, 2)
    assert one.allreduce_bytes == 0 and one.flops_per_byte is None
    assert one.flops == 4 * 8 * 512 * 512 * 4096 and four.flops == one.flops / 4
    assert four.allreduce_bytes == 2 * 3 / 4 * 8 * 512 * 512 * 2
    assert four.weight_bytes == one.weight_bytes // 4
