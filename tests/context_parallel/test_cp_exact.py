"""Lesson 10's context parallelism to the letter: the log-sum-exp merge against softmax over
the union of the blocks (a block or a row fully masked included), the contiguous and zig-zag
splits written out by hand for cp = 1 to 4, the causal work against counted pairs, the ring's
pieces, plan, pass and clock, ring / all-gather / Ulysses attention on thread ranks against
one device's (outputs and gradients, grouped-query heads), the traffic formulas against a
hand-worked table, and the rounding bound against its definition, element by element, on a
small case; every refusal's words."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers.context_parallel import bounds, gather, ring
from helpers.context_parallel.bounds import U, attention_bounds, gamma, output_bound
from helpers.context_parallel.gather import (
    allgather_attention,
    heads_to_seq,
    seq_to_heads,
    ulysses_attention,
)
from helpers.context_parallel.merge import (
    block_attention,
    blockwise_attention,
    causal_mask,
    merge,
)
from helpers.context_parallel.ring import RingPlan, pieces, ring_attention, ring_pass
from helpers.context_parallel.split import (
    causal_work,
    chunks_of,
    positions,
    shard,
    unshard,
)
from helpers.context_parallel.traffic import (
    AttentionShape,
    LayerTraffic,
    layer_traffic,
    validate_variant,
)
from helpers.torchrun.in_notebook import run_ranks

INF = float("inf")


def _rand(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*shape, generator=g, dtype=torch.float64)


def _softmax_attention(q, k, v, mask=None):
    """Attention from its definition: softmax of q.k / sqrt(d) over the keys a query sees."""
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -INF)
    return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores, -1), v)


# --- the merge -------------------------------------------------------------------------


def test_causal_mask_by_hand():
    """A query sees the keys at or before its position, and only those."""
    got = causal_mask(torch.tensor([1, 3]), torch.tensor([0, 1, 2, 3, 4]))
    assert got.tolist() == [[True, True, False, False, False],
                            [True, True, True, True, False]]


def test_block_attention_by_hand():
    """d = 4 (scale 1/2): scores 1 and 0, weights e/(e+1) and 1/(e+1), lse = log(e + 1)."""
    q = torch.tensor([2.0, 0, 0, 0], dtype=torch.float64).reshape(1, 1, 1, 4)
    k = torch.tensor([[1.0, 0, 0, 0], [0, 5, 0, 0]], dtype=torch.float64).reshape(1, 1, 2, 4)
    v = torch.tensor([[1.0, 2, 3, 4], [-1, 0, 1, 0]], dtype=torch.float64).reshape(1, 1, 2, 4)
    out, lse = block_attention(q, k, v)
    e = math.e
    want = [(e * a + b) / (e + 1) for a, b in zip([1, 2, 3, 4], [-1, 0, 1, 0], strict=True)]
    assert out.flatten().tolist() == pytest.approx(want, rel=1e-14, abs=0)
    assert lse.item() == pytest.approx(math.log(e + 1), rel=1e-14, abs=0)
    assert lse.shape == (1, 1, 1)


def test_a_row_that_sees_no_key_gets_zero_and_minus_infinity():
    """A fully masked row: output 0 (not NaN) and lse -inf; the other rows as unmasked."""
    q, k, v = _rand(1, 2, 3, 4, seed=1), _rand(1, 2, 2, 4, seed=2), _rand(1, 2, 2, 4, seed=3)
    mask = torch.tensor([[True, True], [False, False], [True, False]])
    out, lse = block_attention(q, k, v, mask)
    assert torch.equal(out[..., 1, :], torch.zeros(1, 2, 4, dtype=torch.float64))
    assert lse[..., 1].tolist() == [[-INF, -INF]]
    want = _softmax_attention(q, k, v)
    assert torch.allclose(out[..., 0, :], want[..., 0, :], rtol=1e-13, atol=1e-14)
    assert torch.allclose(out[..., 2, :], v[..., 0, :], rtol=1e-13, atol=1e-14)
    scores = (q @ k.transpose(-2, -1)) / 2
    assert torch.allclose(lse[..., 0], torch.logsumexp(scores[..., 0, :], -1), rtol=1e-14)
    assert torch.allclose(lse[..., 2], scores[..., 2, 0], rtol=1e-14)


@pytest.mark.parametrize("causal", [False, True])
def test_two_merged_blocks_are_softmax_over_their_union(causal):
    """Keys 0..1 and 2..5 attended apart and merged: attention over all six, and the merged
    lse is the log of the summed denominators; the merge is symmetric."""
    q, k, v = _rand(2, 3, 6, 4, seed=4), _rand(2, 3, 6, 4, seed=5), _rand(2, 3, 6, 4, seed=6)
    q_pos = torch.arange(6)
    full = causal_mask(q_pos, q_pos) if causal else None
    a_mask = full[:, :2] if causal else None
    b_mask = full[:, 2:] if causal else None
    a = block_attention(q, k[..., :2, :], v[..., :2, :], a_mask)
    b = block_attention(q, k[..., 2:, :], v[..., 2:, :], b_mask)
    out, lse = merge(*a, *b)
    assert torch.allclose(out, _softmax_attention(q, k, v, full), rtol=1e-12, atol=1e-13)
    scores = (q @ k.transpose(-2, -1)) / 2
    if causal:
        scores = scores.masked_fill(~full, -INF)
    assert torch.allclose(lse, torch.logsumexp(scores, -1), rtol=1e-13)
    swapped, lse2 = merge(*b, *a)
    assert torch.allclose(swapped, out, rtol=1e-13, atol=1e-14) and torch.equal(lse2, lse)


def test_a_fully_masked_block_adds_nothing_and_rows_seen_nowhere_stay_zero():
    """Merging a block no query sees leaves the other unchanged; a row that neither block
    lets see anything stays output 0, lse -inf, without a NaN."""
    q, k, v = _rand(1, 1, 2, 4, seed=7), _rand(1, 1, 4, 4, seed=8), _rand(1, 1, 4, 4, seed=9)
    q_pos = torch.tensor([0, 1])
    a = block_attention(q, k[..., :2, :], v[..., :2, :], causal_mask(q_pos, torch.arange(2)))
    b = block_attention(q, k[..., 2:, :], v[..., 2:, :], causal_mask(q_pos, torch.arange(2, 4)))
    assert b[1].tolist() == [[[-INF, -INF]]] and not b[0].any()
    for out, lse in (merge(*a, *b), merge(*b, *a)):
        assert torch.equal(lse, a[1])
        assert torch.allclose(out, a[0], rtol=1e-15, atol=0)
    out, lse = merge(*b, *b)
    assert not out.isnan().any() and not out.any() and lse.tolist() == [[[-INF, -INF]]]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("blocks", [1, 2, 3, 6])
def test_blockwise_attention_is_softmax_attention(blocks, causal):
    """Any number of blocks that divides the keys gives softmax attention (causal: query i
    sees keys 0..i); the default is not causal."""
    q, k, v = _rand(1, 2, 6, 4, seed=10), _rand(1, 2, 6, 4, seed=11), _rand(1, 2, 6, 4, seed=12)
    mask = causal_mask(torch.arange(6), torch.arange(6)) if causal else None
    got = blockwise_attention(q, k, v, blocks, causal)
    assert torch.allclose(got, _softmax_attention(q, k, v, mask), rtol=1e-12, atol=1e-13)
    if not causal:
        assert torch.equal(blockwise_attention(q, k, v, blocks), got)


def test_blockwise_attention_keeps_any_leading_dimensions_and_the_dtype():
    """One head as (seq, d) and (h, seq, d), and bfloat16 in, bfloat16 out."""
    q, k, v = _rand(3, 6, 2, seed=13), _rand(3, 6, 2, seed=14), _rand(3, 6, 2, seed=15)
    mask = causal_mask(torch.arange(6), torch.arange(6))
    want = _softmax_attention(q[None], k[None], v[None], mask)[0]
    assert torch.allclose(blockwise_attention(q, k, v, 3, True), want, rtol=1e-12)
    assert torch.allclose(blockwise_attention(q[0], k[0], v[0], 2, True), want[0], rtol=1e-12)
    half = blockwise_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 2, True)
    assert half.dtype == torch.bfloat16
    assert torch.allclose(half.double(), want, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("blocks, valid", [(0, 4), (4, 6), (7, 6)])
def test_blockwise_refusal_lists_the_divisors(blocks, valid):
    q = _rand(1, 1, valid, 2)
    divisors = [n for n in range(1, valid + 1) if valid % n == 0]
    with pytest.raises(ValueError) as error:
        blockwise_attention(q, q, q, blocks)
    assert str(error.value) == (f"blocks={blocks} must divide the key length {valid} "
                                f"(valid: {divisors})")


# --- the split -------------------------------------------------------------------------

CHUNKS = {  # (cp, split): each rank's chunks, by hand
    (1, "contiguous"): [[0]], (1, "zigzag"): [[0, 1]],
    (2, "contiguous"): [[0], [1]], (2, "zigzag"): [[0, 3], [1, 2]],
    (3, "contiguous"): [[0], [1], [2]], (3, "zigzag"): [[0, 5], [1, 4], [2, 3]],
    (4, "contiguous"): [[0], [1], [2], [3]], (4, "zigzag"): [[0, 7], [1, 6], [2, 5], [3, 4]],
}
POSITIONS = {  # (cp, seq, split): each rank's true token positions, by hand
    (1, 4, "contiguous"): [[0, 1, 2, 3]], (1, 4, "zigzag"): [[0, 1, 2, 3]],
    (2, 4, "contiguous"): [[0, 1], [2, 3]], (2, 4, "zigzag"): [[0, 3], [1, 2]],
    (2, 8, "zigzag"): [[0, 1, 6, 7], [2, 3, 4, 5]],
    (3, 6, "contiguous"): [[0, 1], [2, 3], [4, 5]], (3, 6, "zigzag"): [[0, 5], [1, 4], [2, 3]],
    (3, 12, "zigzag"): [[0, 1, 10, 11], [2, 3, 8, 9], [4, 5, 6, 7]],
    (4, 8, "contiguous"): [[0, 1], [2, 3], [4, 5], [6, 7]],
    (4, 8, "zigzag"): [[0, 7], [1, 6], [2, 5], [3, 4]],
}


def test_chunks_and_positions_for_cp_1_to_4_by_hand():
    """Every rank's chunks and token positions, contiguous and zig-zag, as written out."""
    for (cp, split), want in CHUNKS.items():
        assert [chunks_of(r, cp, split) for r in range(cp)] == want, (cp, split)
    for (cp, seq, split), want in POSITIONS.items():
        assert [positions(r, cp, seq, split).tolist() for r in range(cp)] == want


