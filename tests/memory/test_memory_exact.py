"""The memory predictions to the byte: weights, gradients and optimizer state per precision
and ZeRO stage, a Llama shape's parameters and activations (tensor and sequence
parallelism, recomputation, pipeline stages), the mixture-of-experts shape, the ledger's
tables and comparisons, and every refusal in its exact words.

The numbers are worked by hand for tiny shapes and written out, or counted on a real tiny
model (its parameters, its optimizer's state tensors after one step, what autograd keeps).
The tiny dense shape used throughout: hidden 4, 3 blocks, 2 heads of 2 channels, 1 key/value
head (k and v 2 wide), MLP 6, vocabulary 10. Per block: attention 2*16 + 2*4*2 = 48, MLP
3*4*6 = 72, two norms 8: 128 elements in 9 tensors; the embedding 40 (1 tensor); the final
norm and head 44 (2 tensors); 468 in all.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from helpers.expert_parallel.llama import BlockMoE
from helpers.expert_parallel.moe import MoEShape
from helpers.memory.estimate import (
    HasTransformerShape,
    LayerChain,
    estimate_layers,
    estimate_training_memory,
    estimate_transformer,
    layers_of,
)
from helpers.memory.ledger import (
    DeviceMemory,
    Ledger,
    agreement_table,
    compare_ledgers,
    comparison_table,
)
from helpers.memory.measure import measure_training_memory
from helpers.memory.moe import LatentAttention, MoETransformerShape, validate_ep
from helpers.memory.parameters import (
    parameter_memory,
    sharded_parameter_memory,
    validate_dp,
    validate_precision,
    validate_recompute,
    validate_zero,
)
from helpers.memory.transformer import LLAMA_70B_SHAPE, TransformerShape
from helpers.models.llama import LMConfig, TinyLM, build_lm

CONFIG = LMConfig(vocab=10, hidden=4, blocks=3, ffn=6, heads=2, kv_heads=1)
SHAPE = TransformerShape(hidden=4, blocks=3, heads=2, ffn=6, vocab=10, kv_heads=1)
T = 3  # tokens: one sequence of 3


def refused(call, words: str, error: type[Exception] = ValueError) -> None:
    """``call()`` raises ``error`` whose message is exactly ``words``."""
    with pytest.raises(error) as raised:
        call()
    assert raised.value.args[0] == words


def triple(row: DeviceMemory) -> tuple[int, int, int]:
    """(weights, grads, optimizer state), each a whole number of bytes."""
    cells = (row.weights, row.grads, row.optimizer_state)
    assert all(type(c) is int for c in (*cells, row.activations)), row
    return cells


def whole(*values: object) -> bool:
    """Every value (or every number in a tuple) an int: bytes and elements are counted."""
    flat = [v for x in values for v in (x if isinstance(x, tuple) else (x,))]
    return all(type(v) is int for v in flat)


# --- parameters.py: weights, grads and optimizer state -----------------------------------


def test_parameter_memory_by_precision_and_optimizer_by_hand():
    """10 elements in 3 tensors: fp32 4 B, fp64 8 B, mixed 2 + 2 B and a float32 master
    copy; momentum one copy, Adam two and a 4-byte step counter per tensor."""
    cases = {
        ("fp32", "sgd"): (40, 40, 0),
        ("fp32", "sgd_momentum"): (40, 40, 40),
        ("fp32", "adam"): (40, 40, 80 + 12),
        ("fp64", "sgd"): (80, 80, 0),
        ("fp64", "adam"): (80, 80, 160 + 12),
        ("mixed", "sgd"): (20, 20, 40),
        ("mixed", "sgd_momentum"): (20, 20, 80),
        ("mixed", "adam"): (20, 20, 120 + 12),
    }
    for (precision, optimizer), want in cases.items():
        row = parameter_memory(10, 3, optimizer=optimizer, precision=precision)
        assert (*triple(row), row.activations) == (*want, 0), (precision, optimizer)
    assert triple(parameter_memory(10, 3, optimizer="adam")) == (40, 40, 92)  # fp32 default
    with_buffers = parameter_memory(10, 3, optimizer="sgd", precision="mixed", buffers=5)
    assert triple(with_buffers) == (25, 20, 40)
    assert parameter_memory(10, 3, optimizer="sgd", buffers=7).weights == 47


@pytest.mark.parametrize("dtype, precision", [(torch.float32, "fp32"), (torch.float64, "fp64")])
@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adam"])
def test_parameter_memory_counts_a_real_optimizers_state_after_one_step(dtype, precision,
                                                                         optimizer):
    """A Linear(3, 2) and a Linear(2, 5, no bias): its tensors and torch.optim's state."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 5, bias=False)).to(dtype)
    opt = (torch.optim.Adam(model.parameters(), foreach=False) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    model(torch.randn(4, 3, dtype=dtype)).sum().backward()
    opt.step()
    params = list(model.parameters())
    state = sum(v.numel() * v.element_size() for p in params for v in opt.state[p].values()
                if isinstance(v, torch.Tensor))
    counted = (sum(p.numel() * p.element_size() for p in params),
               sum(p.grad.numel() * p.grad.element_size() for p in params), state)
    numel = sum(p.numel() for p in params)
    assert (numel, len(params)) == (18, 3)
    row = parameter_memory(numel, len(params), optimizer=optimizer, precision=precision)
    assert triple(row) == counted


def test_mixed_precision_adam_counts_a_bf16_model_with_a_float32_master_copy():
    """bf16 weights and grads, a float32 master copy that Adam updates, its two moments
    and step counters: what parameter_memory calls mixed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 5, bias=False)).to(torch.bfloat16)
    model(torch.randn(4, 3, dtype=torch.bfloat16)).sum().backward()
    master = [p.detach().float().requires_grad_() for p in model.parameters()]
    for m, p in zip(master, model.parameters(), strict=True):
        m.grad = p.grad.float()
    opt = torch.optim.Adam(master, foreach=False)
    opt.step()
    params = list(model.parameters())
    state = sum(v.numel() * v.element_size() for m in master for v in opt.state[m].values())
    state += sum(m.numel() * m.element_size() for m in master)
    counted = (sum(p.numel() * p.element_size() for p in params),
               sum(p.grad.numel() * p.grad.element_size() for p in params), state)
    assert triple(parameter_memory(18, 3, optimizer="adam", precision="mixed")) == counted


def test_zero_stages_shard_by_hand():
    """10 elements in 2 tensors over dp = 3 (a share of ceil(10 / 3) = 4), a gathered
    unit of 4 elements: stage 1 shards the state, 2 the grads too, 3 the weights too."""
    def row(zero, dp=3, precision="fp32", optimizer="adam", unit=4):
        return triple(sharded_parameter_memory(10, 2, optimizer=optimizer, precision=precision,
                                               dp=dp, zero=zero, unit=unit))

    full = (40, 40, 80 + 8)
    assert row(0) == full
    assert row(1) == (40, 40, 32 + 8)
    assert row(2) == (40, 16 + 16, 40)
    assert row(3) == (16 + 16, 32, 40)
    assert row(3, unit=0) == (16, 16, 40)
    assert [row(z, dp=1) for z in range(4)] == [full] * 4  # one rank: nothing to shard
    assert row(1, dp=2) == (40, 40, 40 + 8)  # an even split: 5 each
    assert row(3, dp=4, unit=0) == (12, 12, 24 + 8)  # ceil(10 / 4) = 3
    assert row(3, dp=10, unit=0) == (4, 4, 8 + 8)
    assert row(3, dp=20, unit=0) == (4, 4, 8 + 8)  # never less than one element
    # mixed: 2-byte weights and grads and units; the master copy is sharded with the state
    assert row(0, dp=4, precision="mixed") == (20, 20, 120 + 8)
    assert row(1, dp=4, precision="mixed", unit=3) == (20, 20, 36 + 8)
    assert row(2, dp=4, precision="mixed", unit=3) == (20, 6 + 6, 44)
    assert row(3, dp=4, precision="mixed", unit=3) == (12, 12, 44)
    assert row(3, dp=4, precision="fp64", optimizer="sgd", unit=1) == (24 + 8, 32, 0)
    assert row(2, dp=3, optimizer="sgd_momentum") == (40, 32, 16)
    defaults = sharded_parameter_memory(10, 2, optimizer="adam")
    assert triple(defaults) == full
    assert triple(sharded_parameter_memory(10, 2, optimizer="adam", dp=3)) == full
    assert triple(sharded_parameter_memory(10, 2, optimizer="adam", zero=3, unit=4)) == full


def test_the_validators_return_what_they_accept_and_refuse_in_exact_words():
    """Precision, ZeRO stage, dp and recompute, each refusal's words to the letter."""
    assert [validate_precision(p) for p in ("fp32", "fp64", "mixed")] == ["fp32", "fp64",
                                                                          "mixed"]
    assert [validate_zero(z) for z in range(4)] == [0, 1, 2, 3]
    assert (validate_dp(1), validate_dp(7)) == (1, 7)
    assert (validate_recompute(True), validate_recompute(False)) == (True, False)
    refused(lambda: validate_precision("fp16"),
            "unknown precision 'fp16'; valid choices: fp32, fp64, mixed")
    for bad in (4, -1, True, 1.0, "1"):
        refused(lambda bad=bad: validate_zero(bad),
                f"unknown zero={bad!r}; valid choices: 0, 1, 2, 3 (integers)")
    for bad in (0, -2, True, 2.0):
        refused(lambda bad=bad: validate_dp(bad),
                f"dp={bad!r}; valid: an integer >= 1 (data-parallel ranks)")
    for bad in (1, 0, "yes", None):
        refused(lambda bad=bad: validate_recompute(bad),
                f"recompute={bad!r}; valid choices: True, False")
    refused(lambda: parameter_memory(1, 1, optimizer="lamb"),
            "unknown optimizer 'lamb'; valid choices: sgd, sgd_momentum, adam")
    refused(lambda: parameter_memory(1, 1, optimizer="sgd", precision="bf16"),
            "unknown precision 'bf16'; valid choices: fp32, fp64, mixed")
    refused(lambda: sharded_parameter_memory(1, 1, optimizer="sgd", dp=2, zero=4),
            "unknown zero=4; valid choices: 0, 1, 2, 3 (integers)")
    refused(lambda: sharded_parameter_memory(1, 1, optimizer="sgd", dp=0, zero=1),
            "dp=0; valid: an integer >= 1 (data-parallel ranks)")
    refused(lambda: sharded_parameter_memory(1, 1, optimizer="sgd", dp=0),
            "dp=0; valid: an integer >= 1 (data-parallel ranks)")


# --- transformer.py: a Llama shape's parameters and activations --------------------------


def test_the_tiny_shape_counts_by_hand_and_as_a_real_model_counts():
    """Elements and tensors per unit and per pipeline stage, and the real TinyLM's."""
    assert (SHAPE.kv, SHAPE.kv_width) == (1, 2)
    assert SHAPE.attention_parameters() == (48, 4)
    assert SHAPE.block_parameters() == (128, 9)
    assert SHAPE.embed_parameters() == (40, 1)
    assert SHAPE.head_parameters() == (44, 2)
    assert SHAPE.unit_parameters() == (40, 128, 44)
    assert SHAPE.parameters() == 468
    assert SHAPE.stage_parameters(3, True, True) == (468, 30, 128)
    assert SHAPE.stage_parameters(2, True, False) == (296, 19, 128)
    assert SHAPE.stage_parameters(1, False, True) == (172, 11, 128)
    assert SHAPE.stage_parameters(1, False, False) == (128, 9, 128)
    wide = dataclasses.replace(SHAPE, vocab=100)  # embedding 400, head 404: larger units
    assert wide.stage_parameters(1, True, False) == (528, 10, 400)
    assert wide.stage_parameters(1, False, True) == (532, 11, 404)
    assert wide.stage_parameters(1, True, True) == (932, 12, 404)
    tied = dataclasses.replace(SHAPE, tied=True)
    assert (tied.head_parameters(), tied.parameters()) == ((4, 1), 428)
    mha = dataclasses.replace(SHAPE, kv_heads=None)
    assert (mha.kv, mha.kv_width, mha.attention_parameters()) == (2, 4, (64, 4))
    model = TinyLM(CONFIG)
    params = list(model.parameters())
    assert (sum(p.numel() for p in params), len(params)) == (468, 30)
    block = list(model.blocks[0].parameters())
    assert (sum(p.numel() for p in block), len(block)) == SHAPE.block_parameters()
    attn = list(model.blocks[0].attn.parameters())
    assert (sum(p.numel() for p in attn), len(attn)) == SHAPE.attention_parameters()
    tied_model = TinyLM(dataclasses.replace(CONFIG, tied=True))
    assert sum(p.numel() for p in tied_model.parameters()) == 428
    assert LLAMA_70B_SHAPE.parameters() == 68_976_648_192  # Llama 2 70B, as published
    assert whole(SHAPE.kv_width, SHAPE.attention_parameters(), SHAPE.stage_parameters(1, 1, 1),
                 mha.kv_width, mha.attention_parameters(), tied.parameters())


def test_a_shape_is_read_from_a_config_with_or_without_the_optional_fields():
    """``of`` reads kv_heads and tied when present, and defaults them when absent."""
    assert TransformerShape.of(CONFIG) == SHAPE
    tied = TransformerShape.of(dataclasses.replace(CONFIG, tied=True, kv_heads=None))
    assert (tied.kv_heads, tied.tied) == (None, True)
    bare = TransformerShape.of(SimpleNamespace(hidden=4, blocks=3, heads=2, ffn=6, vocab=10))
    assert bare == TransformerShape(4, 3, 2, 6, 10) and (bare.kv_heads, bare.tied) == (None, False)


@pytest.mark.parametrize("sizes", [
    dict(hidden=0), dict(blocks=0), dict(heads=0), dict(ffn=0), dict(vocab=0),
    dict(kv_heads=-1), dict(heads=3), dict(kv_heads=3, hidden=6, heads=2),
    dict(heads=4, kv_heads=3),
])
def test_a_bad_shape_is_refused_in_exact_words(sizes):
    """Any size below 1, hidden not a multiple of heads, heads not one of kv_heads."""
    args = {**dict(hidden=4, blocks=3, heads=2, ffn=6, vocab=10, kv_heads=1), **sizes}
    shown = (f"TransformerShape(hidden={args['hidden']}, blocks={args['blocks']}, "
             f"heads={args['heads']}, ffn={args['ffn']}, vocab={args['vocab']}, "
             f"kv_heads={args['kv_heads']}, tied=False)")
    refused(lambda: TransformerShape(**args),
            f"cannot estimate {shown}; valid: positive sizes, hidden a multiple of heads, "
            "heads a multiple of kv_heads")


def test_the_smallest_valid_shape_is_accepted():
    """Sizes of exactly 1 are valid; kv_heads equal to heads too."""
    one = TransformerShape(hidden=1, blocks=1, heads=1, ffn=1, vocab=1, kv_heads=1)
    assert one.parameters() == 4 + 3 + 2 + 1 + 2  # q k v o, MLP, norms, embedding, head
    assert TransformerShape(hidden=4, blocks=1, heads=2, ffn=1, vocab=1, kv_heads=2).kv == 2


def test_block_activations_by_hand():
    """3 tokens. Per token, fp32: 6 + 4 + 1... elements: split q 4, output 4, k 2, v 2, the
    MLP's 4 x 6 = 36; replicated 6 x 4 = 24; 2 heads' log-sum-exp and 2 norm rows, 4 B
    each: 3 x (60 x 4 + 8) + 3 x 8 = 768."""
    b = SHAPE.block_activation_bytes
    assert b(T, 4) == 768
    assert b(T, 2) == 3 * (60 * 2 + 8) + 24  # statistics stay float32: 408
    assert b(T, 8) == 3 * (60 * 8 + 16) + 48  # float64 statistics: 1536
    assert b(T, 4, 2) == 3 * ((18 + 24) * 4 + 4) + 24  # 540
    assert b(T, 4, 2, True) == 3 * ((18 + 8 + 8) * 4 + 4) + 12  # 432
    assert b(T, 4, 1, True) == 768  # one rank: nothing to split
    # tp = 3 (uneven): split 36 // 3 = 12, the heads' 8 B // 3 = 2, 16 // 3 = 5 of the four
    assert b(T, 4, 3) == 3 * ((12 + 24) * 4 + 2) + 24  # 462
    assert b(T, 4, 3, True) == 3 * ((12 + 5 + 8) * 4 + 2) + 8  # 314
    assert b(5, 4, 3, True) == 5 * ((12 + 5 + 8) * 4 + 2) + 13  # 40 // 3
    assert SHAPE.block_input_bytes(T, 4) == 48
    assert SHAPE.block_input_bytes(T, 4, 2) == 48  # replicated
    assert SHAPE.block_input_bytes(T, 4, 2, True) == 24
    assert SHAPE.block_input_bytes(T, 4, 5, True) == 9  # 48 // 5
    assert SHAPE.block_input_bytes(T, 2, 1, True) == 24
    assert whole(b(T, 4, 3), b(T, 4, 3, True), b(5, 4, 3, True), b(T, 4, 2, True), b(T, 2),
                 SHAPE.block_input_bytes(T, 4, 5, True), SHAPE.block_input_bytes(T, 4, 2, True))


def test_embedding_and_head_activations_by_hand():
    """Ids 8 B a token (9 with the vocab-parallel mask); the final norm's input, normalised
    value and rstd, the head's input, and the loss's log-probabilities, labels and number."""
    e = SHAPE.embed_activation_bytes
    assert (e(T), e(T, 2), e(T, 2, False), e(T, 1, True), e(5, 4)) == (24, 27, 24, 27, 45)
    h = SHAPE.head_activation_bytes
    assert h(T, 4) == 3 * (32 + 4) + 48 + 3 * (40 + 8) + 4  # 304
    assert h(T, 8) == 3 * (64 + 8) + 96 + 3 * (80 + 8) + 8  # 584
    assert h(T, 2) == 3 * (16 + 4) + 24 + 3 * (20 + 8) + 4  # 172
    # vocab-parallel over 3: ceil(10 / 3) = 4 columns, the labels and a one-byte mask
    assert h(T, 4, 3) == 108 + 48 + 3 * (16 + 9)  # 231
    assert h(T, 4, 3, True) == 36 + 48 + 75  # the norm's share of the tokens: 159
    assert h(T, 4, 3, True, False) == 36 + 48 + 148
    assert h(T, 4, 1, False, True) == 108 + 48 + 3 * (40 + 9)
    assert h(T, 4, 2) == 108 + 48 + 3 * (20 + 9)
    assert h(2, 4, 4, True) == 2 * 36 // 4 + 32 + 2 * (12 + 9)  # 18 + 32 + 42
    assert whole(h(T, 4, 3), h(T, 4, 3, True), h(2, 4, 4, True), h(T, 4), e(T, 2), e(T))


def test_stage_activations_with_and_without_recomputation_by_hand():
    """A block 768 B, its input 48, the embedding 24, the head 304 (3 tokens, fp32)."""
    s = SHAPE.stage_activation_bytes
    assert s(3, True, True, tokens=T, element_size=4) == (24 + 3 * 768 + 304, 0)
    assert s(2, True, False, tokens=T, element_size=4) == (24 + 2 * 768, 0)
    assert s(1, False, True, tokens=T, element_size=4) == (768 + 304, 0)
    assert s(1, False, False, tokens=T, element_size=4) == (768, 0)
    assert s(3, True, True, tokens=T, element_size=4, recompute=True) == (24 + 144 + 304, 416)
    assert s(2, True, False, tokens=T, element_size=4, recompute=True) == (24 + 96, 720)
    assert s(1, False, True, tokens=T, element_size=4, recompute=True) == (48 + 304, 416)
    assert s(1, False, False, tokens=T, element_size=4, tp=2, seq_parallel=True,
             recompute=True) == (24, 432 - 24)
    assert s(1, True, False, tokens=T, element_size=4, tp=2) == (27 + 540, 0)
    assert s(1, False, True, tokens=T, element_size=4, tp=3, seq_parallel=True) == (314 + 159,
                                                                                    0)
    big_head = dataclasses.replace(SHAPE, vocab=1000)  # the head outweighs a block: no extra
    assert big_head.stage_activation_bytes(1, False, True, tokens=T, element_size=4,
                                           recompute=True)[1] == 0


@pytest.mark.parametrize("precision, dtype", [("fp32", torch.float32), ("fp64", torch.float64)])
def test_a_real_tiny_llamas_step_is_the_estimate_to_the_byte(precision, dtype):
    """One Adam step of the tiny shape's TinyLM on 3 tokens: every cell, activations too."""
    model = build_lm(CONFIG).to(dtype)
    ids = torch.tensor([[1, 7, 3]])
    measured = measure_training_memory(model, ids, torch.tensor([[7, 3, 9]]), optimizer="adam")
    predicted = estimate_training_memory(model, batch=1, seq=3, optimizer="adam",
                                         precision=precision, names=["cpu"])
    assert measured.as_dict()["cpu"] == predicted.as_dict()["cpu"]
    e = 4 if precision == "fp32" else 8
    assert triple(predicted["cpu"]) == (468 * e, 468 * e, 2 * 468 * e + 30 * 4)
    assert predicted["cpu"].activations == {4: 2632, 8: 5216}[e]  # 24 + 3 blocks + head


def test_a_tied_heads_step_counts_one_step_counter_for_norm_and_head():
    """A tied head is one tensor (the final norm; the head is the embedding's weight): Adam
    keeps one 4-byte step counter per tensor, so a tied model's state is the estimate's."""
    config = LMConfig(vocab=10, hidden=4, blocks=1, ffn=6, heads=2, kv_heads=1, tied=True)
    model = build_lm(config)
    tensors = len(list(model.parameters()))
    measured = measure_training_memory(model, torch.tensor([[1, 7, 3]]),
                                       torch.tensor([[7, 3, 9]]), optimizer="adam")
    predicted = estimate_training_memory(model, batch=1, seq=3, optimizer="adam",
                                         precision="fp32", names=["cpu"])
    assert measured.as_dict()["cpu"] == predicted.as_dict()["cpu"]
    weights = sum(p.numel() for p in model.parameters())
    assert predicted["cpu"].optimizer_state == 2 * 4 * weights + 4 * tensors


# --- estimate.py: the ledgers ------------------------------------------------------------


def test_a_two_stage_transformer_estimate_by_hand():
    """Stages [2, 1], two micro-batches in flight on the first: weights as counted above,
    Adam's state two copies and the step counters, activations times the micro-batches."""
    ledger = estimate_transformer(SHAPE, batch=1, seq=3, stages=[2, 1], in_flight=[2, 1])
    assert list(ledger.rows) == ["stage 0", "stage 1"]
    assert ledger["stage 0"] == DeviceMemory(1184, 1184, 2368 + 76, 2 * (24 + 2 * 768))
    assert ledger["stage 1"] == DeviceMemory(688, 688, 1376 + 44, 768 + 304)
    assert ledger.note == "estimated, fp32 adam, tp=1, batch 1x3"
    recomputed = estimate_transformer(SHAPE, batch=1, seq=3, stages=[2, 1], in_flight=[2, 1],
                                      recompute=True, names=["a", "b"], optimizer="sgd")
    assert list(recomputed.rows) == ["a", "b"]
    assert recomputed["a"] == DeviceMemory(1184, 1184, 0, 2 * 120 + 720)  # extra once
    assert recomputed["b"] == DeviceMemory(688, 688, 0, 352 + 416)
    assert recomputed.note == "estimated, fp32 sgd, tp=1, recompute, batch 1x3"
    single = estimate_transformer(SHAPE, batch=1, seq=3)
    assert list(single.rows) == ["stage 0"]
    assert single["stage 0"] == DeviceMemory(1872, 1872, 3744 + 120, 2632)
    three = estimate_transformer(SHAPE, batch=1, seq=3, stages=[1, 1, 1])
    assert [r.activations for r in three.rows.values()] == [24 + 768, 768, 768 + 304]
    for led in (ledger, recomputed, single, three):
        for row in led.rows.values():
            triple(row)


def test_tensor_data_and_context_parallel_estimates_by_hand():
    """tp = 2 halves the elements and the gathered unit (128 // 2 = 64); ZeRO-3 over dp = 2
    keeps ceil(234 / 2) = 117 of each kind plus that unit; cp = 2 halves the tokens."""
    ledger = estimate_transformer(SHAPE, batch=1, seq=3, precision="mixed", tp=2, dp=2, zero=3)
    blocks, embed, head = 3 * (3 * 88 + 24), 27, 60 + 24 + 3 * (5 * 2 + 9)
    assert ledger["stage 0"] == DeviceMemory(234 + 128, 234 + 128, 12 * 117 + 120,
                                             blocks + embed + head)
    assert ledger.note == "estimated, mixed adam, tp=2, dp=2, ZeRO-3, batch 1x3"
    cp = estimate_transformer(SHAPE, batch=1, seq=6, cp=2)
    assert cp["stage 0"] == estimate_transformer(SHAPE, batch=1, seq=3)["stage 0"]
    assert cp.note == "estimated, fp32 adam, tp=1, cp=2, batch 1x6"
    tp3 = estimate_transformer(SHAPE, batch=1, seq=3, tp=3, optimizer="sgd")["stage 0"]
    assert tp3 == DeviceMemory(624, 624, 0, 3 * 462 + 27 + 231)  # 468 // 3 = 156 elements
    sp = estimate_transformer(SHAPE, batch=1, seq=3, tp=3, optimizer="sgd",
                              sequence_parallel=True)
    assert sp["stage 0"].activations == 3 * 314 + 27 + 159
    assert sp.note == "estimated, fp32 sgd, tp=3, sequence parallel, batch 1x3"
    z1 = estimate_transformer(SHAPE, batch=2, seq=3, dp=1, zero=1, optimizer="sgd")
    assert z1.note == "estimated, fp32 sgd, tp=1, dp=1, ZeRO-1, batch 2x3"
    z0 = estimate_transformer(SHAPE, batch=2, seq=3, dp=4, optimizer="sgd")
    assert z0.note == "estimated, fp32 sgd, tp=1, dp=4, ZeRO-0, batch 2x3"
    assert z0["stage 0"] == z1["stage 0"]  # nothing sharded
    assert z0["stage 0"].activations == 2 * 2632 - 4  # twice, but the loss's one number
    staged = estimate_transformer(SHAPE, batch=1, seq=3, stages=[2, 1], dp=2, zero=3,
                                  optimizer="sgd")
    assert triple(staged["stage 0"]) == (4 * 148 + 4 * 128, 4 * 148 + 4 * 128, 0)
    assert triple(staged["stage 1"]) == (4 * 86 + 4 * 128, 4 * 86 + 4 * 128, 0)
    for row in (ledger["stage 0"], tp3, sp["stage 0"], cp["stage 0"]):
        triple(row)


def test_the_transformer_estimate_refuses_in_exact_words():
    """cp, stages, in_flight, and the validators it calls, each refusal to the letter."""
    e = estimate_transformer
    refused(lambda: e(SHAPE, batch=1, seq=8, cp=3),
            "cp=3; valid: an integer >= 1 that divides seq=8")
    refused(lambda: e(SHAPE, batch=1, seq=8, cp=0),
            "cp=0; valid: an integer >= 1 that divides seq=8")
    refused(lambda: e(SHAPE, batch=1, seq=8, cp=2.0),
            "cp=2.0; valid: an integer >= 1 that divides seq=8")
    refused(lambda: e(SHAPE, batch=1, seq=8, stages=[1, 1]),
            "stages [1, 1] must be >= 1 each and add up to 3 blocks")
    refused(lambda: e(SHAPE, batch=1, seq=8, stages=[3, 0]),
            "stages [3, 0] must be >= 1 each and add up to 3 blocks")
    refused(lambda: e(SHAPE, batch=1, seq=8, stages=[2, 1], in_flight=[1]),
            "in_flight [1]: valid: one count per stage (2)")
    refused(lambda: e(SHAPE, batch=1, seq=8, precision="bf16"),
            "unknown precision 'bf16'; valid choices: fp32, fp64, mixed")
    refused(lambda: e(SHAPE, batch=1, seq=8, recompute=1),
            "recompute=1; valid choices: True, False")
    refused(lambda: e(SHAPE, batch=1, seq=8, dp=0),
            "dp=0; valid: an integer >= 1 (data-parallel ranks)")
    refused(lambda: e(SHAPE, batch=1, seq=8, zero=5),
            "unknown zero=5; valid choices: 0, 1, 2, 3 (integers)")
    refused(lambda: e(SHAPE, batch=1, seq=8, ep=2),
            "ep=2 splits experts, and this shape has none; valid: ep=1, or a "
            "MoETransformerShape")
    assert e(SHAPE, batch=1, seq=8, cp=8)["stage 0"].activations == 768 + 8 + 104  # 1 token
    assert e(SHAPE, batch=1, seq=3, cp=1, ep=1, stages=[3], in_flight=[1]).note == \
        "estimated, fp32 adam, tp=1, batch 1x3"


def test_estimate_layers_counts_parameters_once_and_buffers_as_weights():
    """A 1x1 Conv2d(2, 2) (6 parameters in 2 tensors) on both sides of a cut, and a
    BatchNorm2d(2) (4 in 2, buffers: running mean and variance 8 + 8, the int64 count 8):
    a part counts a layer it uses twice once; default names, one per part."""
    conv, norm = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)
    ledger = estimate_layers([conv, norm, conv, conv], (2, 1, 1), batch=2, split_points=[1],
                             optimizer="adam")
    assert list(ledger.rows) == ["part 0", "part 1"]
    assert triple(ledger["part 0"]) == (24, 24, 48 + 8)
    assert triple(ledger["part 1"]) == (40 + 24, 40, 80 + 16)
    assert ledger.note == "estimated from shapes, optimizer adam"
    lin = nn.Linear(2, 2)
    one = estimate_layers([lin, nn.ReLU(), lin], (2,), batch=1, names=["all"])
    assert list(one.rows) == ["all"] and triple(one["all"]) == (24, 24, 0)
    assert one.note == "estimated from shapes, optimizer sgd"


