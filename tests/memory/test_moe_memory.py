"""The estimator's mixtures of experts: the published shapes give the published parameter
counts, the small MoE Llama's rank is predicted as lesson 11's ledger predicts it (which
its tests prove equal to the measured one), ``ep`` divides what it should, and bad input
is refused with the valid choices."""

from __future__ import annotations

import dataclasses

import pytest

from helpers.expert_parallel.llama import moe_llama
from helpers.expert_parallel.memory import ep_rank_memory
from helpers.expert_parallel.moe import MoEShape
from helpers.memory import (
    DEEPSEEK_V3_SHAPE,
    MIXTRAL_8X7B_SHAPE,
    LatentAttention,
    MoETransformerShape,
    TransformerShape,
    estimate_transformer,
    parameter_memory,
)
from helpers.memory.fits import ClusterLayout, per_gpu, split_blocks
from helpers.memory.moe import PUBLISHED_PARAMETERS, validate_ep
from helpers.models.llama import LMConfig

LM = LMConfig(vocab=40, hidden=16, blocks=2, ffn=32, heads=2, kv_heads=1, rope=True)
TOTAL_TOLERANCE = 0.001  # relative: the published totals are given to 3 or 4 digits
ACTIVE_TOLERANCE = 0.03  # relative: DeepSeek-V3's 37B (report) and 36.7B (weights README)
SHAPES = {"DeepSeek-V3": DEEPSEEK_V3_SHAPE, "Mixtral 8x7B": MIXTRAL_8X7B_SHAPE}


def _small(shared: bool = True) -> tuple[MoEShape, MoETransformerShape]:
    moe = MoEShape(hidden=16, ffn=24, experts=4, top_k=2, shared=shared)
    return moe, MoETransformerShape.from_moe(LM, moe)


@pytest.mark.parametrize("model", SHAPES)
def test_the_shapes_give_the_published_parameter_counts(model):
    total, active, source = PUBLISHED_PARAMETERS[model]
    shape = SHAPES[model]
    assert shape.parameters() == pytest.approx(total, rel=TOTAL_TOLERANCE), source
    assert shape.active_parameters() == pytest.approx(active, rel=ACTIVE_TOLERANCE), source
    if model == "DeepSeek-V3":  # the weights README's 36.7B activated, the same tolerance
        assert shape.active_parameters() == pytest.approx(36.7e9, rel=ACTIVE_TOLERANCE)
    else:  # the paper's rounded 47B and 13B
        assert round(shape.parameters() / 1e9) == 47
        assert round(shape.active_parameters() / 1e9) == 13


def test_latent_attention_counts_the_released_configs_matrices():
    """DeepSeek-V3's attention, matrix by matrix from config_671B.json's sizes."""
    h, heads, q, kv, nope, rope, v = 7168, 128, 1536, 512, 128, 64, 128
    matrices = (h * q, q, q * heads * (nope + rope), h * (kv + rope), kv,
                kv * heads * (nope + v), heads * v * h)
    assert DEEPSEEK_V3_SHAPE.attention_parameters() == (sum(matrices), 7)
    straight = LatentAttention(q_lora=0, kv_lora=kv, qk_nope=nope, qk_rope=rope, v_head=v)
    assert straight.parameters(h, heads) == (h * heads * (nope + rope) + sum(matrices[3:]), 4)


def test_the_moe_shape_counts_the_small_moe_llamas_parameters():
    for shared in (True, False):
        moe, shape = _small(shared)
        model = moe_llama(LM, moe)
        assert shape.parameters() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("ep", [1, 2, 4])
@pytest.mark.parametrize("precision", ["fp32", "fp64"])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("shared", [True, False])
def test_the_estimator_predicts_lesson_11s_rank_ledger(ep, precision, optimizer, shared):
    """With a balanced router and no capacity limit: one rank of ``ep`` (``dp = ep``, as
    lesson 11 runs), byte for byte."""
    moe, shape = _small(shared)
    lesson = ep_rank_memory(LM, moe, ep=ep, batch=4, seq=8, optimizer=optimizer,
                            precision=precision)
    estimate = estimate_transformer(shape, batch=4, seq=8, optimizer=optimizer,
                                    precision=precision, dp=ep, ep=ep)
    assert estimate.sum() == lesson


def test_a_moe_shape_without_latent_attention_keeps_a_dense_blocks_activations():
    _, shape = _small()
    dense = TransformerShape.of(LM)
    for tp in (1, 2, 3):
        for sp in (False, True):
            assert shape.block_activation_bytes(64, 2, tp, sp) == \
                dense.block_activation_bytes(64, 2, tp, sp)
    extra = 4 * 64 * shape.ffn * 2  # the dense MLP's four tensors, replaced by the experts'
    assert shape.moe_block_activation_bytes(64, 2) == \
        dense.block_activation_bytes(64, 2) - extra + shape.moe_layer_bytes(64, 2)


