"""Tests of helpers.core.checks: one training step of two models compared."""

import copy
from collections import OrderedDict

import pytest
import torch
from torch import nn

from helpers.core.checks import (
    StepComparison,
    StepResult,
    compare_steps,
    compare_training_step,
    max_abs_diff,
    snapshot,
    training_step,
)
from helpers.model_parallel.stages import StagedModel

CPU = torch.device("cpu")


def _layers() -> list[tuple[str, nn.Module]]:
    torch.manual_seed(0)
    return [("l0", nn.Linear(4, 6)), ("act", nn.Tanh()), ("l1", nn.Linear(6, 3))]


def test_snapshot_copies_gradients_and_zero_fills_missing_ones():
    class WithUnused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(2, 2)
            self.unused = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return self.used(x)

    model = WithUnused()
    model(torch.ones(1, 2)).sum().backward()
    grads, weights = snapshot(model)
    assert [n for n, _ in grads] == ["unused", "used.weight", "used.bias"]
    assert torch.equal(grads[0][1], torch.zeros(3)) and grads[0][1].device == CPU
    assert torch.equal(grads[2][1], torch.ones(2))  # d(sum)/d(bias) = 1
    model.used.bias.grad.add_(5.0)
    assert torch.equal(grads[2][1], torch.ones(2))  # a copy, not the live gradient
    assert torch.equal(weights[0][1], torch.ones(3))


def test_max_abs_diff_of_one_element_and_of_empty_tensors():
    assert max_abs_diff(torch.tensor([1.0]), torch.tensor([3.5])) == 2.5
    assert max_abs_diff(torch.zeros(0, 3), torch.zeros(0, 3)) == 0.0


def test_training_step_takes_one_sgd_step_with_lr_001_by_default():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    with torch.no_grad():
        expected_out = model(x)
    result = training_step(model, x, y)
    assert torch.equal(result.output, expected_out)
    assert result.loss == pytest.approx(nn.functional.mse_loss(expected_out, y).item())
    assert [n for n, _ in result.grads] == ["weight", "bias"] == [n for n, _ in result.weights]
    for w0, (_, g), (_, w1) in zip(before, result.grads, result.weights, strict=True):
        assert g.abs().max() > 0.05
        assert torch.allclose(w1, w0 - 0.01 * g, rtol=0, atol=1e-6)
    l1 = training_step(nn.Linear(3, 2), x, y, loss_fn=lambda o, t: (o - t).abs().sum(), lr=0.0)
    assert l1.loss == pytest.approx((l1.output - y).abs().sum().item(), rel=1e-6)


def test_a_split_model_matches_its_unsplit_self_and_a_changed_one_does_not():
    layers = _layers()
    reference = nn.Sequential(OrderedDict(copy.deepcopy(layers)))
    x, y = torch.randn(5, 4), torch.randn(5, 3)
    same = compare_training_step(
        reference, StagedModel(copy.deepcopy(layers), [2], [CPU, CPU]), x, y, lr=0.5
    )
    assert same == StepComparison(0.0, 0.0, 0.0, 0.0, "stages.0.l0.weight", "stages.0.l0.weight")
    reference = nn.Sequential(OrderedDict(copy.deepcopy(layers)))
    changed = StagedModel(copy.deepcopy(layers), [2], [CPU, CPU])
    with torch.no_grad():
        changed.stages[1].l1.bias.add_(0.5)
    diff = compare_training_step(reference, changed, x, y, lr=0.5)
    assert diff.output == pytest.approx(0.5, abs=1e-6)  # the bias adds 0.5 to every output
    assert diff.loss > 0.05 and diff.grads > 0.1 and diff.weights > 0.1
    assert diff.worst_grad == "stages.1.l1.bias" and diff.worst_weight == "stages.1.l1.bias"