def test_estimate_layers_refuses_in_exact_words():
    """The batch, the names, the optimizer."""
    lin = nn.Linear(3, 2)
    for bad in (0, -1, 2.0, False):
        refused(lambda bad=bad: estimate_layers([lin], (3,), batch=bad),
                f"batch={bad!r}; valid: an integer >= 1")
    refused(lambda: estimate_layers([lin, lin], (3,), batch=1, split_points=[1], names=["a"]),
            "1 names for 2 parts; valid: one per part")
    refused(lambda: estimate_layers([lin], (3,), batch=1, names=["a", "b"]),
            "2 names for 1 parts; valid: one per part")
    refused(lambda: estimate_layers([lin], (3,), batch=1, optimizer="lamb"),
            "unknown optimizer 'lamb'; valid choices: sgd, sgd_momentum, adam")
    assert list(estimate_layers([lin], (3,), batch=1, names=[]).rows) == ["part 0"]


class Shaped:
    """Not a module: a model that says only its transformer shape."""

    def transformer_shape(self) -> TransformerShape:
        return SHAPE


def test_estimate_training_memory_dispatches_and_refuses_in_exact_words():
    """A shape or a model with transformer_shape() goes to the transformer estimate with
    its options; a chain of layers to the layer rules, fp32 and no options."""
    assert isinstance(Shaped(), HasTransformerShape) and not isinstance(Shaped(), LayerChain)
    by_model = estimate_training_memory(Shaped(), batch=1, seq=3, optimizer="adam",
                                        precision="mixed", names=["gpu"], tp=2)
    by_shape = estimate_transformer(SHAPE, batch=1, seq=3, precision="mixed", tp=2,
                                    names=["gpu"])
    assert by_model.as_dict() == by_shape.as_dict() and by_model.note == by_shape.note
    assert estimate_training_memory(SHAPE, batch=1, seq=3).note == \
        "estimated, fp32 sgd, tp=1, batch 1x3"  # the default optimizer here is SGD
    refused(lambda: estimate_training_memory(SHAPE, batch=1),
            "a transformer estimate needs seq= (tokens per sequence)")
    refused(lambda: estimate_training_memory(Shaped(), batch=1, tp=2),
            "a transformer estimate needs seq= (tokens per sequence)")
    lin = nn.Linear(3, 2)
    chain = estimate_training_memory([lin], batch=2, sample_shape=(3,), optimizer="adam",
                                     names=["x"])
    assert chain.as_dict() == estimate_layers([lin], (3,), batch=2, optimizer="adam",
                                              names=["x"]).as_dict()
    mse = estimate_training_memory([lin], batch=2, sample_shape=(3,))["part 0"]
    ce = estimate_training_memory([lin], batch=2, sample_shape=(3,), loss="cross_entropy")
    assert mse.activations != ce["part 0"].activations
    refused(lambda: estimate_training_memory([lin], batch=2, sample_shape=(3,),
                                             precision="mixed"),
            "precision='mixed' and [] apply to transformer shapes only; valid for a chain of "
            "layers: fp32, no options")
    refused(lambda: estimate_training_memory([lin], batch=2, sample_shape=(3,), tp=2, dp=1),
            "precision='fp32' and ['dp', 'tp'] apply to transformer shapes only; valid for a "
            "chain of layers: fp32, no options")
    refused(lambda: estimate_training_memory([lin], batch=2, sample_shape=(3,),
                                             precision="fp16"),
            "unknown precision 'fp16'; valid choices: fp32, fp64, mixed")
    refused(lambda: estimate_training_memory([lin], batch=2),
            "a chain of layers needs sample_shape= (one input, without the batch)")


