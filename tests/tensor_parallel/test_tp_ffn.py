"""The tensor-parallel FFN: shards, the one-process simulation, backward, bad input, cost."""

import pytest
import torch
from torch import nn

from helpers.core.devices import resolve_device, resolve_dtype
from helpers.tensor_parallel import mappings as comm
from helpers.tensor_parallel.block import ParallelBlock, chunks, load_chunks, shard_vs_full
from helpers.tensor_parallel.ffn import (
    FeedForward,
    FeedForwardShard,
    cut_shard,
    make_input,
    make_shards,
    split_weights,
    tp_simulate,
    validate_split,
)
from helpers.tensor_parallel.mappings import tp_cost
from helpers.tensor_parallel.proofs import (
    checksum,
    checksum_tolerance,
    checksums_match,
    eps,
    output_tolerance,
    outputs_agree,
)

META = torch.device("meta")


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
        validate_split(ffn, world)
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


@pytest.fixture
def three_ranks(monkeypatch):
    """all_reduce as if three ranks held the same tensor: the sum is 3x, in place."""
    calls = []

    def all_reduce(tensor, op=None, group=None):
        calls.append((op, group))
        tensor.mul_(3)

    monkeypatch.setattr(comm.dist, "all_reduce", all_reduce)
    return calls


def test_f_is_identity_forward_and_all_reduce_backward(three_ranks):
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    y = comm.f(x, "G")
    assert torch.equal(y, x) and three_ranks == []
    grad = torch.tensor([0.5, 1.0])
    y.backward(grad)
    assert torch.equal(x.grad, 3 * grad) and torch.equal(grad, torch.tensor([0.5, 1.0]))
    assert three_ranks == [(comm.dist.ReduceOp.SUM, "G")]


def test_g_is_all_reduce_forward_and_identity_backward(three_ranks):
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    y = comm.g(x, "G")
    assert torch.equal(y, torch.tensor([3.0, -6.0])) and torch.equal(x, torch.tensor([1.0, -2.0]))
    y.backward(torch.tensor([0.5, 1.0]))
    assert torch.equal(x.grad, torch.tensor([0.5, 1.0]))
    assert three_ranks == [(comm.dist.ReduceOp.SUM, "G")]


def test_tp_forward_is_g_of_the_shard_of_f(three_ranks):
    shard = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        shard.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
    x = torch.tensor([[1.0, 1.0]], requires_grad=True)
    out = comm.tp_forward(shard, x, "G")
    assert torch.equal(out, torch.tensor([[9.0, 3.0]]))  # 3 ranks x [3, 1]
    out.sum().backward()
    assert torch.equal(x.grad, torch.tensor([[3.0, 9.0]]))  # f's backward sums the ranks' grads
    assert [group for _, group in three_ranks] == ["G", "G"]


def test_cost_matches_the_shards_real_bytes_and_flops():
    from torch.utils.flop_counter import FlopCounterMode

    shard = FeedForwardShard(32, 128, 4, 1).half()
    x = torch.zeros(2, 3, 32, dtype=torch.float16)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        out = shard(x)
    cost = comm.tp_cost(2, 3, 32, 128, 4, 2)
    assert cost.world_size == 4
    assert cost.flops == counter.get_total_flops()
    assert cost.weight_bytes == sum(p.numel() * p.element_size() for p in shard.parameters())
    assert cost.allreduce_bytes == out.numel() * out.element_size() * 2 * 3 / 4
    with pytest.raises(ValueError, match=r"^world_size=0; valid: an integer >= 1$"):
        comm.ring_allreduce_bytes(100.0, 0)


def test_cost_table():
    table = comm.format_costs([comm.tp_cost(8, 512, 512, 4096, p, 2) for p in (1, 4)])
    assert table.splitlines() == [
        "ranks  GFLOP/rank  weights/rank  ring all-reduce/rank  FLOPs per byte sent",
        "    1      34.360      8.00 MiB                   0 B     no communication",
        "    4       8.590      2.00 MiB              6.00 MiB                1,365",
    ]


