"""The numbers every proof rests on, pinned, and each check tried on both sides of its line."""

import json
from dataclasses import replace

import pytest
import torch
from torch import nn

from helpers.core.checks import Proof, max_abs_diff, training_step
from helpers.core.timing import Timing
from helpers.memory.ledger import DeviceMemory, Ledger
from helpers.profiles import FFNSizes
from helpers.runs.tp_ffn.results import NativeRun, SweepRun, TPRun, TrainStep, WideRun
from helpers.runs.tp_ffn.timings import Sweep
from helpers.tensor_parallel.dtensor import DTensorRun
from helpers.tensor_parallel.mappings import ring_allreduce_bytes
from helpers.tensor_parallel.proofs import (
    checksum_tolerance,
    checksums_match,
    eps,
    output_tolerance,
    outputs_agree,
)


@pytest.mark.parametrize(
    "dtype,unit", [(torch.float32, 2.0**-23), (torch.float16, 2.0**-10), (torch.bfloat16, 2.0**-7)]
)
def test_tolerances_are_pinned_per_dtype(dtype, unit):
    y = torch.tensor([0.5, -2.0, 1.0])
    assert eps(dtype) == unit
    assert output_tolerance(y, dtype, 4) == 4 * 4 * unit * 2.0  # 4 * p * eps * max|y|
    assert output_tolerance(y, dtype, 1) == 4 * unit * 2.0
    assert checksum_tolerance(3.5, dtype) == unit * 3.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_elementwise_check_on_both_sides_of_the_tolerance(dtype):
    y = torch.linspace(-1, 1, 64, dtype=torch.float64)
    tol = output_tolerance(y, dtype, 2)
    for factor, ok in ((0.99, True), (1.01, False)):
        bumped = y.clone()
        bumped[17] += factor * tol
        assert outputs_agree(y, bumped, dtype, 2)[2] is ok
    assert outputs_agree(y, -y, dtype, 2)[2] is False  # same sum of |y|, wrong signs
    assert outputs_agree(y, y.flip(0), dtype, 2)[2] is False  # same sum, permuted


@pytest.mark.parametrize("sign", [+1, -1])
def test_checksum_comparison_on_both_sides(sign):
    tol = checksum_tolerance(1000.0, "float32")
    near, far = 100.0 + sign * 0.9 * tol, 100.0 + sign * 1.1 * tol
    assert checksums_match(100.0, near, 1000.0, "float32")
    assert not checksums_match(100.0, far, 1000.0, "float32")