def test_layers_of_reads_sequences_lists_and_pairs_and_refuses_the_rest():
    """A Sequential, a tuple of modules, a list mixing modules and (name, module) pairs."""
    a, b = nn.Linear(2, 2), nn.ReLU()
    assert layers_of(nn.Sequential(a, b)) == ([a, b], [])
    assert layers_of((a, b)) == ([a, b], [])
    assert layers_of([("first", a), b]) == ([a, b], [])
    words = ("cannot estimate a {}: the estimator reads no model it is not told how to read; "
             "valid: a model with a layer_chain() method (the LayerChain protocol of "
             "helpers.memory), an nn.Sequential, or the list of its layers in forward order; "
             "for a transformer, a TransformerShape or a model with transformer_shape()")
    for bad, name in (([], "list"), ((), "tuple"), (a, "Linear"), ({"a": a}, "dict")):
        refused(lambda bad=bad: layers_of(bad), words.format(name))


# --- ledger.py: the tables and the comparisons -------------------------------------------


LEDGER = Ledger({"dev0": DeviceMemory(4096, 2048, 3 * 2**20, 512),
                 "gpu1": DeviceMemory(8, 0, 0, 2**30 + 2**29)}, note="hand")


def test_ledger_rows_sums_and_dicts():
    """Totals leave the CUDA peak out; a missing row names the rows; the dict round-trips."""
    row = DeviceMemory(1, 2, 3, 4, peak_allocated=100)
    assert row.total == 10 and DeviceMemory().total == 0
    assert Ledger({"a": row, "b": DeviceMemory(10, 20, 30, 40, 7)}).sum() == \
        DeviceMemory(11, 22, 33, 44, None)
    refused(lambda: LEDGER["gpu0"], "no row 'gpu0' in this ledger; valid: ['dev0', 'gpu1']",
            KeyError)
    data = LEDGER.as_dict()
    assert data["dev0"] == {"weights": 4096, "grads": 2048, "optimizer_state": 3 * 2**20,
                            "activations": 512, "peak_allocated": None,
                            "total": 4096 + 2048 + 3 * 2**20 + 512}
    back = Ledger.from_dict(data, note="again")
    assert back.rows == LEDGER.rows and back.note == "again"
    assert Ledger.from_dict(data).note == ""
    partial = Ledger.from_dict({"x": {"grads": 5, "weights": None, "total": 99,
                                      "peak_allocated": 12}})
    assert partial["x"] == DeviceMemory(0, 5, 0, 0, 12) and partial["x"].total == 5
    assert Ledger().rows == {} and Ledger().note == ""


