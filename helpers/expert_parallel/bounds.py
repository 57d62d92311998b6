"""How far the expert-parallel layer may differ from one device in float64: a rounding-error
bound derived from the inputs, element by element.

Both compute the same sums, in other orders and other batchings: the router and each
expert run on the same token rows, but in batches of other sizes (a matrix product may
block, and so order, a row's dot product differently); the ``k`` gate-weighted terms and
the shared expert's are added in another order; an expert's weight gradient sums its
tokens' terms in another order; the router's and shared expert's gradients are summed per
rank and then across ranks by an all-reduce. Each is bounded to first order in the unit
roundoff ``u = 2^-53`` (terms in ``u^2`` dropped), with ``gamma(n) = n u / (1 - n u)``,
the bound on a sum or dot product of ``n`` terms in any order and any grouping, an
all-reduce's included: ``|fl(sum x_i) - sum x_i| <= gamma(n) sum |x_i|`` (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 3.1). A ``+``, ``*``
or ``/`` rounds once (``u``); ``exp`` is taken to err by at most one ulp, ``2u`` (what
glibc's ``exp`` and SLEEF's ``u10`` one, which PyTorch's CPU kernels call, claim). Per
token, with hidden size ``H``, inner size ``F``, ``E`` experts:

- logits ``z = W_r x``: ``gamma(H) |W_r||x|``; the softmax ``p`` (max subtracted, ``exp``,
  an ``E``-term sum, then a division, or a reciprocal and a product): relative error
  ``kappa = 2 max|dz| + 2u max|z - max z| + gamma(E) + 6u``; a gate ``p_j / sum_k p``:
  ``2 kappa + gamma(k) + u``;
- an expert, SwiGLU ``y = W_d (silu(W_g x) * W_u x)``: its two projections ``gamma(H)``
  of their absolute products, ``silu(a) = a / (1 + exp(-a))`` ``4u`` relative (positive
  terms: no cancellation) plus ``|silu'(a)|`` times the error of ``a``; the product ``u``;
  the down projection ``gamma(F)``. Output ``sum_j g_j y_j (+ y_shared)``: each term's
  error plus ``gamma(terms)`` of their absolute sum (``k``, or ``k + 1`` with the shared
  expert);
- backward, each product's error from its factors' errors plus ``gamma(terms)`` of its
  absolute products: ``dg_j = dout . y_j`` (``H`` terms), the renormalisation's quotient
  rule, softmax's ``p (dp - p.dp)``, ``silu``'s backward ``dy s (1 + a (1 - s))`` (``s``
  the sigmoid, ``4u`` relative; the kernel's roundings ``|dy| s (7u |1 + a(1-s)| + 4u
  |a|)``) plus ``|silu''(a)|`` times the error of ``a``; an expert's weight gradient sums
  its ``n_e`` rows (``gamma(n_e)``), the router's and shared expert's all ``T`` tokens
  (``gamma(T)``, any split over ranks), the input's ``k + 1`` or ``k + 2`` paths (its
  experts, the router, the shared expert).

The auxiliary loss: each ``p``'s ``kappa``, and ``gamma(T + E + ep)`` for its sums, ``3u``
for its products; its gradient ``E f_e / T`` on every ``p``, ``4u``. ``dout`` is exact.
Two computations that each obey the bound differ by at most twice it; the exact values in
it are taken from the one-device result (first order).

What is not derived: the bound assumes both sides choose the same experts. A token whose
``k``-th and ``(k+1)``-th scores lie within their rounding could be routed differently (an
error of order 1, not a rounding): :func:`moe_bounds` refuses such inputs instead of
bounding them. Dropping follows from the choice, so it matches when the choice does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.expert_parallel.moe import MoEFFN, SwiGLU, capacity, keep_within_capacity

U = 2.0**-53  # float64's unit roundoff (half its epsilon)


def gamma(n: int | torch.Tensor) -> float | torch.Tensor:
    """``n u / (1 - n u)``: the relative bound of an ``n``-term sum or dot product."""
    return n * U / (1 - n * U)


def _swiglu(mlp: SwiGLU, x, dy, edy) -> tuple:
    """One SwiGLU on rows ``x`` with output gradient ``dy`` (error ``edy``): its output,
    input gradient and each weight gradient, with their bounds."""
    wg, wu, wd = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
    ax, awg, awu, awd = x.abs(), wg.abs(), wu.abs(), wd.abs()
    hidden, ffn, rows = x.shape[1], wg.shape[0], x.shape[0]
    a, b = x @ wg.T, x @ wu.T
    ea, eb = gamma(hidden) * (ax @ awg.T), gamma(hidden) * (ax @ awu.T)
    sig = torch.sigmoid(a)
    s, t = a * sig, 1 + a * (1 - sig)
    d1, d2 = sig * t, sig * (1 - sig) * (2 + a * (1 - 2 * sig))  # silu' and silu''
    es = d1.abs() * ea + 4 * U * s.abs()
    h = s * b
    eh = b.abs() * es + s.abs() * eb + U * h.abs()
    y = h @ wd.T
    ey = eh @ awd.T + gamma(ffn) * (h.abs() @ awd.T)
    dh = dy @ wd
    edh = edy @ awd + gamma(hidden) * (dy.abs() @ awd)
    db, ds = dh * s, dh * b
    edb = dh.abs() * es + s.abs() * edh + U * db.abs()
    eds = dh.abs() * eb + b.abs() * edh + U * ds.abs()
    da = ds * d1
    eda = (d1.abs() * eds + d2.abs() * ds.abs() * ea
           + ds.abs() * sig * (7 * U * t.abs() + 4 * U * a.abs()))
    dx = da @ wg + db @ wu
    edx = eda @ awg + edb @ awu + gamma(2 * ffn) * (da.abs() @ awg + db.abs() @ awu)
    grads = {"gate_proj.weight": eda.T @ ax + gamma(rows) * (da.abs().T @ ax),
             "up_proj.weight": edb.T @ ax + gamma(rows) * (db.abs().T @ ax),
             "down_proj.weight": edy.T @ h.abs() + dy.abs().T @ eh
             + gamma(rows) * (dy.abs().T @ h.abs())}
    return y, ey, dx, edx, grads


def _check_choice(score: torch.Tensor, err: torch.Tensor, k: int) -> None:
    """Refuse inputs where a token's ``k``-th and ``(k+1)``-th scores are within rounding."""
    if k == score.shape[1]:
        return
    values, which = torch.sort(score, dim=-1, descending=True)
    errs = err.gather(1, which)
    gap = values[:, k - 1] - values[:, k]
    close = gap <= 2 * (errs[:, k - 1] + errs[:, k])
    if close.any():
        t = int(torch.nonzero(close)[0])
        raise ValueError(f"token {t}: its scores {k} and {k + 1} differ by {gap[t].item():.2e}, "
                         "within their rounding: the two sides may choose different experts, "
                         "and this bound does not apply")