@pytest.mark.parametrize(
    "ffn,world,valid",
    [(6, 4, "1, 2, 3, 6"), (64, 3, "1, 2, 4, 8, 16, 32, 64"), (65, 2, "1, 5, 13, ..."),
     (130, 3, "1, 2, 5, 10, 13, 26, ...")],
)  # fmt: skip
def test_bad_split_lists_the_valid_world_sizes(ffn, world, valid):
    with pytest.raises(ValueError, match=rf"valid world sizes for ffn_size {ffn}: {valid}$"):
        validate_split(ffn, world)


def test_ffn_size_must_be_a_positive_int():
    assert validate_split(1, 1) == 1
    for bad in (0, 8.0):
        with pytest.raises(ValueError, match=rf"^ffn_size={bad!r}; valid: an integer >= 1$"):
            validate_split(bad, 2)


def test_defaults_and_shapes_of_shards():
    torch.manual_seed(0)
    model = FeedForward(4, 8)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.allclose(model(2 * x), 2 * model(x))  # no activation: linear
    shard = FeedForwardShard(4, 8, 2, 1)
    assert isinstance(shard.act, nn.Identity) and shard.rows() == slice(4, 8)
    with pytest.raises(
        ValueError, match=r"^fc1.weight: a chunk of shape \(3, 3\) for a parameter of shape \(4, 4\)$"
    ):
        load_chunks(shard, {"fc1.weight": torch.zeros(3, 3), "fc2.weight": torch.zeros(4, 4)})
    half = cut_shard(model.half(), 2, 1)
    assert half.fc1.weight.dtype == torch.float16 and isinstance(half.act, nn.Identity)
    assert torch.equal(half.fc2.weight, model.fc2.weight[:, 4:])
    with pytest.raises(ValueError, match=r"^tp_simulate needs at least one shard$"):
        tp_simulate([], x)


def test_shard_vs_full_measures_the_matching_slices():
    full = FeedForward(3, 4)
    with torch.no_grad():
        full.fc1.weight.copy_(torch.arange(12.0).reshape(4, 3))
        full.fc2.weight.copy_(torch.arange(12.0).reshape(3, 4))
    shard = cut_shard(full, 2, 1)  # fc1's rows 2:4, fc2's columns 2:4
    assert shard_vs_full(shard, full, 2, 1) == 0.0
    with torch.no_grad():
        shard.fc2.weight[1, 0] += 0.25
    assert shard_vs_full(shard, full, 2, 1) == 0.25
    with torch.no_grad():
        shard.fc1.weight[0, 2] -= 0.5
    assert shard_vs_full(shard, full, 2, 1) == 0.5
    assert shard_vs_full(cut_shard(full, 2, 0), full, 2, 0) == 0.0
    with pytest.raises(ValueError, match=r"fc1.weight: the shard's \(2, 3\) does not match the "
                       r"full block's slice \(1, 3\)"):  # fmt: skip
        shard_vs_full(shard, full, 4, 3)


def test_the_ffn_is_a_parallel_block_with_the_sources_file_names():
    full = FeedForward(3, 4, "gelu")
    assert isinstance(full, ParallelBlock) and full.sizes() == {"hidden_size": 3, "ffn_size": 4}
    assert [s.file(2) for s in full.splits()] == ["fc1_2.bin", "fc2_2.bin"]
    assert isinstance(full.shard(2, 0).act, nn.GELU)
    with pytest.raises(ValueError, match="fc1.weight has 4 along dim 0, not divisible by world"):
        chunks(full, 3)


def test_input_is_float32_draws_whatever_the_default_dtype():
    reference = make_input(2, 3, 4)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert torch.equal(make_input(2, 3, 4), reference)
    finally:
        torch.set_default_dtype(default)
    assert make_input(1, 1, 2, device="meta").device == META


def test_agreement_holds_exactly_at_the_tolerance():
    y = torch.tensor([1.0, 0.5], dtype=torch.float64)
    tol = 4 * 2 * eps("float32")  # max|y| = 1, two ranks
    assert outputs_agree(y, y + torch.tensor([tol, 0.0], dtype=torch.float64), "float32", 2)[2]
    assert checksums_match(100.0, 100.0 + 1024.0 * eps("float32"), 1024.0, "float32")
