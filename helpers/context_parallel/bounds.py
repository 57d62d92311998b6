"""How far two float64 computations of one attention layer may differ: a rounding-error
bound derived from the inputs, element by element.

Every implementation here (one device's ``scaled_dot_product_attention``, the blockwise
merge, the ring, the all-gather, Ulysses) computes the same sums in other orders and other
blockings. Each is bounded to first order in the unit roundoff ``u = 2^-53`` (terms in
``u^2`` dropped), with ``gamma(n) = n u / (1 - n u)``, the bound on a sum or dot product of
``n`` terms in any order: ``|fl(sum x_i) - sum x_i| <= gamma(n) sum |x_i|`` (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 3.1). An addition,
product or division rounds by at most ``u`` of its result; ``exp`` and ``log`` by at most
one ulp, ``2u`` (PyTorch's vectorised float64 ``exp`` and ``log`` are SLEEF's 1-ulp
functions). For query row ``i``, key ``j``, scale ``c = 1/sqrt(d)`` and the ``n_i`` keys
the row may see:

- a score ``s_ij = c q_i.k_j``, q and k possibly scaled by ``sqrt(c)`` first (PyTorch's
  math kernel) and ``c`` itself rounded: ``sigma_ij = (gamma(d) + 6u) c |q_i|.|k_j|
  + u |s_ij|``;
- a softmax weight ``p_ij``, normalised once, or per block and re-weighted by
  ``exp(lse_b - lse)`` at each merge, or recomputed from the saved ``lse`` in backward:
  relative error ``kappa_i = 2 max_j sigma_ij + gamma(n_i) + u max_j |s_ij - lse_i|
  + 2u log(n_i) + (2 n_i + 4) 2u (1 + |lse_i|)``. The last term is a budget, not a
  count: each merge of two blocks rounds a log, two exps, a product and a sum, some
  ``u (|lse| + 5)`` in all, and no implementation merges a row more than once per key it
  sees, whatever its blocking (the ring's ``cp`` or ``2 cp`` pieces, or the CPU kernel's
  own key blocks);
- the output ``o_i = sum_j p_ij v_j``: ``(kappa_i + gamma(n_i)) sum_j p_ij |v_j|``;
- backward, with ``dP_ij = dO_i.v_j`` (``gamma(d) |dO_i|.|v_j|``) and
  ``D_i = dO_i.o_i = sum_j p_ij dP_ij`` (the larger of the two forms' bounds), ``dS_ij =
  p_ij (dP_ij - D_i)``, a subtraction then a product, errs by ``p_ij ((kappa_i + 2u)
  |dP_ij - D_i| + |d dP_ij| + |d D_i|)``;
- ``dq_i = c sum_j dS_ij k_j`` and ``dk_j = c sum_i dS_ij q_i`` (``i`` over every query
  head sharing the key/value head) err by their terms' errors plus ``gamma(terms) + u``
  (the scaling by ``c``) of their absolute sum; ``dv_j = sum_i p_ij dO_i`` by its
  weights' errors plus ``gamma(terms)`` of its absolute sum.

Two computations that each obey the bound differ by at most twice it. The exact values in
it are recomputed here in float64 (first order). A lost or misplaced block moves a value
by about its own size, of order 1: some 10^12 bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

U = 2.0**-53  # float64's unit roundoff (half its epsilon)
ULP = 2 * U  # what exp and log may be off by, relative
QUANTITIES = ("out", "dq", "dk", "dv")


def gamma(n: int | torch.Tensor) -> float | torch.Tensor:
    """``n u / (1 - n u)``: the relative bound of an ``n``-term sum."""
    return n * U / (1 - n * U)


def attention_bounds(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
                     causal: bool) -> dict[str, float]:
    """Twice the bound above for each of the output and the gradients of q, k and v (the
    largest over their elements): how far two computations may differ, however each
    blocks its keys. Shapes (batch, heads, seq, head_dim), k and v with ``heads / group``
    heads."""
    batch, heads, seq, _ = q.shape
    group = heads // k.shape[1]
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device)
    if causal:
        mask = torch.tril(mask)
    terms = group * seq  # a key's or value's gradient sums over every query of its heads
    worst = dict.fromkeys(QUANTITIES, 0.0)
    for b in range(batch):
        for kv in range(k.shape[1]):
            dk_err = dk_abs = dv_err = dv_abs = 0.0
            for h in range(kv * group, (kv + 1) * group):
                row = _head(q[b, h], k[b, kv], v[b, kv], dout[b, h], mask)
                worst["out"] = max(worst["out"], row.out_err.max().item())
                worst["dq"] = max(worst["dq"], row.dq_err.max().item())
                dk_err = dk_err + row.c * (row.ds_err.T @ row.aq)  # the terms' own errors
                dk_abs = dk_abs + row.c * (row.ds.abs().T @ row.aq)
                dv_err = dv_err + (row.p * row.kappa).T @ row.ag  # the weights' errors
                dv_abs = dv_abs + row.p.T @ row.ag
            # then the sum over the terms (any order), and dk's scaling by c
            worst["dk"] = max(worst["dk"], (dk_err + (gamma(terms) + U) * dk_abs).max().item())
            worst["dv"] = max(worst["dv"], (dv_err + gamma(terms) * dv_abs).max().item())
    return {name: 2 * value for name, value in worst.items()}


@dataclass
class _Head:
    """One query head's pieces of the bound (rows: its queries; columns: the keys)."""

    c: float
    p: torch.Tensor  # softmax weights, zero where masked
    kappa: torch.Tensor  # (seq, 1): each row's relative error of its weights
    ds: torch.Tensor
    ds_err: torch.Tensor
    out_err: torch.Tensor
    dq_err: torch.Tensor
    aq: torch.Tensor  # |q|
    ag: torch.Tensor  # |dO|


