"""The derived rounding bound of an attention layer: it holds where it must (every variant's
float64 result against one device's, on inputs of several scales), and a wrong result
fails it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.context_parallel.bounds import QUANTITIES, U, attention_bounds, gamma, output_bound
from helpers.context_parallel.merge import blockwise_attention


def _grads(fn, q, k, v, dout):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), dout)]


def _inputs(scale: float, seed: int = 0, kv: int = 2):
    g = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(2, h, 32, 8, generator=g, dtype=torch.float64)
            for h in (4, kv, kv, 4)]


def test_gamma_is_the_n_term_bound():
    assert gamma(1) == pytest.approx(U)
    assert gamma(100) > 100 * U


@pytest.mark.parametrize("scale", [0.1, 1.0, 3.0])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("blocks", [1, 4, 32])
def test_blockwise_attention_stays_within_the_bound_of_one_device(scale, causal, blocks):
    q, k, v, dout = _inputs(scale)
    want = _grads(lambda a, b, c: F.scaled_dot_product_attention(
        a, b, c, is_causal=causal, enable_gqa=True), q, k, v, dout)
    got = _grads(lambda a, b, c: blockwise_attention(
        a, b.repeat_interleave(2, 1), c.repeat_interleave(2, 1), blocks, causal=causal),
        q, k, v, dout)
    bound = attention_bounds(q, k, v, dout, causal)
    for name, g, w in zip(QUANTITIES, got, want, strict=True):
        diff = (g - w).abs().max().item()
        assert diff <= bound[name], (name, diff, bound[name])
        assert bound[name] < 1e-9  # a bound, not a blanket
    assert output_bound(q, k, v, causal) == bound["out"]


def test_a_lost_block_fails_the_bound_by_far():
    q, k, v, dout = _inputs(1.0, kv=4)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    lost = F.scaled_dot_product_attention(q, k[..., :16, :], v[..., :16, :])  # half the keys
    diff = (lost[..., 16:, :] - want[..., 16:, :]).abs().max().item()
    assert diff > 1e9 * output_bound(q, k, v, True)


def test_the_bound_grows_with_the_keys_a_row_sees():
    q, k, v, dout = _inputs(1.0)
    causal, full = (attention_bounds(q, k, v, dout, c) for c in (True, False))
    assert full["out"] > causal["out"] and full["dq"] > causal["dq"]


def test_a_single_key_is_its_value_up_to_the_bound():
    """One key: the output is the value exactly in real numbers, and within the bound."""
    q, k, v, dout = (t[..., :1, :] for t in _inputs(1.0, kv=4))
    want = v
    got = F.scaled_dot_product_attention(q, k, v)
    assert (got - want).abs().max().item() <= output_bound(q, k, v, False)
    assert output_bound(q, k, v, False) < 1e-12