@torch.no_grad()
def moe_bounds(moe: MoEFFN, x: torch.Tensor, dout: torch.Tensor, ranks: int = 1,
               aux_weight: float = 1.0) -> dict[str, torch.Tensor]:
    """Twice the bound above, element by element: how far two float64 computations of
    ``moe`` on ``x`` may differ, for the backward of ``(out * dout).sum() + aux_weight x
    aux`` (``ranks``: over how many ranks the auxiliary loss is summed). Keys: ``"out"``,
    ``"aux"``, ``"input"`` (x's gradient) and every parameter's name (its gradient)."""
    shape = moe.shape
    hidden, k, n_exp = shape.hidden, shape.top_k, shape.experts
    tokens, grad = x.reshape(-1, hidden), dout.reshape(-1, hidden)
    n_tok = len(tokens)
    wr = moe.router.gate.weight
    z = tokens @ wr.T
    ez = gamma(hidden) * (tokens.abs() @ wr.abs().T)
    p = F.softmax(z, dim=-1)
    kappa = (2 * ez.amax(-1, keepdim=True) + 2 * U * (z - z.amax(-1, keepdim=True)).abs()
             .amax(-1, keepdim=True) + gamma(n_exp) + 6 * U)  # (T, 1): p's relative error
    score = p + moe.router.bias
    _check_choice(score, kappa * p + U * score.abs(), k)
    experts = torch.topk(score, k, dim=-1).indices
    kept = keep_within_capacity(experts, capacity(n_tok, shape), n_exp)
    chosen = p.gather(1, experts)
    total = chosen.sum(-1, keepdim=True)
    kappa_s = kappa + gamma(k)  # the sum's relative error
    g = chosen / total
    eg = (kappa + kappa_s + U) * g
    bounds: dict[str, torch.Tensor] = {}
    out_err, out_abs = torch.zeros_like(tokens), torch.zeros_like(tokens)
    dx_err, dx_abs = torch.zeros_like(tokens), torch.zeros_like(tokens)
    dg, edg = torch.zeros_like(g), torch.zeros_like(g)
    for e, expert in moe.experts.items():
        token, slot = torch.nonzero((experts == int(e)) & kept, as_tuple=True)
        ge, ege, go = g[token, slot, None], eg[token, slot, None], grad[token]
        dy = ge * go
        y, ey, dx, edx, grads = _swiglu(expert, tokens[token], dy, go.abs() * ege + U * dy.abs())
        term = ge * y
        out_err.index_add_(0, token, y.abs() * ege + ge * ey + U * term.abs())
        out_abs.index_add_(0, token, term.abs())
        dx_err.index_add_(0, token, edx)
        dx_abs.index_add_(0, token, dx.abs())
        dg[token, slot] = (go * y).sum(-1)
        edg[token, slot] = (go.abs() * ey).sum(-1) + gamma(hidden) * (go.abs() * y.abs()).sum(-1)
        bounds.update({f"experts.{e}.{name}": err for name, err in grads.items()})
    paths = k + 1  # the experts' terms and the router's (input gradient)
    if moe.shared is not None:
        y, ey, dx, edx, grads = _swiglu(moe.shared, tokens, grad, torch.zeros_like(grad))
        out_err, out_abs = out_err + ey, out_abs + y.abs()
        dx_err, dx_abs = dx_err + edx, dx_abs + dx.abs()
        bounds.update({f"shared.{name}": err for name, err in grads.items()})
        paths += 1
    bounds["out"] = out_err + gamma(paths - 1) * out_abs
    # backward through the renormalised gates, the softmax and the router
    quot, cross = dg / total, (dg.abs() * g).sum(-1, keepdim=True) / total
    rho = kappa + 2 * kappa_s + gamma(k) + 3 * U
    dsel = quot - (dg * g).sum(-1, keepdim=True) / total
    edsel = (edg / total + quot.abs() * (kappa_s + U) + (edg * g).sum(-1, keepdim=True) / total
             + rho * cross + U * dsel.abs())
    counts = torch.bincount(experts.reshape(-1), minlength=n_exp).to(p.dtype)
    push = aux_weight * n_exp * counts / experts.numel() / n_tok  # d aux / d p, every token
    dp = torch.zeros_like(p).scatter(1, experts, dsel) + push
    edp = torch.zeros_like(p).scatter(1, experts, edsel) + 4 * U * push + U * dp.abs()
    dot = (p * dp).sum(-1, keepdim=True)
    edot = (p * (kappa * dp.abs() + edp)).sum(-1, keepdim=True) \
        + gamma(n_exp) * (p * dp.abs()).sum(-1, keepdim=True)
    dz = p * (dp - dot)
    edz = p * (kappa * (dp - dot).abs() + edp + edot) + 2 * U * dz.abs()
    bounds["router.gate.weight"] = edz.T @ tokens.abs() + gamma(n_tok) * (dz.abs().T @ tokens.abs())
    dxr = dz @ wr
    dx_err = dx_err + edz @ wr.abs() + gamma(n_exp) * (dz.abs() @ wr.abs())
    bounds["input"] = dx_err + gamma(paths) * (dx_abs + dxr.abs())
    aux = n_exp * (counts / experts.numel() * p.mean(0)).sum()
    bounds["aux"] = n_exp * (counts / experts.numel() * (kappa * p).mean(0)).sum() \
        + (gamma(n_tok + n_exp + ranks) + 3 * U) * aux
    for name, param in moe.named_parameters():
        bounds.setdefault(name, torch.zeros_like(param))  # an expert no token reached
    bounds["out"], bounds["input"] = bounds["out"].view_as(x), bounds["input"].view_as(x)
    return {name: 2 * value for name, value in bounds.items()}


def bound_ratios(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
                 bounds: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per quantity of ``got``, the largest ``|got - want| / bound`` over its elements (at
    most 1: within the bound; a difference where the bound is 0 is infinitely far)."""
    ratios = {}
    for name in got:
        bound, diff = bounds[name], (got[name] - want[name]).abs()
        ratio = torch.where(bound > 0, diff / bound, torch.where(diff > 0, torch.inf, 0.0))
        ratios[name] = ratio.max().item()
    return ratios