def test_ledgers_match_cell_by_cell_in_row_order_ignoring_the_peak():
    """Every kind, the names and their order; the CUDA peak does not count."""
    same = Ledger({n: dataclasses.replace(r, peak_allocated=5) for n, r in LEDGER.rows.items()})
    assert LEDGER.matches(same) and same.matches(LEDGER)
    for kind in ("weights", "grads", "optimizer_state", "activations"):
        off = Ledger({**LEDGER.rows, "gpu1": dataclasses.replace(LEDGER["gpu1"],
                                                                  **{kind: 1})})
        assert not LEDGER.matches(off) and not off.matches(LEDGER), kind
    swapped = Ledger({"gpu1": LEDGER["gpu1"], "dev0": LEDGER["dev0"]})
    assert not LEDGER.matches(swapped)
    assert not LEDGER.matches(Ledger({"dev0": LEDGER["dev0"]}))


def test_the_ledger_table_to_the_letter(capsys):
    """Aligned columns 13 wide, the name column at least 6; a CUDA peak column only when a
    row has one ('-' where a row has none)."""
    assert LEDGER.table("Memory").splitlines() == [
        "Memory",
        "            weights        grads    optimizer  activations        total",
        "dev0       4.00 KiB     2.00 KiB     3.00 MiB        512 B     3.01 MiB",
        "gpu1            8 B          0 B          0 B     1.50 GiB     1.50 GiB",
    ]
    LEDGER.print("x")
    assert capsys.readouterr().out == LEDGER.table("x") + "\n"
    LEDGER.print()
    assert capsys.readouterr().out.splitlines()[0] == " " * 6 + " " * 6 + "weights" + \
        "        grads    optimizer  activations        total"
    long = Ledger({"a stage name": DeviceMemory(1, 0, 0, 0, peak_allocated=2048),
                   "b": DeviceMemory(0, 0, 0, 0, peak_allocated=0)})
    assert long.table() == "\n".join([
        " " * 12 + "      weights        grads    optimizer  activations        total"
        "    CUDA peak",
        "a stage name          1 B          0 B          0 B          0 B          1 B"
        "     2.00 KiB",
        "b                     0 B          0 B          0 B          0 B          0 B"
        "            -",
    ])