@pytest.mark.parametrize("p,share", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_ring_allreduce_sends_two_times_p_minus_one_over_p(p, share):
    assert ring_allreduce_bytes(1000.0, p) == share * 1000.0


def _tp_run(checksum: float, diff: float) -> TPRun:
    return TPRun(
        2, "gloo", "cpu", "float32", (2, 3), checksum, 9.0, Proof("output", diff, 2e-7),
        Timing("compute", [0.1, 0.3]), Timing("all-reduce", [0.4, 0.6]), Timing("step", [0.5]),
        123.0, Ledger(),
    )  # fmt: skip


def test_sweep_numbers_keep_compute_and_allreduce_apart():
    native = NativeRun("float32", (2, 3), 5.0, 9.0, Timing("native", [0.9, 1.1]),
                       Proof("tp_simulate", 0.0, 1e-7))  # fmt: skip
    (row,) = Sweep(native, {2: _tp_run(5.0, 1e-7)}, {2: Timing("sim", [0.7, 0.9])}).numbers()
    assert row["compute_s"] == pytest.approx(0.2) and row["allreduce_s"] == pytest.approx(0.5)
    assert row["tp_s"] == 0.5 and row["native_s"] == pytest.approx(1.0)
    assert row["tp_simulate_s"] == pytest.approx(0.8)
    assert row["ring_bytes_per_rank"] == 123.0 and row["agrees"]
    assert row["wire_bytes_per_rank"] == [] and row["gloo_bytes_per_rank"] is None


def test_a_run_agrees_only_within_its_tolerance_and_with_the_same_sum():
    native = NativeRun("float32", (2, 3), 5.0, 9.0, Timing("native", [1.0]),
                       Proof("tp_simulate", 0.0, 1e-7))  # fmt: skip
    assert _tp_run(5.0, 2e-7).agrees(native)
    assert not _tp_run(5.0, 3e-7).agrees(native)  # one element too far
    assert not _tp_run(5.0 + 1e-5, 0.0).agrees(native)  # beyond eps * sum|y|
    assert "FAILED" in _tp_run(5.0, 3e-7).report(native)


def test_typed_results_round_trip_through_json():
    run = _tp_run(5.0, 1e-7)
    assert TPRun.from_dict(json.loads(json.dumps(run.to_dict()))) == run
    # every part a launch may add: a ledger's rows, the step, DTensor's run, the wide size
    full = replace(
        run, memory=Ledger({"cpu": DeviceMemory(weights=8, grads=8, activations=4)}),
        train_step=TrainStep("gelu", 0.1, 0.5, (Proof("loss", 0.0, 1e-7),)),
        dtensor=DTensorRun(2, "gloo", (("fc1.weight", "S(0)", (16, 32)),), True,
                           Proof("output", 0.0, 1e-7), Timing("", [0.2])),
        wide=WideRun(FFNSizes(64, 256, 16, 2, 4, 3, 1), Proof("output", 0.0, 1e-7),
                     Timing("compute", [0.1]), Timing("all-reduce", [0.1]), Timing("step", [0.2])),
        node_commands=("torchrun --nnodes=2 ...",))
    back = TPRun.from_dict(json.loads(json.dumps(full.to_dict())))
    assert back == full and back.memory.matches(full.memory)


def test_a_sweeps_result_round_trips_through_json_with_its_world_sizes_in_order():
    native = NativeRun("float32", (2, 3), 5.0, 9.0, Timing("native", [0.9, 1.1]),
                       Proof("tp_simulate", 1e-8, 1e-7))  # fmt: skip
    assert NativeRun.from_dict(json.loads(json.dumps(native.to_dict()))) == native
    sweep = SweepRun(native, {4: _tp_run(5.0, 1e-7), 1: _tp_run(5.0, 0.0)}, work_s=1.5)
    back = SweepRun.from_dict(json.loads(json.dumps(sweep.to_dict())))
    assert back == sweep and list(back.runs) == [4, 1] and back.ok
    assert not SweepRun(native, {2: _tp_run(5.0, 3e-7)}).ok  # one world size too far


def test_max_abs_diff_refuses_other_shapes():
    assert max_abs_diff(torch.zeros(3), torch.tensor([0.0, -2.0, 1.0])) == 2.0
    with pytest.raises(ValueError, match=r"shapes differ: \(3,\) vs \(4,\)"):
        max_abs_diff(torch.zeros(3), torch.zeros(4))


def test_a_training_step_runs_in_training_mode():
    """BatchNorm must use the batch's statistics (and update its running ones)."""
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).eval()
    before = model[1].running_mean.clone()
    training_step(model, torch.randn(8, 4), torch.randn(8, 4))
    assert model.training and not torch.equal(model[1].running_mean, before)


def test_allreduce_time_adds_a_fixed_cost_per_ring_step_to_the_bytes():
    from helpers.tensor_parallel.mappings import allreduce_seconds, forward_seconds, tp_cost

    # p = 4: 2(p-1) = 6 steps of 0.5 s, plus 2(p-1)/p = 1.5 x 1000 bytes at 100 bytes/s
    assert allreduce_seconds(1000.0, 4, bandwidth=100.0, latency=0.5) == 6 * 0.5 + 15.0
    assert allreduce_seconds(1000.0, 1, bandwidth=100.0, latency=0.5) == 0.0
    cost = tp_cost(1, 2, 4, 8, 2, 2)
    compute, comm = forward_seconds(cost, 16.0, flop_rate=64.0, bandwidth=8.0, latency=1.0)
    assert compute == cost.flops / 64.0 and comm == 2 * 1.0 + 16.0 / 8.0