def test_compare_steps_refuses_models_that_do_not_match():
    def step(*shapes):
        named = [(f"p{i}", torch.zeros(s)) for i, s in enumerate(shapes)]
        return StepResult(torch.zeros(1), 0.0, named, named)

    with pytest.raises(ValueError, match=r"the models have 2 and 1 parameters; they must match"):
        compare_steps(step(2, 3), step(2))
    with pytest.raises(ValueError, match=r"parameter p1 \(3,\) != p1 \(4,\)"):
        compare_steps(step(2, 3), step(2, 4))


def test_report_marks_each_difference_against_the_tolerance():
    c = StepComparison(0.0, 2e-6, 5e-7, 0.0, "fc.weight", "fc.bias")
    assert c.rows() == [
        ("outputs", 0.0),
        ("loss", 2e-6),
        ("gradients", 5e-7),
        ("updated weights", 0.0),
    ]
    assert c.report(1e-6).splitlines() == [
        "outputs          max |diff| ≈ 0.0e+00  OK (tolerance 1e-06)",
        "loss             max |diff| ≈ 2.0e-06  FAILED (tolerance 1e-06)",
        "gradients        max |diff| ≈ 5.0e-07  OK (tolerance 1e-06)",
        "updated weights  max |diff| ≈ 0.0e+00  OK (tolerance 1e-06)",
    ]
    with pytest.raises(AssertionError, match=r"^differs beyond tolerance 1e-06: loss\noutputs "):
        c.check(1e-6)
    assert c.check(2e-6) == c.report(2e-6)  # exactly at the tolerance passes
    assert c.report(2e-6).splitlines()[1].endswith(" OK (tolerance 2e-06)")
    both = StepComparison(1.0, 0.0, 1.0, 0.0, "g", "w")
    with pytest.raises(AssertionError, match=r"tolerance 0\.5: outputs, gradients \(worst: g\)\n"):
        both.check(0.5)


def test_a_proof_decides_its_verdict_once_and_round_trips():
    from helpers.core.checks import Proof

    at = Proof("grads", 1e-6, 1e-6)  # at the tolerance: still OK
    over = Proof("weights", 2e-6, 1e-6)
    assert at.ok and not over.ok
    assert at.line() == "grads        max |diff| ≈ 1.0e-06  tolerance ≈ 1.0e-06  OK"
    assert over.line(width=8) == "weights  max |diff| ≈ 2.0e-06  tolerance ≈ 1.0e-06  FAILED"
    assert over.as_dict() == {"what": "weights", "max_diff": 2e-6, "tolerance": 1e-6}
    assert Proof.from_dict(over.as_dict()) == over


def test_a_verdict_reads_as_one_line_and_names_its_worst_proof():
    from helpers.core.checks import Proof, Verdict

    v = Verdict("the split step is the one-device step",
                [Proof("loss", 1e-7, 1e-5), Proof("grads", 5e-6, 1e-5), Proof("w", 2e-5, 1e-3)])
    assert v.ok and v.worst.what == "grads"
    assert v.line() == ("✓ the split step is the one-device step (3 checks; worst 5.0e-06, "
                        "allowed 1.0e-05)")
    assert v.check() == v.line() and str(v) == v.line()
    assert len(v.table().splitlines()) == 3


def test_a_failed_verdict_says_which_proof_and_raises_with_the_table():
    import pytest

    from helpers.core.checks import Proof, Verdict

    v = Verdict("claim", [Proof("ok one", 0.0, 1e-6), Proof("bad one", 3e-3, 1e-6)])
    assert not v.ok and v.failed == (v.proofs[1],)
    assert v.line().startswith("✗ claim (1 of 2 checks failed; bad one: 3.0e-03 > 1.0e-06")
    with pytest.raises(AssertionError, match="bad one"):
        v.check()


def test_an_exact_verdict_and_an_empty_one():
    import pytest

    from helpers.core.checks import Proof, Verdict

    assert Verdict("bytes", [Proof("a", 0, 0)]).line() == "✓ bytes (1 check, all exact)"
    assert not Verdict("bytes", [Proof("a", 1, 0)]).ok
    with pytest.raises(ValueError, match="no proofs"):
        Verdict("nothing", [])