def test_ep_divides_the_experts_and_zero_shards_them_over_their_replicas():
    shape = MIXTRAL_8X7B_SHAPE
    rows = {ep: estimate_transformer(shape, batch=1, seq=512, precision="mixed", dp=8,
                                     ep=ep).sum() for ep in (1, 2, 8)}
    experts = shape.moe_blocks * shape.experts * shape.expert_parameters()
    assert rows[1].weights - rows[2].weights == experts  # half of them, at 2 bytes each
    assert len({r.activations for r in rows.values()}) == 1  # balanced: T x k rows arrive
    # ZeRO-1: the replicated part's optimizer state over dp = 8, the experts' over dp / ep
    zero1 = estimate_transformer(shape, batch=1, seq=512, precision="mixed", dp=8, ep=2,
                                 zero=1).sum()
    dense = shape.parameters() - experts
    blocks = shape.moe_blocks
    tensors = 3 + blocks * shape.moe_block_parameters()[1]  # embedding, head and its norm
    expected = (parameter_memory(-(-dense // 8), tensors, optimizer="adam", precision="mixed")
                .optimizer_state + parameter_memory(-(-experts // 2 // 4), 3 * blocks * 4,
                                                    optimizer="adam", precision="mixed")
                .optimizer_state)
    assert zero1.optimizer_state == expected


def test_dense_blocks_come_first_and_a_recomputed_stage_reruns_its_largest_block():
    shape, tokens = DEEPSEEK_V3_SHAPE, 4096
    assert [shape.is_moe(k) for k in range(4)] == [False, False, False, True]
    dense = shape.block_activation_bytes(tokens, 2)
    moe = shape.moe_block_activation_bytes(tokens, 2)
    kept, _ = shape.moe_stage_activation_bytes(0, 4, True, False, tokens=tokens, element_size=2)
    assert kept == shape.embed_activation_bytes(tokens) + 3 * dense + moe
    _, extra = shape.moe_stage_activation_bytes(0, 4, True, False, tokens=tokens,
                                                element_size=2, recompute=True)
    assert moe > dense and extra == moe - shape.block_input_bytes(tokens, 2)
    stages = split_blocks(shape.blocks, 16)  # the blocks of 16 stages add up to all of them
    starts = [sum(stages[:k]) for k in range(16)]
    kept = [shape.moe_stage_activation_bytes(a, n, False, False, tokens=tokens,
                                             element_size=2)[0]
            for a, n in zip(starts, stages, strict=True)]
    assert sum(kept) == 3 * dense + (shape.blocks - 3) * moe


def test_the_published_deepseek_layout_fits_only_with_recomputation():
    """16 stages x ZeRO-1 128 (EP 64), 120 micro-batches of one 4096-token sequence: in
    BF16 without FP8 caching or recomputation it does not fit 80 GiB; recomputing does."""
    layouts = [ClusterLayout("", pp=16, dp=128, ep=64, zero=1, recompute=r) for r in (False, True)]
    totals = [per_gpu(DEEPSEEK_V3_SHAPE, x, seq=4096, microbatches=120).total / 2**30
              for x in layouts]
    assert totals[0] > 80 > totals[1]


@pytest.mark.parametrize("call, words", [
    (lambda: validate_ep(3, 8, MIXTRAL_8X7B_SHAPE), "ep=3 for 8 experts and dp=8; valid: "
     "a divisor of both (expert-parallel ranks are borrowed from the data-parallel ones): "
     "[1, 2, 4, 8]"),
    (lambda: validate_ep(8, 4, MIXTRAL_8X7B_SHAPE), "valid: a divisor of both"),
    (lambda: validate_ep(0, 8, MIXTRAL_8X7B_SHAPE), "ep=0; valid: an integer >= 1"),
    (lambda: validate_ep(2, 8, TransformerShape.of(LM)), "ep=2 splits experts, and this "
     "shape has none; valid: ep=1"),
    (lambda: estimate_transformer(MIXTRAL_8X7B_SHAPE, batch=1, seq=8, dp=4, ep=3),
     "ep=3 for 8 experts and dp=4"),
    (lambda: dataclasses.replace(MIXTRAL_8X7B_SHAPE, top_k=9), "top_k=9; valid: an integer "
     "from 1 to experts=8"),
    (lambda: dataclasses.replace(MIXTRAL_8X7B_SHAPE, top_k=0), "top_k=0; valid"),
    (lambda: dataclasses.replace(MIXTRAL_8X7B_SHAPE, experts=0), "experts=0; valid: an "
     "integer >= 1"),
    (lambda: dataclasses.replace(MIXTRAL_8X7B_SHAPE, shared=-1), "shared=-1; valid: an "
     "integer >= 0"),
    (lambda: dataclasses.replace(DEEPSEEK_V3_SHAPE, dense_blocks=61), "dense_blocks=61; "
     "valid: an integer from 0 to 60"),
    (lambda: LatentAttention(q_lora=8, kv_lora=0, qk_nope=8, qk_rope=8, v_head=8),
     "kv_lora=0; valid: an integer >= 1"),
    (lambda: ClusterLayout("", dp=8, ep=3), "ep=3 for dp=8; valid: a divisor of dp "
     "[1, 2, 4, 8]"),
    (lambda: MoETransformerShape(hidden=8, blocks=1, heads=2, ffn=8, vocab=4, top_k=1,
                                 moe_ffn=8), "missing 1 required keyword-only argument"),
])
def test_bad_moe_input_names_the_value_and_the_choices(call, words):
    with pytest.raises((ValueError, TypeError)) as error:
        call()
    assert words in str(error.value)
