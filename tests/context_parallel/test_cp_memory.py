"""What a context-parallel rank keeps for backward, measured, equals the estimator's."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers.context_parallel.llama import context_parallel, local_loss, tokens_of
from helpers.memory.estimate import estimate_transformer
from helpers.memory.saved import SavedTensorMeter
from helpers.models.llama import LMConfig, build_lm
from helpers.torchrun.in_notebook import run_ranks

CONFIG = LMConfig(vocab=48, hidden=64, blocks=2, ffn=128, heads=4, kv_heads=2, rope=True)
BATCH, SEQ = 2, 32


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_ring_ranks_keep_what_one_device_keeps_for_a_cp_th_of_the_tokens(cp):
    built = build_lm(CONFIG).double()
    ids = torch.randint(0, CONFIG.vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))

    def work(rank, group):
        model = context_parallel(copy.deepcopy(built), group, "ring")
        with SavedTensorMeter(model) as meter:
            loss = local_loss(model(tokens_of(ids, group, "ring")),
                              tokens_of(ids, group, "ring"), ids.numel())
            kept = meter.live_bytes
        loss.backward()
        return kept

    predicted = estimate_transformer(built.transformer_shape(), batch=BATCH, seq=SEQ,
                                     optimizer="sgd", precision="fp64", cp=cp)
    measured = run_ranks(cp, work, timeout=60)
    assert measured == [predicted.rows["stage 0"].activations] * cp


def test_a_cp_the_sequence_cannot_divide_is_refused():
    with pytest.raises(ValueError, match="cp=3; valid: an integer >= 1 that divides seq=32"):
        estimate_transformer(build_lm(CONFIG).transformer_shape(), batch=BATCH, seq=SEQ, cp=3)