def test_compare_ledgers_gives_each_cell_and_its_ratio():
    """estimate / measured; 1 where both are 0, infinity where only the measure is 0."""
    measured = Ledger({"r": DeviceMemory(4, 0, 0, 8)})
    estimated = Ledger({"r": DeviceMemory(2, 0, 3, 10)})
    assert compare_ledgers(measured, estimated) == [
        {"row": "r", "kind": "weights", "measured": 4, "estimated": 2, "ratio": 0.5},
        {"row": "r", "kind": "grads", "measured": 0, "estimated": 0, "ratio": 1.0},
        {"row": "r", "kind": "optimizer_state", "measured": 0, "estimated": 3,
         "ratio": float("inf")},
        {"row": "r", "kind": "activations", "measured": 8, "estimated": 10, "ratio": 1.25},
    ]
    assert comparison_table(measured, estimated).splitlines() == [
        "                      measured   estimated  est/meas",
        "r weights                  4 B         2 B     0.500",
        "r grads                    0 B         0 B     1.000",
        "r optimizer_state          0 B         3 B       inf",
        "r activations              8 B        10 B     1.250",
    ]
    two = Ledger({"stage 0": DeviceMemory(2048, 0, 0, 0), "s1": DeviceMemory()})
    lines = comparison_table(two, two).splitlines()
    assert lines[0] == " " * 8 + " " * 16 + "    measured   estimated  est/meas"
    assert lines[1] == "stage 0 weights             2.00 KiB    2.00 KiB     1.000"
    assert lines[5] == "s1      weights                  0 B         0 B     1.000"
    words = ("the ledgers have different rows: ['r'] vs ['s']; estimate with the same parts as "
             "measured")
    refused(lambda: compare_ledgers(measured, Ledger({"s": DeviceMemory()})), words)
    refused(lambda: comparison_table(measured, Ledger({"s": DeviceMemory()})), words)
    refused(lambda: agreement_table(measured, Ledger({"s": DeviceMemory()})), words)