@pytest.mark.parametrize("split", ["contiguous", "zigzag"])
def test_shard_and_unshard_along_any_dimension(split):
    """Rank 1 of 3 holds its positions along the given dimension (default: -2); unshard
    puts every rank's tokens back in true order."""
    x = torch.arange(12 * 2).reshape(12, 2)
    mine = POSITIONS[(3, 12, "zigzag")][1] if split == "zigzag" else [4, 5, 6, 7]
    assert shard(x, 1, 3, split).tolist() == [[2 * p, 2 * p + 1] for p in mine]
    assert shard(x.T, 1, 3, split, dim=1).tolist() == [[2 * p for p in mine],
                                                        [2 * p + 1 for p in mine]]
    y = torch.arange(12).reshape(1, 12, 1) * torch.ones(2, 1, 3, dtype=torch.long)
    parts = [shard(y, r, 3, split, dim=1) for r in range(3)]
    assert torch.equal(unshard(parts, 3, split, dim=1), y)
    assert torch.equal(unshard([shard(x, r, 3, split) for r in range(3)], 3, split), x)


@pytest.mark.parametrize("call, message", [
    (lambda: chunks_of(0, 2, "strided"), "split='strided'; valid: contiguous, zigzag"),
    (lambda: chunks_of(-1, 2, "zigzag"),
     "rank=-1 with cp=2; valid: cp >= 1 and 0 <= rank < cp"),
    (lambda: chunks_of(0, 0, "contiguous"),
     "rank=0 with cp=0; valid: cp >= 1 and 0 <= rank < cp"),
    (lambda: chunks_of(3, 3, "contiguous"),
     "rank=3 with cp=3; valid: cp >= 1 and 0 <= rank < cp"),
    (lambda: positions(0, 3, 8, "contiguous"),
     "seq=8 is not divisible into 3 chunks for split 'contiguous' with cp=3; "
     "use a multiple of 3"),
    (lambda: positions(1, 3, 9, "zigzag"),
     "seq=9 is not divisible into 6 chunks for split 'zigzag' with cp=3; use a multiple of 6"),
])
def test_split_refusals_word_for_word(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert str(error.value) == message


def test_every_rank_may_hold_the_last_rank():
    """The last rank is valid (rank < cp, not rank < cp - 1), and rank 0 with cp = 1."""
    assert chunks_of(2, 3, "zigzag") == [2, 3] and chunks_of(0, 1, "contiguous") == [0]


WORK = {  # (cp, seq, split): each rank's computed (query, key) pairs, by hand
    (1, 4, "contiguous"): [16],  # one chunk: all 4 x 4
    (1, 4, "zigzag"): [12],  # chunks {0,1} and {2,3}: 4 + 4 + 4 (chunk 0 skips chunk 1)
    (2, 4, "contiguous"): [4, 8],
    (2, 8, "zigzag"): [20, 20],  # 4 x (1 + 4) and 4 x (2 + 3) chunk pairs
    (3, 6, "contiguous"): [4, 8, 12],
    (3, 6, "zigzag"): [7, 7, 7],  # 1-token chunks: (1 + 6), (2 + 5), (3 + 4)
    (4, 8, "contiguous"): [4, 8, 12, 16],
}


def test_causal_work_by_hand():
    for (cp, seq, split), want in WORK.items():
        assert [causal_work(r, cp, seq, split) for r in range(cp)] == want, (cp, seq, split)


@pytest.mark.parametrize("cp, seq", [(2, 8), (3, 12), (4, 16)])
@pytest.mark.parametrize("split", ["contiguous", "zigzag"])
def test_causal_work_is_the_unmasked_pairs_plus_the_masked_halves_of_diagonal_chunks(
        cp, seq, split):
    """Counted pair by pair: the unmasked (query, key) pairs of the rank, plus the masked
    pairs of each chunk it computes against itself (size (size - 1) / 2 each)."""
    parts = cp if split == "contiguous" else 2 * cp
    size = seq // parts
    for r in range(cp):
        mine = positions(r, cp, seq, split).tolist()
        unmasked = sum(1 for i in mine for j in range(seq) if j <= i)
        diagonal = len(mine) // size * size * (size - 1) // 2
        assert causal_work(r, cp, seq, split) == unmasked + diagonal


# --- the traffic -----------------------------------------------------------------------

TABLE_SHAPE = AttentionShape(batch=1, seq=12, heads=4, kv_heads=2, head_dim=2)
TABLE = {  # (variant, cp): (forward, backward, backward with gloo's reduce-scatter), bytes
    # cp = 2: kv = 1 x 2 x 6 x 2 x 4 = 96 bytes, q = 192
    ("ring", 2): (192, 576, 576), ("zigzag", 2): (192, 576, 576),
    ("allgather", 2): (192, 192, 384), ("ulysses", 2): (288, 288, 288),
    # cp = 3: kv = 64, q = 128; Ulysses 2 x (256 + 128) / 3 = 256
    ("ring", 3): (256, 640, 640), ("zigzag", 3): (256, 640, 640),
    ("allgather", 3): (256, 256, 512), ("ulysses", 3): (256, 256, 256),
    # cp = 4: kv = 48, q = 96; Ulysses 3 x (192 + 96) / 4 = 216
    ("ring", 4): (288, 672, 672), ("allgather", 4): (288, 288, 576),
    ("ulysses", 4): (216, 216, 216),
}


def test_layer_traffic_against_a_hand_worked_table():
    for (variant, cp), (forward, backward, gloo) in TABLE.items():
        got = layer_traffic(variant, TABLE_SHAPE, cp)
        assert got == LayerTraffic(forward, backward), (variant, cp)
        assert got.step == forward + backward
        assert all(type(n) is int for n in (got.forward, got.backward)), (variant, cp)
        assert layer_traffic(variant, TABLE_SHAPE, cp, gloo=True) == LayerTraffic(
            forward, gloo), (variant, cp)


def test_ulysses_bytes_round_down_to_whole_bytes():
    """1 byte a token per tensor, 2 tokens a rank, cp = 3: (2 / 3) x (4 + 4) = 5.33 -> 5."""
    shape = AttentionShape(batch=1, seq=6, heads=1, kv_heads=1, head_dim=1, element_bytes=1)
    got = layer_traffic("ulysses", shape, 3)
    assert got == LayerTraffic(5, 5) and isinstance(got.forward, int)


def test_one_rank_sends_nothing_under_every_variant():
    for variant in ("ring", "zigzag", "allgather", "ulysses"):
        assert layer_traffic(variant, TABLE_SHAPE, 1, gloo=True) == LayerTraffic(0, 0)


def test_block_bytes_and_the_default_element_size():
    """b x heads x s/cp x head_dim x 4 bytes (float32 by default)."""
    assert TABLE_SHAPE.element_bytes == 4
    assert TABLE_SHAPE.block(3, 5) == 1 * 5 * 4 * 2 * 4
    assert type(TABLE_SHAPE.block(3, 5)) is int
    assert TABLE_SHAPE.block(1, 2) == 2 * 12 * 2 * 4
    assert AttentionShape(2, 8, 4, 1, 3, element_bytes=2).block(4, 1) == 2 * 1 * 2 * 3 * 2


@pytest.mark.parametrize("call, message", [
    (lambda: validate_variant("Ring"), "variant='Ring'; valid: ring, zigzag, allgather, ulysses"),
    (lambda: layer_traffic("tree", TABLE_SHAPE, 1),
     "variant='tree'; valid: ring, zigzag, allgather, ulysses"),
    (lambda: TABLE_SHAPE.block(0, 2), "cp=0 must divide seq=12"),
    (lambda: TABLE_SHAPE.block(5, 2), "cp=5 must divide seq=12"),
    (lambda: layer_traffic("ulysses", TABLE_SHAPE, -1), "cp=-1 must divide seq=12"),
])
def test_traffic_refusals_word_for_word(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert str(error.value) == message


def test_validate_variant_returns_the_variant():
    assert [validate_variant(v) for v in ("ring", "ulysses")] == ["ring", "ulysses"]


# --- the bounds ------------------------------------------------------------------------


def test_gamma_by_hand():
    """n u / (1 - n u): n u = 1/8 gives 1/7, n u = 1/2 gives 1; element-wise on tensors."""
    assert gamma(2**50) == 1 / 7
    assert gamma(2**52) == 1.0
    assert gamma(0) == 0.0
    assert gamma(torch.tensor([2.0**49, 2.0**50], dtype=torch.float64)).tolist() == [
        (1 / 16) / (15 / 16), 1 / 7]
    assert U == 2.0**-53


def _bound_by_definition(q, k, v, dout, causal):
    """The bound of ``bounds``' docstring, element by element in plain floats."""
    batch, heads, seq, d = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    c = 1 / math.sqrt(d)
    g_d = d * U / (1 - d * U)
    q, k, v, dout = (t.tolist() for t in (q, k, v, dout))
    dot = lambda a, b: sum(x * y for x, y in zip(a, b, strict=True))  # noqa: E731
    adot = lambda a, b: sum(abs(x) * abs(y) for x, y in zip(a, b, strict=True))  # noqa: E731
    worst = {"out": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
    rows = {}
    for b in range(batch):
        for kh in range(kv_heads):
            dk_err = [[0.0] * d for _ in range(seq)]
            dk_abs = [[0.0] * d for _ in range(seq)]
            dv_err = [[0.0] * d for _ in range(seq)]
            dv_abs = [[0.0] * d for _ in range(seq)]
            kk, vv = k[b][kh], v[b][kh]
            for h in range(kh * group, (kh + 1) * group):
                for i in range(seq):
                    qi, go = q[b][h][i], dout[b][h][i]
                    seen = list(range(i + 1)) if causal else list(range(seq))
                    n = len(seen)
                    g_n = n * U / (1 - n * U)
                    s = {j: c * dot(qi, kk[j]) for j in seen}
                    lse = math.log(sum(math.exp(x) for x in s.values()))
                    p = {j: math.exp(s[j] - lse) for j in seen}
                    sigma = {j: (g_d + 6 * U) * c * adot(qi, kk[j]) + U * abs(s[j]) for j in seen}
                    kappa = (2 * max(sigma.values()) + g_n
                             + U * max(abs(s[j] - lse) for j in seen)
                             + 2 * U * math.log(n) + (2 * n + 4) * 2 * U * (1 + abs(lse)))
                    o = [sum(p[j] * vv[j][e] for j in seen) for e in range(d)]
                    out_err = [(kappa + g_n) * sum(p[j] * abs(vv[j][e]) for j in seen)
                               for e in range(d)]
                    dp = {j: dot(go, vv[j]) for j in seen}
                    dp_err = {j: g_d * adot(go, vv[j]) for j in seen}
                    big_d = dot(go, o)
                    d_err = max(g_d * adot(go, o) + adot(go, out_err),
                                (kappa + g_n) * sum(p[j] * abs(dp[j]) for j in seen)
                                + sum(p[j] * dp_err[j] for j in seen))
                    ds = {j: p[j] * (dp[j] - big_d) for j in seen}
                    ds_err = {j: p[j] * ((kappa + 2 * U) * abs(dp[j] - big_d) + dp_err[j]
                                         + d_err) for j in seen}
                    dq_err = [c * (sum(ds_err[j] * abs(kk[j][e]) for j in seen)
                                   + (g_n + U) * sum(abs(ds[j]) * abs(kk[j][e]) for j in seen))
                              for e in range(d)]
                    rows[b, h, i] = (kappa, out_err, dq_err, ds_err, ds, p)
                    worst["out"] = max(worst["out"], *out_err)
                    worst["dq"] = max(worst["dq"], *dq_err)
                    for j in seen:
                        for e in range(d):
                            dk_err[j][e] += c * ds_err[j] * abs(qi[e])
                            dk_abs[j][e] += c * abs(ds[j]) * abs(qi[e])
                            dv_err[j][e] += p[j] * kappa * abs(go[e])
                            dv_abs[j][e] += p[j] * abs(go[e])
            terms = group * seq
            g_t = terms * U / (1 - terms * U)
            for j in range(seq):
                for e in range(d):
                    worst["dk"] = max(worst["dk"], dk_err[j][e] + (g_t + U) * dk_abs[j][e])
                    worst["dv"] = max(worst["dv"], dv_err[j][e] + g_t * dv_abs[j][e])
    return {name: 2 * value for name, value in worst.items()}, rows


def _bound_inputs(seq=4, d=3, batch=2):
    """Two batch rows of different scales, 4 query heads over 2 key/value heads; one key
    row large so that its terms lead in some rows and not in others."""
    q, dout = _rand(batch, 4, seq, d, seed=20), _rand(batch, 4, seq, d, seed=21)
    k, v = _rand(batch, 2, seq, d, seed=22), _rand(batch, 2, seq, d, seed=23, scale=2.0)
    k[-1] *= 3.0
    k[..., 1, :] *= 2.0
    return q, k, v, dout


@pytest.mark.parametrize("causal", [True, False])
def test_attention_bounds_against_their_definition(causal):
    """Each of out, dq, dk and dv: twice the largest element's bound, as defined."""
    q, k, v, dout = _bound_inputs()
    want, _ = _bound_by_definition(q, k, v, dout, causal)
    got = attention_bounds(q, k, v, dout, causal)
    assert list(got) == ["out", "dq", "dk", "dv"]
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-12, abs=0), name
    assert output_bound(q, k, v, causal) == pytest.approx(
        _bound_by_definition(q, k, v, torch.zeros_like(q), causal)[0]["out"], rel=1e-12, abs=0)


@pytest.mark.parametrize("d", [3, 1])
@pytest.mark.parametrize("causal", [True, False])
def test_each_rows_pieces_of_the_bound_against_their_definition(causal, d):
    """One query head's kappa, output and dq bounds, dS and its bound, and the weights,
    element by element (not only the largest). With d = 1 and values of both signs, D's
    second form (through dP) is the larger of the two."""
    q, k, v, dout = _bound_inputs(d=d, batch=1)
    _, rows = _bound_by_definition(q, k, v, dout, causal)
    mask = torch.ones(4, 4, dtype=torch.bool)
    if causal:
        mask = torch.tril(mask)
    for h in range(4):
        row = bounds._head(q[0, h], k[0, h // 2], v[0, h // 2], dout[0, h], mask)
        assert row.c == 1 / math.sqrt(d)
        for i in range(4):
            kappa, out_err, dq_err, ds_err, ds, p = rows[0, h, i]
            assert row.kappa[i, 0].item() == pytest.approx(kappa, rel=1e-13, abs=0)
            assert row.out_err[i].tolist() == pytest.approx(out_err, rel=1e-12, abs=0)
            assert row.dq_err[i].tolist() == pytest.approx(dq_err, rel=1e-12, abs=0)
            for j in range(4):
                assert row.p[i, j].item() == pytest.approx(p.get(j, 0.0), rel=1e-12, abs=0)
                assert row.ds[i, j].item() == pytest.approx(ds.get(j, 0.0), rel=1e-9, abs=1e-15)
                want_err = ds_err.get(j, 0.0)
                assert row.ds_err[i, j].item() == pytest.approx(want_err, rel=1e-12, abs=0)
        assert torch.equal(row.aq, q[0, h].abs()) and torch.equal(row.ag, dout[0, h].abs())


# --- the ring's pieces, plan, pass and clock --------------------------------------------


def _listed(found):
    return [(qs.start, qs.stop, ks.start, ks.stop, None if m is None else m.tolist())
            for qs, ks, m in found]


def test_pieces_by_hand():
    """Causal: a key chunk wholly after a query chunk is skipped, one wholly before it needs
    no mask, one that overlaps is masked; not causal: every piece, unmasked."""
    t, f = True, False
    tril = [[t, f], [t, f]]
    tril[1][1] = t
    pos = torch.arange(4)
    assert _listed(pieces(pos, pos, 2, True)) == [
        (0, 2, 0, 2, tril), (2, 4, 0, 2, None), (2, 4, 2, 4, tril)]
    assert _listed(pieces(pos, pos, 2, False)) == [
        (0, 2, 0, 2, None), (0, 2, 2, 4, None), (2, 4, 0, 2, None), (2, 4, 2, 4, None)]
    # a key chunk ending at the query chunk's first position: seen whole, no mask
    assert _listed(pieces(torch.tensor([1, 2]), torch.tensor([0, 1]), 2, True)) == [
        (0, 2, 0, 2, None)]
    # a key chunk starting at the query chunk's last position: kept, masked
    assert _listed(pieces(torch.tensor([0, 1]), torch.tensor([1, 2]), 2, True)) == [
        (0, 2, 0, 2, [[f, f], [t, f]])]
    assert _listed(pieces(torch.tensor([0, 1]), torch.tensor([2, 3]), 2, True)) == []
    # a skipped key chunk does not end the query chunk's walk: later key chunks still count
    assert _listed(pieces(torch.tensor([0, 1]), torch.tensor([2, 3, 0, 1]), 2, True)) == [
        (0, 2, 2, 4, tril)]


def test_ring_plan_by_hand():
    """Owners walk backwards round the ring; zig-zag rank 0 of 2 computes these pieces."""
    assert [RingPlan(0, 3, 6, "contiguous", True).owner(s) for s in range(3)] == [0, 2, 1]
    assert [RingPlan(2, 3, 6, "contiguous", True).owner(s) for s in range(3)] == [2, 1, 0]
    assert RingPlan(0, 3, 12, "contiguous", True).chunk == 4
    assert RingPlan(0, 3, 12, "zigzag", True).chunk == 2
    plan = RingPlan(0, 2, 8, "zigzag", True)
    tril = [[True, False], [True, True]]
    assert _listed(plan.pieces(0)) == [(0, 2, 0, 2, tril), (2, 4, 0, 2, None),
                                       (2, 4, 2, 4, tril)]
    assert _listed(plan.pieces(1)) == [(2, 4, 0, 2, None), (2, 4, 2, 4, None)]
    assert len(RingPlan(1, 2, 8, "zigzag", False).pieces(1)) == 4


def test_ring_pass_sends_to_the_next_rank_and_receives_from_the_previous():
    """Three ranks, two tensors of different shapes (one not contiguous): each rank gets
    rank - 1's, in a contiguous tensor."""
    def work(rank, group):
        a = torch.full((2,), float(rank))
        b = (torch.arange(6.0).reshape(2, 3) + 10 * rank).T
        got = ring_pass([a, b], group, tag=5)
        return got[0].tolist(), got[1].tolist(), got[1].is_contiguous()

    results = run_ranks(3, work, timeout=20, raise_errors=True)
    for rank, (a, b, contiguous) in enumerate(results):
        prev = (rank - 1) % 3
        assert a == [float(prev)] * 2
        assert b == (torch.arange(6.0).reshape(2, 3) + 10 * prev).T.tolist() and contiguous


def test_compute_clock_adds_each_charge_inside_its_with_only(monkeypatch):
    now = [10.0]
    monkeypatch.setattr(ring, "time", type("Clock", (), {"perf_counter": lambda: now[0]}))
    ring._charge(5.0)  # no clock running: nothing happens
    with ring.compute_clock() as spent:
        assert spent == [0.0]
        ring._charge(7.5)
        ring._charge(9.0)
        assert spent == [3.5]
    ring._charge(0.0)
    assert spent == [3.5] and ring._CLOCK.spent is None


def test_ring_attention_charges_one_tick_per_step_forward_and_backward(monkeypatch):
    """A clock that ticks 1 per reading, per thread: each of the cp steps of the forward and
    of the backward is charged once, on each rank."""
    import threading

    local = threading.local()

    def tick():
        local.now = getattr(local, "now", 0.0) + 1.0
        return local.now

    monkeypatch.setattr(ring, "time", type("Clock", (), {"perf_counter": staticmethod(tick)}))
    q, k = _rand(1, 2, 8, 2), _rand(1, 1, 8, 2, seed=1)

    def work(rank, group):
        ql, kl = (shard(t, rank, 2, "zigzag").requires_grad_() for t in (q, k))
        with ring.compute_clock() as spent:
            out = ring_attention(ql, kl, kl, group, "zigzag")
            forward = spent[0]
            out.sum().backward()
        return forward, spent[0]

    assert run_ranks(2, work, timeout=20, raise_errors=True) == [(2.0, 4.0), (2.0, 4.0)]


# --- the attention variants on thread ranks ----------------------------------------------

B, H, KVH, D = 1, 4, 2, 4


def _whole(seq, heads=H, kv_heads=KVH, seed=30):
    return (_rand(B, heads, seq, D, seed=seed), _rand(B, kv_heads, seq, D, seed=seed + 1),
            _rand(B, kv_heads, seq, D, seed=seed + 2), _rand(B, heads, seq, D, seed=seed + 3))


def _one_device(q, k, v, dout, causal):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), dout)]


def _on_ranks(attention, cp, split, causal, seq, default=False, heads=H, kv_heads=KVH):
    q, k, v, dout = _whole(seq, heads, kv_heads)

    def work(rank, group):
        ql, kl, vl = (shard(t, rank, cp, split).requires_grad_() for t in (q, k, v))
        if default:  # the defaults: contiguous, causal
            out = attention(ql, kl, vl, group)
        else:
            out = attention(ql, kl, vl, group, split, causal)
        out.backward(shard(dout, rank, cp, split))
        return out.detach(), ql.grad, kl.grad, vl.grad

    results = run_ranks(cp, work, timeout=30, raise_errors=True)
    got = [unshard([r[i] for r in results], cp, split) for i in range(4)]
    return got, _one_device(q, k, v, dout, causal)


def _close(got, want):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        assert a.shape == b.shape, name
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), (name, (a - b).abs().max())


