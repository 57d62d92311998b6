"""Lesson 09's Break it: a block whose ranks skip f, on thread ranks of a real gloo group.

Tolerance as the lesson's: ``RELATIVE_TOLERANCE`` (2^-16) times the largest value of the
one-process gradient; skipping f is off by the gradients' own size.
"""

import pytest
import torch

from helpers.models.llama import Block
from helpers.runs.tp_llama.skip_f import f_check, wrong_gradients

NORMS = {"attn_norm.weight", "mlp_norm.weight"}
ATTENTION = {"attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
             "attn.o_proj.weight"}


def _block_and_input(hidden=64):
    torch.manual_seed(0)
    block = Block(hidden, 96, 8, 4, rope=True)
    with torch.no_grad():  # norm weights away from 1, so their gradients are tested
        for norm in (block.attn_norm, block.mlp_norm):
            norm.weight.uniform_(0.5, 1.5)
    return block, torch.randn(2, 8, hidden, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("tp", [2, 4])
def test_with_f_every_rank_has_one_process_gradients_and_the_same_norms(tp):
    block, x = _block_and_input()
    checked = f_check(block, x, tp, skip_f=False)
    assert checked.verdict.ok and checked.apart == 0.0
    assert len(checked.verdict.proofs) == 2 * tp + tp - 1  # norms, input; each rank vs rank 0
    assert wrong_gradients(block, x, tp, skip_f=False) == set()


@pytest.mark.parametrize("tp", [2, 4])
def test_without_f_the_norms_go_wrong_and_the_ranks_disagree(tp):
    block, x = _block_and_input()
    checked = f_check(block, x, tp, skip_f=True)
    assert not checked.verdict.ok and checked.apart > 1e-2
    assert checked.verdict.line().startswith("✗ without f: block = one process")
    assert {p.what for p in checked.verdict.failed} >= {f"rank {r} norms" for r in range(tp)}


def test_without_f_the_attention_half_goes_wrong_and_the_mlp_shards_stay_right():
    block, x = _block_and_input()
    assert wrong_gradients(block, x, 2) == NORMS | ATTENTION


def test_a_block_that_does_not_split_is_refused():
    block, x = _block_and_input()
    with pytest.raises(ValueError, match="tp=3"):
        f_check(block, x, 3, skip_f=True)