def test_the_agreement_table_to_the_letter():
    """Columns 15 wide, a mark per cell, then the predictions that differ, one a line."""
    measured = Ledger({"dev0": DeviceMemory(4096, 8, 0, 2),
                       "a long name": DeviceMemory(1, 1, 1, 1)})
    predicted = Ledger({"dev0": DeviceMemory(4096, 9, 0, 2),
                        "a long name": DeviceMemory(1, 1, 1, 1)})
    assert agreement_table(measured, predicted, "title").splitlines() == [
        "title",
        " " * 11 + "        weights          grads      optimizer    activations          total",
        "dev0" + " " * 12 + "4.00 KiB ✓          8 B ✗          0 B ✓          2 B ✓"
        "     4.01 KiB ✗",
        "a long name" + "          1 B ✓" * 4 + "          4 B ✓",
        "  dev0 grads: predicted 9 B",
        "  dev0 total: predicted 4.01 KiB",
    ]
    short = agreement_table(Ledger({"a": DeviceMemory()}), Ledger({"a": DeviceMemory()}))
    assert short.splitlines() == [
        " " * 6 + "        weights          grads      optimizer    activations          total",
        "a     " + "          0 B ✓" * 5,
    ]


# --- moe.py: experts, shared experts, latent attention ----------------------------------

# The tiny MoE shape: the tiny dense shape's first block dense, its others of 4 experts of
# width 3 (3*4*3 = 36 each), top 2, one shared expert of width 5 (60), a router of 4 x 4;
# an MoE block's replicated part 48 + 8 + 16 + 60 = 132 in 4 + 3 + 3 = 10 tensors.
MOE = MoETransformerShape(hidden=4, blocks=3, heads=2, ffn=6, vocab=10, kv_heads=1,
                          experts=4, top_k=2, moe_ffn=3, shared=1, shared_ffn=5,
                          dense_blocks=1, router_bias=True)
MLA = LatentAttention(q_lora=3, kv_lora=2, qk_nope=1, qk_rope=1, v_head=3)


def test_the_moe_shape_counts_by_hand():
    """Experts, the replicated part, all weights and those one token uses."""
    assert (MOE.shared_width, MOE.moe_blocks) == (5, 2)
    assert MOE.expert_parameters() == 36
    assert MOE.moe_block_parameters() == (132, 10)
    assert MOE.block_parameters() == (128, 9)  # the dense block's
    assert MOE.parameters() == 40 + 44 + 128 + 2 * (132 + 4 * 36)  # 764
    assert MOE.active_parameters() == 40 + 44 + 128 + 2 * (132 + 2 * 36)  # 620
    assert [MOE.is_moe(k) for k in range(3)] == [False, True, True]
    plain = dataclasses.replace(MOE, shared=0, shared_ffn=None, dense_blocks=0)
    assert (plain.shared_width, plain.moe_blocks) == (3, 3)
    assert plain.moe_block_parameters() == (72, 7)
    two = dataclasses.replace(MOE, shared=2, shared_ffn=None)
    assert two.moe_block_parameters() == (48 + 8 + 16 + 2 * 36, 4 + 3 + 6)


def test_the_moe_shape_counts_a_real_model_with_a_dense_block_first():
    """A TinyLM whose last two blocks are MoE layers (the first keeps its MLP): parameters,
    tensors, and the routers' bias buffers."""
    lm = LMConfig(vocab=10, hidden=4, blocks=3, ffn=6, heads=2, kv_heads=1)
    moe = MoEShape(hidden=4, ffn=3, experts=4, top_k=2, shared=True)
    torch.manual_seed(0)
    model = TinyLM(lm)
    for block in model.blocks[1:]:
        block.mlp = BlockMoE(moe)
    shape = dataclasses.replace(MOE, shared_ffn=None)
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    assert (numel, len(params)) == (40 + 128 + 2 * (108 + 144) + 44, 1 + 9 + 2 * 22 + 2)
    assert shape.parameters() == numel == 716
    block = list(model.blocks[1].parameters())
    assert (sum(p.numel() for p in block), len(block)) == (108 + 144, 22)
    assert shape.moe_block_parameters() == (108, 10)  # the experts' 12 tensors apart
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    row = shape.stage_memory(0, 3, True, True, optimizer="adam", precision="fp32")
    assert triple(row) == (4 * numel + buffers, 4 * numel, 8 * numel + 4 * len(params))
    assert buffers == 2 * 4 * 4