ATTENTIONS = {"ring": ring_attention, "allgather": allgather_attention,
              "ulysses": ulysses_attention}


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("split", ["contiguous", "zigzag"])
@pytest.mark.parametrize("name", list(ATTENTIONS))
def test_two_ranks_equal_one_device_with_grouped_query_heads(name, split, causal):
    """4 query heads over 2 key/value heads, 2 thread ranks: output and the gradients of q,
    k and v equal one device's ``scaled_dot_product_attention`` (contiguous and causal: by
    default)."""
    default = split == "contiguous" and causal
    _close(*_on_ranks(ATTENTIONS[name], 2, split, causal, seq=8, default=default))


@pytest.mark.parametrize("split", ["contiguous", "zigzag"])
@pytest.mark.parametrize("name", ["ring", "allgather"])
def test_three_ranks_equal_one_device(name, split):
    """An odd ring: the blocks must go round one way (on 2 ranks both ways are the same)."""
    _close(*_on_ranks(ATTENTIONS[name], 3, split, True, seq=12))


@pytest.mark.parametrize("name, seq", [("allgather", 8), ("ulysses", 2), ("ulysses", 4)])
def test_grouped_heads_when_a_length_equals_a_head_count(name, seq):
    """8 query heads over 4 key/value heads, where a length equals a head count: a rank's
    4 tokens of 8 (all-gather); per rank, 2 key/value heads and 2 tokens, or 4 query heads
    and 4 tokens (Ulysses)."""
    _close(*_on_ranks(ATTENTIONS[name], 2, "contiguous", False, seq=seq, heads=8, kv_heads=4))


