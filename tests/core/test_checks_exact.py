"""The proof machinery and the split model to the letter: a comparison's proofs and its
refusal naming where, a verdict's table, two models without parameters, a tensor-parallel
paper check, a split model's refusal, a weight's shard file, a DTensor's local part, a shard
cut in its block's dtype. (The tests that kill what the looser tests let through:
`make mutants PART=core`, `PART=model_parallel`, `PART=tensor_parallel`.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.core.checks import Proof, StepComparison, Verdict, _max_diff
from helpers.model_parallel.stages import StagedModel
from helpers.tensor_parallel.block import Split, cut, shard_vs_full
from helpers.tensor_parallel.ffn import FeedForward
from helpers.tensor_parallel.proofs import PAPER_TOLERANCE, paper_check

STEP = StepComparison(output=1e-9, loss=0.0, grads=2e-6, weights=3e-6,
                      worst_grad="fc1.weight", worst_weight="fc2.weight")


def test_a_comparison_makes_one_named_proof_per_row():
    assert STEP.proofs(1e-6, prefix="tp=2 ") == [
        Proof("tp=2 outputs", 1e-9, 1e-6), Proof("tp=2 loss", 0.0, 1e-6),
        Proof("tp=2 gradients", 2e-6, 1e-6), Proof("tp=2 updated weights", 3e-6, 1e-6)]
    assert [p.what for p in STEP.proofs(1e-6)] == ["outputs", "loss", "gradients",
                                                   "updated weights"]


def test_a_comparison_beyond_its_tolerance_names_where_it_differs():
    with pytest.raises(AssertionError) as info:
        STEP.check(1e-6)
    assert str(info.value).splitlines()[0] == (
        "differs beyond tolerance 1e-06: gradients (worst: fc1.weight), "
        "updated weights (worst: fc2.weight)")


def test_a_verdicts_table_pads_to_the_longest_name_plus_one():
    verdict = Verdict("claim", [Proof("ab", 0.0, 1.0), Proof("abcd", 2.0, 1.0)])
    assert verdict.table() == (
        "ab    max |diff| ≈ 0.0e+00  tolerance ≈ 1.0e+00  OK\n"
        "abcd  max |diff| ≈ 2.0e+00  tolerance ≈ 1.0e+00  FAILED")


def test_two_models_without_parameters_differ_by_nothing():
    assert _max_diff([], []) == (0.0, "")


def test_a_paper_check_is_the_largest_difference_against_the_paper_tolerance():
    full, split = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.5, 2.0])
    assert paper_check("y = xA", full, split) == Proof("y = xA", 1.0, PAPER_TOLERANCE)


def test_a_split_model_refuses_a_device_list_of_another_length_word_for_word():
    layers = [("a", nn.Linear(2, 2)), ("b", nn.Linear(2, 2)), ("c", nn.Linear(2, 2))]
    with pytest.raises(ValueError) as info:
        StagedModel(layers, [1], ["cpu"])
    assert str(info.value) == "2 stages but 1 devices given; valid: one device per stage"


def test_a_weights_shard_file_drops_only_the_last_part_of_its_name():
    assert Split("blocks.0.mlp.fc1.weight", 0).file(3) == "blocks.0.mlp.fc1_3.bin"
    assert Split("fc2.weight", 1).file(0) == "fc2_0.bin"


class _Local:
    """Stands for a DTensor: only ``to_local`` gives this rank's part."""

    def __init__(self, part: torch.Tensor) -> None:
        self._part = part

    def to_local(self) -> torch.Tensor:
        return self._part


class _DTensorShard:
    """A shard whose parameters are DTensor-like."""

    def __init__(self, shard: nn.Module) -> None:
        self._shard = shard

    def get_parameter(self, name: str) -> _Local:
        return _Local(self._shard.get_parameter(name))


def test_a_shard_is_compared_by_its_local_part_and_by_its_gradients():
    torch.manual_seed(0)
    full = FeedForward(4, 8)
    shard = cut(full, 2, 1)
    assert shard_vs_full(_DTensorShard(shard), full, 2, 1) == 0.0
    x = torch.randn(3, 4)
    full(x).sum().backward()
    shard(x).sum().backward()
    # the same weights, and the gradients of the split weights equal the full block's slices
    assert shard_vs_full(shard, full, 2, 1, grads=True) <= 1e-6
    with torch.no_grad():
        full.fc1.weight.grad[4:] += 0.5  # rank 1's rows of fc1's gradient
    assert shard_vs_full(shard, full, 2, 1, grads=True) == pytest.approx(0.5, abs=1e-6)
    assert shard_vs_full(shard, full, 2, 1) == 0.0  # the weights still agree


def test_a_shard_is_cut_in_its_blocks_dtype():
    full = FeedForward(4, 8).double()
    shard = cut(full, 2, 0)
    assert {p.dtype for p in shard.parameters()} == {torch.float64}
    assert shard_vs_full(shard, full, 2, 0) == 0.0
