"""Lesson 11's rounding-error bound of an MoE layer to the letter: every error term of a
SwiGLU expert (its projections, silu and its first and second derivatives, the product, the
backward through each factor and each weight gradient) written out element by element from
the derivation, with silu' and silu'' taken by autograd, on tiny uneven widths; how
:func:`moe_bounds` feeds an expert its gate's error and the shared expert none; and the
refusal of a near tie, with the gap exactly at, just above and just below the threshold."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers.expert_parallel.bounds import U, _check_choice, _swiglu, gamma, moe_bounds
from helpers.expert_parallel.moe import MoEFFN, MoEShape, SwiGLU

F64 = torch.float64

# rows R = 2, hidden H = 3, inner F = 4: every width differs, every sign occurs
WG = [[0.5, -1.25, 0.75], [-0.5, 0.25, 1.5], [1.0, 0.5, -0.25], [-1.5, -0.75, 0.5]]
WU = [[0.25, 1.0, -0.5], [1.25, -0.25, 0.75], [-1.0, 0.5, 0.5], [0.5, 1.5, -1.25]]
WD = [[0.5, -1.0, 0.25, 1.5], [-0.75, 0.5, 1.25, -0.25], [1.0, 0.75, -0.5, 0.25]]
X = [[0.75, -0.5, 1.25], [-1.0, 1.5, 0.25]]
DY = [[1.0, -0.5, 0.75], [-0.25, 1.25, -1.5]]
EDY = [[3e-16, 1e-16, 2e-16], [4e-16, 5e-16, 1e-16]]


def _mlp(wg=WG, wu=WU, wd=WD) -> SwiGLU:
    mlp = SwiGLU(len(wg[0]), len(wg), F64)
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(torch.tensor(wg, dtype=F64))
        mlp.up_proj.weight.copy_(torch.tensor(wu, dtype=F64))
        mlp.down_proj.weight.copy_(torch.tensor(wd, dtype=F64))
    return mlp


def _silu_derivatives(a: float) -> tuple[float, float, float]:
    """sigma(a), silu'(a) and silu''(a), the derivatives by autograd."""
    t = torch.tensor(a, dtype=F64, requires_grad=True)
    (d1,) = torch.autograd.grad(F.silu(t), t, create_graph=True)
    (d2,) = torch.autograd.grad(d1, t)
    return 1 / (1 + math.exp(-a)), d1.item(), d2.item()


