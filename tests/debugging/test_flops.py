"""A training step's FLOPs: FlopCounterMode equals the analytic count (its matrix products
exactly; the CPU's attention kernel only once mapped; a checkpointed step's rerun forward);
utilisation and the published peaks refuse what they cannot use."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from helpers.debugging.flops import (
    counted_flops,
    gpu_peak,
    matmul_weights,
    measure_peak,
    step_flops,
    training_step,
    utilisation,
)
from helpers.models.llama import build_lm
from helpers.profiles import get_profile
from helpers.runs.tp_llama.step import make_batch

SIZES = get_profile("smoke").debugging


class Checkpointed(torch.nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)


def step_of(model):
    ids, targets = make_batch(SIZES.model.vocab, SIZES.batch, SIZES.seq, seed=0)
    return training_step(model, ids, targets)


def test_the_counter_counts_6n_per_token_and_not_the_cpu_attention_kernel():
    model = build_lm(SIZES.model, seed=0).train()
    want = step_flops(SIZES.model, SIZES.batch, SIZES.seq)
    plain = counted_flops(step_of(model))
    assert plain.by_operator == {"mm": want.matmul}
    assert want.matmul == 6 * matmul_weights(SIZES.model) * SIZES.batch * SIZES.seq
    mapped = counted_flops(step_of(model), cpu_attention=True)
    assert mapped.total == want.hardware == want.model + want.attention_recomputed


def test_a_checkpointed_step_counts_the_forward_again_but_the_last_product():
    model = build_lm(SIZES.model, seed=0).train()
    model.blocks = torch.nn.ModuleList(Checkpointed(b) for b in model.blocks)
    want = step_flops(SIZES.model, SIZES.batch, SIZES.seq, checkpointing=True)
    assert counted_flops(step_of(model), cpu_attention=True).total == want.hardware
    assert want.model == step_flops(SIZES.model, SIZES.batch, SIZES.seq).model  # MFU's: same


def test_the_attention_term_is_12_l_s_d_per_token():
    c = SIZES.model
    f = step_flops(c, 3, 10)
    assert f.attention == 12 * c.blocks * 10 * c.hidden * 30
    assert f.attention_recomputed * 6 == f.attention


def test_peaks_and_utilisation_refuse_bad_input():
    with pytest.raises(ValueError, match="size=8; valid: an integer >= 64"):
        measure_peak(8)
    with pytest.raises(ValueError, match="valid: both > 0"):
        utilisation(1e9, 0.0, 1e12)
    with pytest.raises(ValueError, match="no published peak for 'TPU'; valid: A100"):
        gpu_peak("TPU")
    assert gpu_peak("NVIDIA H100 80GB HBM3").dense_tflops * 2 == gpu_peak("H100").sparse_tflops
    peak = measure_peak(64, repeats=2, number=1)
    assert peak.flops_per_s > 0 and len(peak.seconds) == 2
    assert utilisation(2e9, 1.0, 4e9) == 0.5