def _head(qi, kj, vj, go, mask) -> _Head:
    d = qi.shape[-1]
    c = 1 / math.sqrt(d)
    seen = mask.sum(1, keepdim=True).to(qi.dtype)  # n_i
    aq, ak, av, ag = qi.abs(), kj.abs(), vj.abs(), go.abs()
    s = (c * qi @ kj.T).masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.exp(s - lse)
    sigma = ((gamma(d) + 6 * U) * c * (aq @ ak.T) + U * s.abs()).masked_fill(~mask, 0)
    gap = (s - lse).abs().masked_fill(~mask, 0)
    kappa = (2 * sigma.amax(-1, keepdim=True) + gamma(seen) + U * gap.amax(-1, keepdim=True)
             + ULP * torch.log(seen) + (2 * seen + 4) * ULP * (1 + lse.abs()))
    o = p @ vj
    out_err = (kappa + gamma(seen)) * (p @ av)
    dp = go @ vj.T
    dp_err = gamma(d) * (ag @ av.T)
    big_d = (go * o).sum(-1, keepdim=True)
    d_err = torch.maximum(gamma(d) * (ag * o.abs()).sum(-1, keepdim=True)
                          + (ag * out_err).sum(-1, keepdim=True),
                          (kappa + gamma(seen)) * (p * dp.abs()).sum(-1, keepdim=True)
                          + (p * dp_err).sum(-1, keepdim=True))
    ds = p * (dp - big_d)
    ds_err = p * ((kappa + 2 * U) * (dp - big_d).abs() + dp_err + d_err)
    dq_err = c * (ds_err @ ak + (gamma(seen) + U) * (ds.abs() @ ak))
    return _Head(c, p, kappa, ds, ds_err, out_err, dq_err, aq, ag)


def output_bound(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> float:
    """The output's bound alone (no backward)."""
    return attention_bounds(q, k, v, torch.zeros_like(q), causal)["out"]