def _by_hand(wg, wu, wd, x, dy, edy) -> dict[str, list[list[float]]]:
    """The bound's terms, one element at a time, as the derivation states them: a dot
    product of n terms errs by its factors' errors times the other factors plus gamma(n) of
    its absolute products; silu 4u relative plus |silu'| times a's error; a product u; the
    silu backward's roundings |ds| (7u |silu'| + 4u sigma |a|) plus |silu''| |ds| a's error."""
    rows, hidden, ffn = len(x), len(x[0]), len(wg)
    out: dict[str, list[list[float]]] = {k: [] for k in ("y", "ey", "dx", "edx")}
    pieces = []
    for r in range(rows):
        p: dict[str, list[float]] = {k: [] for k in (
            "a", "ea", "b", "eb", "s", "es", "h", "eh", "sig", "d1", "d2")}
        for j in range(ffn):
            a = sum(x[r][i] * wg[j][i] for i in range(hidden))
            b = sum(x[r][i] * wu[j][i] for i in range(hidden))
            ea = gamma(hidden) * sum(abs(x[r][i] * wg[j][i]) for i in range(hidden))
            eb = gamma(hidden) * sum(abs(x[r][i] * wu[j][i]) for i in range(hidden))
            sig, d1, d2 = _silu_derivatives(a)
            s = a * sig
            es = abs(d1) * ea + 4 * U * abs(s)
            h = s * b
            eh = abs(b) * es + abs(s) * eb + U * abs(h)
            for key, v in zip(p, (a, ea, b, eb, s, es, h, eh, sig, d1, d2), strict=True):
                p[key].append(v)
        y = [sum(p["h"][j] * wd[m][j] for j in range(ffn)) for m in range(hidden)]
        ey = [sum(p["eh"][j] * abs(wd[m][j]) for j in range(ffn))
              + gamma(ffn) * sum(abs(p["h"][j] * wd[m][j]) for j in range(ffn))
              for m in range(hidden)]
        dh = [sum(dy[r][m] * wd[m][j] for m in range(hidden)) for j in range(ffn)]
        edh = [sum(edy[r][m] * abs(wd[m][j]) for m in range(hidden))
               + gamma(hidden) * sum(abs(dy[r][m] * wd[m][j]) for m in range(hidden))
               for j in range(ffn)]
        q: dict[str, list[float]] = {"da": [], "eda": [], "db": [], "edb": []}
        for j in range(ffn):
            a, ea, b, eb = p["a"][j], p["ea"][j], p["b"][j], p["eb"][j]
            s, es, sig, d1, d2 = p["s"][j], p["es"][j], p["sig"][j], p["d1"][j], p["d2"][j]
            db, ds = dh[j] * s, dh[j] * b
            edb = abs(dh[j]) * es + abs(s) * edh[j] + U * abs(db)
            eds = abs(dh[j]) * eb + abs(b) * edh[j] + U * abs(ds)
            da = ds * d1
            eda = (abs(d1) * eds + abs(d2) * abs(ds) * ea
                   + abs(ds) * (7 * U * abs(d1) + 4 * U * sig * abs(a)))
            for key, v in zip(q, (da, eda, db, edb), strict=True):
                q[key].append(v)
        dx = [sum(q["da"][j] * wg[j][i] + q["db"][j] * wu[j][i] for j in range(ffn))
              for i in range(hidden)]
        edx = [sum(q["eda"][j] * abs(wg[j][i]) + q["edb"][j] * abs(wu[j][i])
                   for j in range(ffn))
               + gamma(2 * ffn) * sum(abs(q["da"][j] * wg[j][i]) + abs(q["db"][j] * wu[j][i])
                                      for j in range(ffn))
               for i in range(hidden)]
        for key, v in zip(out, (y, ey, dx, edx), strict=True):
            out[key].append(v)
        pieces.append({**p, **q})
    g_r = gamma(rows)
    out["gate_proj.weight"] = [
        [sum(pieces[r]["eda"][j] * abs(x[r][i]) + g_r * abs(pieces[r]["da"][j] * x[r][i])
             for r in range(rows)) for i in range(hidden)] for j in range(ffn)]
    out["up_proj.weight"] = [
        [sum(pieces[r]["edb"][j] * abs(x[r][i]) + g_r * abs(pieces[r]["db"][j] * x[r][i])
             for r in range(rows)) for i in range(hidden)] for j in range(ffn)]
    out["down_proj.weight"] = [
        [sum(edy[r][m] * abs(pieces[r]["h"][j]) + abs(dy[r][m]) * pieces[r]["eh"][j]
             + g_r * abs(dy[r][m] * pieces[r]["h"][j]) for r in range(rows))
         for j in range(ffn)] for m in range(hidden)]
    return out


def _close(got: torch.Tensor, want, scale: float = 1.0) -> None:
    torch.testing.assert_close(got, scale * torch.tensor(want, dtype=F64), rtol=1e-12, atol=0)


def _autograd(mlp: SwiGLU, x: torch.Tensor, dy: torch.Tensor) -> tuple:
    x = x.clone().requires_grad_(True)
    y = mlp(x)
    (dx,) = torch.autograd.grad((y * dy).sum(), x)
    return y.detach(), dx