def test_latent_attention_by_hand():
    """q: 4 x 3 down, its norm 3, 3 x 2 x 2 up; kv: 4 x (2 + 1) down, norm 2, 2 x 2 x 4 up;
    o: 2 x 3 x 4."""
    assert MLA.parameters(4, 2) == (27 + 30 + 24, 7)
    straight = dataclasses.replace(MLA, q_lora=0)
    assert straight.parameters(4, 2) == (16 + 30 + 24, 4)
    assert MLA.split(2) == 2 * 2 * 2 + 2 * 2 * 3 and MLA.split(3) == 30
    assert MLA.latents() == (9 + 7, 2) and straight.latents() == (7, 1)
    assert whole(MLA.parameters(4, 2), straight.parameters(4, 2), MLA.latents(), MLA.split(2),
                 straight.latents())
    shape = MoETransformerShape(hidden=4, blocks=2, heads=2, ffn=6, vocab=10, experts=4,
                                top_k=1, moe_ffn=3, attention=MLA)
    assert shape.attention_parameters() == (81, 7)
    assert shape.moe_block_parameters() == (81 + 8 + 16, 10)
    # activations: q, k, v, output 20, the latents 16 (2 norm rows), 6 x 4 replicated
    assert shape._block_bytes(T, 4, 1, False, 0) == 3 * ((20 + 24 + 16) * 4 + 8) + 24 + 24
    assert shape.block_activation_bytes(T, 4, 2, True) == \
        3 * ((22 + 16 + 16) * 4 + 4) + 12 + 24  # the MLP split, the latents whole
    refused(lambda: LatentAttention(q_lora=-1, kv_lora=1, qk_nope=1, qk_rope=1, v_head=1),
            "q_lora=-1; valid: an integer >= 0")
    for name in ("kv_lora", "qk_nope", "qk_rope", "v_head"):
        args = {**dict(q_lora=1, kv_lora=1, qk_nope=1, qk_rope=1, v_head=1), name: 0}
        refused(lambda args=args: LatentAttention(**args), f"{name}=0; valid: an integer >= 1")
    refused(lambda: LatentAttention(q_lora=True, kv_lora=1, qk_nope=1, qk_rope=1, v_head=1),
            "q_lora=True; valid: an integer >= 0")
    refused(lambda: LatentAttention(q_lora=0, kv_lora=1.0, qk_nope=1, qk_rope=1, v_head=1),
            "kv_lora=1.0; valid: an integer >= 1")


def test_moe_stage_memory_by_hand():
    """Weights, grads, Adam's state on one rank: the replicated part sharded over dp, the
    experts over dp / ep, the gathered unit (a block with its experts), the router biases."""
    m = MOE.stage_memory
    # one device, everything: 476 replicated in 32 tensors, 2 x 144 experts in 24, biases 32
    assert triple(m(0, 3, True, True, optimizer="adam", precision="fp32")) == \
        (1904 + 1152 + 32, 1904 + 1152, 3808 + 128 + 2304 + 96)
    first = m(0, 1, True, False, optimizer="adam", precision="fp32")  # the dense block only
    assert triple(first) == (4 * 168, 4 * 168, 8 * 168 + 40)
    last = m(2, 1, False, True, optimizer="adam", precision="fp32")
    assert triple(last) == (4 * 176 + 576 + 16, 4 * 176 + 576, 8 * 176 + 48 + 1152 + 48)
    # dp 4, ep 2, ZeRO-3: 2 experts a block (72 each), ceil(344 / 4) = 86 of the rest,
    # 144 / 2 = 72 of the experts; the largest unit gathered: 132 + 72 = 204
    z3 = m(1, 2, False, True, optimizer="adam", precision="fp32", dp=4, ep=2, zero=3)
    rest = 2 * 132 + 44  # 308 in 2 x 10 + 2 tensors: 77 a rank
    assert triple(z3) == (4 * 77 + 4 * 72 + 4 * 204 + 32, 4 * 77 + 4 * 72 + 4 * 204,
                          8 * 77 + 88 + 8 * 72 + 48)
    assert rest == 308
    # dp 4 = ep: one expert a block, not sharded; the unit is the replicated part alone
    z2 = m(1, 2, False, True, optimizer="adam", precision="fp32", dp=4, ep=4, zero=2)
    assert triple(z2) == (4 * 308 + 4 * 72 + 32, 4 * 77 + 4 * 72 + 4 * 132,
                          8 * 77 + 88 + 8 * 72 + 24)
    z1 = m(1, 2, False, True, optimizer="sgd", precision="fp32", dp=2, ep=1, zero=1)
    assert triple(z1) == (4 * 308 + 4 * 288 + 32, 4 * 308 + 4 * 288, 0)
    # tp 2, dp 2 = ep, ZeRO-3, mixed: 308 // 2 = 154, 77 a rank; experts 144 // 2 = 72;
    # the unit 132 // 2 = 66 (experts not sharded); biases 2 x 4 x 4 B
    mixed = m(1, 2, False, True, optimizer="adam", precision="mixed", tp=2, dp=2, ep=2, zero=3)
    assert triple(mixed) == (2 * 77 + 2 * 72 + 2 * 66 + 32, 2 * 77 + 2 * 72 + 2 * 66,
                             12 * 77 + 88 + 12 * 72 + 48)
    fp64 = m(2, 1, False, False, optimizer="sgd", precision="fp64")
    assert triple(fp64) == (8 * 132 + 8 * 144 + 32, 8 * 132 + 8 * 144, 0)  # 8-byte biases
    nobias = dataclasses.replace(MOE, router_bias=False)
    assert nobias.stage_memory(2, 1, False, False, optimizer="sgd", precision="fp32").weights \
        == 4 * 132 + 4 * 144
    # dp 2, ep 1: the unit 204 whole... the experts sharded over 2 too: 132 + 144 = 276
    z3b = m(2, 1, False, False, optimizer="sgd", precision="fp32", dp=2, zero=3)
    assert triple(z3b) == (4 * 66 + 4 * 72 + 4 * 276 + 16, 4 * 66 + 4 * 72 + 4 * 276, 0)
    # dp 2 = ep 2 on the dense block: only the dense unit
    z3c = m(0, 1, False, False, optimizer="sgd", precision="fp32", dp=2, ep=2, zero=3)
    assert triple(z3c) == (4 * 64 + 4 * 128, 4 * 64 + 4 * 128, 0)


def test_moe_layer_activations_by_hand():
    """3 tokens, top 2 of 4 experts, width 4, expert width 3, a shared expert 5 wide, fp32:
    router 48 + 36 + 48, moved 96 + 96 + 24 + 16, experts 384 + 48, placed 144, shared 240."""
    b = MOE.moe_layer_bytes
    assert b(T, 4) == 132 + 232 + 432 + 144 + 240  # 1180
    assert b(T, 4, 2) == 132 + 232 + 288 + 144 + 120  # the experts' 4 x 3 // 2, shared 20 // 2
    assert b(T, 4, 3) == 132 + 232 + 240 + 144 + 72  # 12 // 3, 20 // 3 = 6
    assert b(T, 2) == 132 + 184 + 240 + 96 + 120  # statistics and indices keep their size
    assert b(T, 8) == (96 + 72 + 48) + (96 + 192 + 48 + 32) + (768 + 48) + 240 + 480
    assert dataclasses.replace(MOE, shared=0).moe_layer_bytes(T, 4) == 1180 - 240
    assert MOE.moe_block_activation_bytes(T, 4) == 480 + 1180  # attention and norms, no MLP
    assert MOE.block_activation_bytes(T, 4) == 768  # the dense block's
    assert MOE.moe_block_activation_bytes(T, 4, 2, True) == \
        3 * ((6 + 16) * 4 + 4) + 12 + 916
    assert whole(b(T, 4, 3), b(T, 2), b(T, 4, 2), MOE.moe_block_activation_bytes(T, 4, 3, True),
                 MOE.block_activation_bytes(T, 4, 3, True))