def test_seq_to_heads_and_back_by_hand():
    """Rank r's token s of head h holds 100 r + 10 h + s; after the all-to-all rank r holds
    heads 2r, 2r + 1 of every rank's tokens, rank after rank; and back."""
    def work(rank, group):
        x = (100 * rank + 10 * torch.arange(4).reshape(1, 4, 1, 1)
             + torch.arange(2).reshape(1, 1, 2, 1)) * torch.ones(2, 1, 1, 3)
        heads = seq_to_heads(x, group)
        return x, heads, heads_to_seq(heads, group)

    for rank, (x, heads, back) in enumerate(run_ranks(2, work, timeout=20, raise_errors=True)):
        assert heads.shape == (2, 2, 4, 3)
        want = [[100 * src + 10 * (2 * rank + hl) + s for src in (0, 1) for s in (0, 1)]
                for hl in (0, 1)]
        assert heads[0, :, :, 0].tolist() == want and torch.equal(heads[1], heads[0])
        assert torch.equal(back, x)


class _Group:
    """A stand-in for a process group: only its size is read before the refusals."""

    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


@pytest.mark.parametrize("call, message", [
    (lambda: ring_attention(_rand(1, 3, 5, 2), _rand(1, 2, 5, 2), _rand(1, 2, 5, 2), None),
     "3 query heads are not a multiple of 2 key/value heads"),
    (lambda: seq_to_heads(_rand(1, 3, 2, 2), _Group(2)),
     "Ulysses needs heads divisible by cp: 3 heads, cp=2"),
    (lambda: ulysses_attention(_rand(1, 4, 2, 2), _rand(1, 1, 2, 2), _rand(1, 1, 2, 2),
                               _Group(2)),
     "Ulysses needs the heads (4) and key/value heads (1) divisible by cp=2"),
    (lambda: ulysses_attention(_rand(1, 3, 2, 2), _rand(1, 3, 2, 2), _rand(1, 3, 2, 2),
                               _Group(2)),
     "Ulysses needs the heads (3) and key/value heads (3) divisible by cp=2"),
    (lambda: ulysses_attention(_rand(1, 2, 4, 2), _rand(1, 4, 4, 2), _rand(1, 4, 4, 2),
                               _Group(4)),
     "Ulysses needs the heads (2) and key/value heads (4) divisible by cp=4"),
])
def test_attention_refusals_word_for_word(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert str(error.value) == message


def test_true_order_is_every_ranks_positions_rank_after_rank():
    assert gather._true_order(_Group(2), 4, "zigzag").tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert gather._true_order(_Group(3), 2, "zigzag").tolist() == [0, 5, 1, 4, 2, 3]
    assert gather._true_order(_Group(2), 2, "contiguous").tolist() == [0, 1, 2, 3]