def test_a_swiglu_experts_every_bound_element_by_element():
    """Two rows, H = 3, F = 4, an output gradient with its own error: the output and input
    gradient are autograd's, and the output's, the input gradient's and each weight
    gradient's bounds are the hand-written terms, element by element."""
    mlp = _mlp()
    x, dy, edy = (torch.tensor(v, dtype=F64) for v in (X, DY, EDY))
    y, ey, dx, edx, grads = _swiglu(mlp, x, dy, edy)
    want_y, want_dx = _autograd(mlp, x, dy)
    torch.testing.assert_close(y, want_y, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(dx, want_dx, rtol=1e-13, atol=1e-15)
    hand = _by_hand(WG, WU, WD, X, DY, EDY)
    _close(ey, hand["ey"])
    _close(edx, hand["edx"])
    assert set(grads) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    for name, value in grads.items():
        _close(value, hand[name])


def test_a_swiglu_of_one_row_with_an_exact_output_gradient():
    """One row (gamma(1) for each weight gradient), no error on the output gradient: the
    shared expert's case; a negative pre-activation where silu'' changes sign."""
    wg = [[-2.5, 1.0], [0.75, 0.5], [1.5, -0.25]]
    wu = [[1.0, 0.5], [-0.5, 2.0], [0.25, 1.25]]
    wd = [[0.5, -1.5, 1.0], [2.0, 0.25, -0.75]]
    x, dy, zero = [[1.0, -0.5]], [[0.5, -2.0]], [[0.0, 0.0]]
    mlp = _mlp(wg, wu, wd)
    y, ey, dx, edx, grads = _swiglu(mlp, *(torch.tensor(v, dtype=F64) for v in (x, dy, zero)))
    hand = _by_hand(wg, wu, wd, x, dy, zero)
    _close(ey, hand["ey"])
    _close(edx, hand["edx"])
    for name, value in grads.items():
        _close(value, hand[name])


def _one_expert_layer(shared: bool) -> tuple[MoEFFN, torch.Tensor, torch.Tensor]:
    """E = k = 1 and a zero router: p = 1, the gate 1 with relative error
    2 kappa + gamma(1) + u, kappa = gamma(1) + 6u; the router adds nothing to x's gradient."""
    moe = MoEFFN(MoEShape(hidden=3, ffn=4, experts=1, top_k=1, shared=shared), F64)
    with torch.no_grad():
        moe.router.gate.weight.zero_()
        for mlp in [moe.experts["0"], moe.shared] if shared else [moe.experts["0"]]:
            mlp.load_state_dict(_mlp().state_dict())
        if shared:  # the shared expert's weights: the expert's, reversed and rescaled
            for w in moe.shared.parameters():
                w.copy_(-0.5 * w.flip(0))
    return moe, torch.tensor(X, dtype=F64), torch.tensor(DY, dtype=F64)


@pytest.mark.parametrize("shared", [False, True])
def test_the_layer_passes_each_expert_its_gates_error_and_the_shared_one_none(shared):
    """The expert's output gradient is dout, its error |dout| (2 kappa + gamma(1) + u) + u
    |dout|; the shared expert's is exact. Output: the expert's, its gate's error times |y|,
    u |y|, gamma(1) |y|; with the shared expert, its own and gamma(2) of both terms. Input:
    the expert's plus gamma(2) (its path and the router's, which is zero here), with the
    shared expert both experts' plus gamma(3); twice each."""
    moe, x, dout = _one_expert_layer(shared)
    bounds = moe_bounds(moe, x, dout)
    e_gate = 2 * (gamma(1) + 6 * U) + gamma(1) + U
    edy = [[abs(v) * (e_gate + U) for v in row] for row in DY]
    hand = _by_hand(WG, WU, WD, X, DY, edy)
    for name in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
        _close(bounds[f"experts.0.{name}"], hand[name], 2.0)
    y, dx = (v.abs() for v in _autograd(moe.experts["0"], x, dout))
    out = torch.tensor(hand["ey"], dtype=F64) + (e_gate + U) * y
    inp = torch.tensor(hand["edx"], dtype=F64)
    if shared:
        w = {k: v.tolist() for k, v in moe.shared.state_dict().items()}
        mine = _by_hand(w["gate_proj.weight"], w["up_proj.weight"], w["down_proj.weight"],
                        X, DY, [[0.0] * 3] * 2)
        for name in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
            _close(bounds[f"shared.{name}"], mine[name], 2.0)
        ys, dxs = (v.abs() for v in _autograd(moe.shared, x, dout))
        out = out + torch.tensor(mine["ey"], dtype=F64) + gamma(2) * (y + ys)
        inp = inp + torch.tensor(mine["edx"], dtype=F64) + gamma(3) * (dx + dxs)
    else:
        out = out + gamma(1) * y
        inp = inp + gamma(2) * dx
    _close(bounds["out"], out.tolist(), 2.0)
    _close(bounds["input"], inp.tolist(), 2.0)


# --- the refusal of a near tie --------------------------------------------------------------


def _scores(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def test_a_gap_of_exactly_twice_the_two_errors_is_refused_and_just_above_it_passes():
    """Scores listed out of order (sorted, with their errors, before comparing): token 1's
    best two are 1 and 1/2, errors 1/8 each: gap 1/2 = 2 (1/8 + 1/8), refused; with the
    second's error 2^-54 more, still refused; 2^-54 less, the gap is above the threshold
    and nothing is refused; the third score's error never counts for k = 1."""
    score = _scores([0.25, 1.0, 0.125], [0.25, 0.5, 1.0])
    err = _scores([0.0, 0.0, 0.0], [4.0, 0.125, 0.125])
    for second in (0.125, 0.125 + 2.0**-54):
        err[1, 1] = second
        with pytest.raises(ValueError, match=r"^token 1: its scores 1 and 2 differ by 5\.00e-01, "
                                             r"within their rounding: the two sides may choose "
                                             r"different experts, and this bound does not "
                                             r"apply$"):
            _check_choice(score, err, 1)
    err[1, 1] = 0.125 - 2.0**-54
    _check_choice(score, err, 1)


def test_the_threshold_is_twice_the_sum_of_both_errors():
    """Gap 1/2 for k = 1; errors (0.1, 0.1): 2 x 0.2 < 1/2 passes (thrice would not);
    errors (0.3, 0): 2 x 0.3 > 1/2 refused on the best score's error alone; errors
    (0, 0.3): the same on the second's; errors (0.2, 0.1): 0.6 refused, though their
    difference is far below."""
    score = _scores([1.0, 0.5, 0.0])
    _check_choice(score, _scores([0.1, 0.1, 9.0]), 1)
    for err in ([0.3, 0.0, 0.0], [0.0, 0.3, 0.0], [0.2, 0.1, 0.0]):
        with pytest.raises(ValueError, match="^token 0: its scores 1 and 2 differ by 5.00e-01"):
            _check_choice(score, _scores(err), 1)


def test_the_kth_and_next_scores_are_compared_for_k_of_two_and_three():
    """k = 2 of 4: token 0's sorted scores (4, 3, 2.5, 0) compare the 2nd and 3rd (gap 1/2,
    clear), the 1st's and 4th's large errors no concern; the first refused token is the one
    named (tokens 1 and 2 tie), its gap written to 3 digits. k = 3: (1, 3/4, 1/2 + 2^-10,
    1/2), errors 2^-12 on the last two: refused at exactly the threshold."""
    score = _scores([2.5, 4.0, 0.0, 3.0], [1.0, 1.0, 1.0, 1.0 + 2.0**-10], [1.0, 0.0, 0.0, 0.0])
    err = _scores([0.0, 5.0, 5.0, 0.0], [0.0] * 4, [0.0] * 4)
    _check_choice(score[:1], err[:1], 2)
    _check_choice(score[1:2], err[1:2], 1)  # 1 + 2^-10 alone on top
    with pytest.raises(ValueError, match=r"^token 1: its scores 2 and 3 differ by 0\.00e\+00,"):
        _check_choice(score, err, 2)
    tight = err.clone()
    tight[0, 0] = 0.25  # the 3rd's error: 2 x 1/4 = the gap
    with pytest.raises(ValueError, match=r"^token 0: its scores 2 and 3 differ by 5\.00e-01,"):
        _check_choice(score[:1], tight[:1], 2)
    three = _scores([0.5, 1.0, 0.75, 0.5 + 2.0**-10])
    small = _scores([2.0**-12, 0.0, 0.0, 2.0**-12])
    with pytest.raises(ValueError, match=r"^token 0: its scores 3 and 4 differ by 9\.77e-04,"):
        _check_choice(three, small, 3)
    _check_choice(three, small / 2, 3)