def test_moe_stage_activations_and_the_estimate_by_hand():
    """The dense block 768 B, an MoE block 1660, their input 48, embedding 24, head 304."""
    s = MOE.moe_stage_activation_bytes
    assert s(0, 3, True, True, tokens=T, element_size=4) == (24 + 768 + 2 * 1660 + 304, 0)
    assert s(0, 1, True, False, tokens=T, element_size=4) == (24 + 768, 0)
    assert s(1, 2, False, False, tokens=T, element_size=4) == (2 * 1660, 0)
    assert s(0, 3, True, True, tokens=T, element_size=4, recompute=True) == \
        (24 + 3 * 48 + 304, 1660 - 48 - 304)
    assert s(0, 1, True, False, tokens=T, element_size=4, recompute=True) == (72, 720)
    assert s(2, 1, False, False, tokens=T, element_size=4, recompute=True) == (48, 1612)
    ledger = estimate_transformer(MOE, batch=1, seq=3, stages=[1, 2], in_flight=[3, 1],
                                  optimizer="sgd", dp=2, ep=2, recompute=True)
    assert ledger.note == "estimated, fp32 sgd, tp=1, dp=2, ZeRO-0, recompute, ep=2, batch 1x3"
    assert ledger["stage 0"] == DeviceMemory(4 * 168, 4 * 168, 0, 3 * 72 + 720)
    assert ledger["stage 1"] == DeviceMemory(4 * 308 + 4 * 144 + 32, 4 * 308 + 4 * 144, 0,
                                             96 + 304 + 1660 - 48 - 304)
    for row in ledger.rows.values():
        triple(row)


def test_the_moe_shape_refuses_in_exact_words():
    """Counts, top_k, dense_blocks and ep, to the letter."""
    r = dataclasses.replace
    refused(lambda: r(MOE, experts=0), "experts=0; valid: an integer >= 1")
    refused(lambda: r(MOE, experts=True), "experts=True; valid: an integer >= 1")
    refused(lambda: r(MOE, moe_ffn=0), "moe_ffn=0; valid: an integer >= 1")
    refused(lambda: r(MOE, shared=-1), "shared=-1; valid: an integer >= 0")
    refused(lambda: r(MOE, shared_ffn=0), "shared_ffn=0; valid: an integer >= 1")
    for bad in (0, 5, True, 2.0):
        refused(lambda bad=bad: r(MOE, top_k=bad),
                f"top_k={bad!r}; valid: an integer from 1 to experts=4")
    for bad in (-1, 3, True, 1.0):
        refused(lambda bad=bad: r(MOE, dense_blocks=bad),
                f"dense_blocks={bad!r}; valid: an integer from 0 to 2 (at least one block of "
                "experts)")
    refused(lambda: r(MOE, hidden=3), "cannot estimate " + repr(r(MOE, shared=0)).replace(
        "hidden=4", "hidden=3").replace("shared=0", "shared=1")
        + "; valid: positive sizes, hidden a multiple of heads, heads a multiple of kv_heads")
    assert r(MOE, top_k=4, dense_blocks=2, shared=0).top_k == 4
    assert (validate_ep(1, 6, MOE), validate_ep(2, 6, MOE), validate_ep(4, 8, MOE)) == (1, 2, 4)
    assert validate_ep(1, 3, SHAPE) == 1
    refused(lambda: validate_ep(4, 6, MOE), "ep=4 for 4 experts and dp=6; valid: a divisor "
            "of both (expert-parallel ranks are borrowed from the data-parallel ones): [1, 2]")
    for bad in (0, True, 1.0):
        refused(lambda bad=bad: validate_ep(bad, 4, MOE),
                f"ep={bad!r}; valid: an integer >= 1 (expert-parallel ranks)")
    refused(lambda: validate_ep(True, 4, SHAPE),
            "ep=True; valid: an integer >= 1 (expert-parallel ranks)")


def test_moe_stages_under_tensor_and_sequence_parallelism_and_by_default():
    """tp = 2: the dense block 540 B (432 with sequence parallelism), an MoE block 396 + 916
    (288 + 916), the embedding 27, the head 243 (189), a block's input 48 (24)."""
    s = MOE.moe_stage_activation_bytes
    assert s(0, 3, True, True, tokens=T, element_size=4, tp=2) == (27 + 540 + 2 * 1312 + 243, 0)
    assert s(0, 3, True, True, tokens=T, element_size=4, tp=2, seq_parallel=True) == \
        (27 + 432 + 2 * 1204 + 189, 0)
    assert s(0, 3, True, True, tokens=T, element_size=4, tp=2, seq_parallel=True,
             recompute=True) == (27 + 3 * 24 + 189, 1204 - 24 - 189)
    assert s(0, 3, True, True, tokens=T, element_size=4, tp=2, recompute=True) == \
        (27 + 3 * 48 + 243, 1312 - 48 - 243)
    assert s(0, 1, True, False, tokens=T, element_size=4, tp=2, seq_parallel=True,
             recompute=True) == (27 + 24, 432 - 24)
    big_head = dataclasses.replace(MOE, vocab=1000)
    assert big_head.moe_stage_activation_bytes(2, 1, False, True, tokens=T, element_size=4,
                                               recompute=True)[1] == 0
    assert SHAPE.block_input_bytes(T, 4, seq_parallel=True) == 48  # one rank by default
    assert MOE.block_input_bytes(T, 4, seq_parallel=True) == 48
    assert (MOE.block_activation_bytes(T, 4, 2), MOE.moe_block_activation_bytes(T, 4, 2)) == \
        (540, 1312)  # without sequence parallelism by default
    tp2 = estimate_transformer(MOE, batch=1, seq=3, tp=2, optimizer="sgd")["stage 0"]
    assert triple(tp2) == (4 * 238 + 4 * 144 + 32, 4 * 238 + 4 * 144, 0)  # 476 // 2, 288 // 2
    m = MOE.stage_memory
    full = (4 * 168, 4 * 168, 8 * 168 + 40)
    assert triple(m(0, 1, True, False, optimizer="adam", precision="fp32", dp=2)) == full
    assert triple(m(0, 1, True, False, optimizer="adam", precision="fp32", zero=3)) == full
    # the dense block alone over dp 2, ep 1: 64 a rank and the block gathered whole
    assert triple(m(0, 1, False, False, optimizer="sgd", precision="fp32", dp=2, zero=3)) == \
        (4 * 64 + 4 * 128, 4 * 64 + 4 * 128, 0)
    wide = dataclasses.replace(MOE, vocab=100)  # the embedding (400) is the largest unit
    assert triple(wide.stage_memory(0, 1, True, False, optimizer="sgd", precision="fp32",
                                    dp=2, zero=3)) == (4 * 264 + 4 * 400, 4 * 264 + 4 * 400, 0)
    assert triple(wide.stage_memory(1, 2, False, True, optimizer="sgd", precision="fp32",
                                    dp=2, zero=2)) == (4 * 668 + 4 * 288 + 32,
                                                       4 * 334 + 4 * 144 + 4 * 404, 0)


def test_from_moe_reads_the_config_and_the_layer():
    """The small Llama's sizes (kv_heads and tied included) and the MoE layer's."""
    lm = LMConfig(vocab=10, hidden=4, blocks=2, ffn=6, heads=2, kv_heads=1, tied=True)
    for shared in (True, False):
        moe = MoEShape(hidden=4, ffn=3, experts=4, top_k=2, shared=shared)
        assert MoETransformerShape.from_moe(lm, moe) == MoETransformerShape(
            hidden=4, blocks=2, heads=2, ffn=6, vocab=10, kv_heads=1, tied=True, experts=4,
            top_k=2, moe_ffn=3, shared=int(shared), router_bias=True)
    bare = SimpleNamespace(hidden=4, blocks=2, heads=2, ffn=6, vocab=10, kv_heads=None)
    shape = MoETransformerShape.from_moe(bare, MoEShape(hidden=4, ffn=3, experts=4, top_k=1))
    assert shape.tied is False and shape.shared == 0 and type(shape.shared) is int
