"""The derived rounding bound of an MoE layer: it holds for one device computing the layer
in other batches, it is far below any real error, and it refuses inputs whose expert
choice could flip within rounding."""

from __future__ import annotations

import pytest
import torch

from helpers.expert_parallel.bounds import U, bound_ratios, gamma, moe_bounds
from helpers.expert_parallel.moe import MoEFFN, MoEShape

SHAPE = MoEShape(hidden=32, ffn=48, experts=4, top_k=2, shared=True)


def _run(moe: MoEFFN, x: torch.Tensor, dout: torch.Tensor, batches: int):
    """Output and gradients of ``(out * dout).sum()`` with the tokens in ``batches`` calls."""
    moe.zero_grad(set_to_none=True)
    xx = x.clone().requires_grad_()
    out = torch.cat([moe(part)[0] for part in xx.chunk(batches)])
    (out * dout).sum().backward()
    grads = {n: torch.zeros_like(p) if p.grad is None else p.grad
             for n, p in moe.named_parameters()}
    return {"out": out.detach(), "input": xx.grad, **grads}


def test_gamma_is_the_n_term_bound():
    assert gamma(1) == pytest.approx(U)
    assert gamma(100) > 100 * U


@pytest.mark.parametrize("scale", [0.1, 1.0, 4.0])
def test_one_device_in_other_batches_stays_within_the_bound(scale):
    """Without capacity each token's output is its own; in 1 call or in 4, the sums are
    blocked differently (the loss here has no auxiliary term, whose counts would differ)."""
    torch.manual_seed(0)
    moe = MoEFFN(SHAPE, torch.float64)
    x = scale * torch.randn(64, SHAPE.hidden, dtype=torch.float64)
    dout = torch.randn(64, SHAPE.hidden, dtype=torch.float64)
    whole, parts = _run(moe, x, dout, 1), _run(moe, x, dout, 4)
    bounds = moe_bounds(moe, x, dout, aux_weight=0.0)
    bounds.pop("aux")
    ratios = bound_ratios(parts, whole, bounds)
    assert max(ratios.values()) <= 1, ratios
    for name, value in whole.items():  # a bound, not a blanket: far below the values
        assert bounds[name].max() < 1e-9 * value.abs().max(), name


def test_a_lost_expert_fails_the_bound_by_far():
    torch.manual_seed(0)
    moe = MoEFFN(SHAPE, torch.float64)
    x, dout = torch.randn(2, 64, SHAPE.hidden, dtype=torch.float64)
    want = _run(moe, x, dout, 1)
    with torch.no_grad():
        moe.experts["1"].down_proj.weight.zero_()  # expert 1's tokens get nothing from it
    got = _run(moe, x, dout, 1)
    ratios = bound_ratios(got, want, moe_bounds(moe, x, dout, aux_weight=0.0))
    assert ratios["out"] > 1e9 and ratios["input"] > 1e9


def test_a_choice_that_rounding_could_flip_is_refused():
    moe = MoEFFN(SHAPE, torch.float64)
    with torch.no_grad():
        moe.router.gate.weight.zero_()  # every expert scores the same: a tie
    x = torch.randn(8, SHAPE.hidden, dtype=torch.float64)
    with pytest.raises(ValueError, match="token 0: its scores 2 and 3 differ by 0.00e"):
        moe_bounds(moe, x, torch.ones_like(x))
