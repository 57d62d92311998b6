"""Break it: one block whose ranks skip f, on thread ranks of a real gloo group.

f's forward is the identity, so skipping it changes no output. Its backward all-reduce is
what makes the gradient leaving a tensor-parallel region whole: without it a rank's norm
receives only its own heads' (or MLP columns') share of its output's gradient. The
replicated norms' gradients then differ from one process's and from rank to rank, and so
does the gradient flowing on to the block's input. ``f_check`` proves it either way.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from helpers.core.checks import Proof, Verdict, max_abs_diff
from helpers.models.llama import Block
from helpers.runs.tp_llama.results import RELATIVE_TOLERANCE
from helpers.tensor_parallel.mappings import g
from helpers.tensor_parallel.transformer_block import TPBlock, shard_block, split_weights
from helpers.torchrun.in_notebook import run_ranks

NORMS = ("attn_norm.weight", "mlp_norm.weight")
INPUT = "input"  # the gradient reaching the block's input, by this name


def forward(shard: TPBlock, x: torch.Tensor, group, *, skip_f: bool) -> torch.Tensor:
    """Rank's block output: ``shard(x, group)``, or with ``skip_f`` the same without f
    (each half's partial term read from the norm directly, g still summing them)."""
    if not skip_f:
        return shard(x, group)
    h = x + g(shard.attention_partial(x), group)  # attention_partial without a group: no f
    return h + g(shard.mlp_partial(h), group)


def _grads(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, module) -> dict:
    (out * weight).sum().backward()  # the same loss on every rank, from the same output
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters()}
    return {**grads, INPUT: x.grad.detach().clone()}


def block_gradients(block: Block, x: torch.Tensor, tp: int, *, skip_f: bool = False,
                    seed: int = 2) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """(one process's gradients, each rank's), of the loss ``sum(out * w)`` for a fixed
    random ``w``: the block's weights by name (a rank's: its shard) and the input's."""
    weight = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))
    whole = x.detach().clone().requires_grad_()
    block.zero_grad(set_to_none=True)
    reference = _grads(block(whole), whole, weight, block)
    block.zero_grad(set_to_none=True)
    shards = [shard_block(block, rank, tp) for rank in range(tp)]

    def work(rank: int, group) -> dict[str, torch.Tensor]:
        mine = x.detach().clone().requires_grad_()
        out = forward(shards[rank], mine, group, skip_f=skip_f)
        return _grads(out, mine, weight, shards[rank])

    ranks = run_ranks(tp, work, timeout=60)
    for result in ranks:
        if isinstance(result, BaseException):
            raise result
    return reference, ranks


def wrong_gradients(block: Block, x: torch.Tensor, tp: int, *, skip_f: bool = True) -> set[str]:
    """The block's weights whose gradient on rank 0 differs from its slice of one
    process's beyond ``RELATIVE_TOLERANCE`` times that gradient's largest value."""
    reference, ranks = block_gradients(block, x, tp, skip_f=skip_f)
    cuts = split_weights(block, 0, tp)
    return {name for name, cut in cuts.items()
            if max_abs_diff(ranks[0][name], cut.take(reference[name]))
            > RELATIVE_TOLERANCE * reference[name].abs().max().item()}


class FCheck(NamedTuple):
    """A block's gradients on ranks against one process's: the verdict, and how far apart
    two ranks' norm gradients lie (they must be alike: the norms are replicated)."""

    verdict: Verdict
    apart: float


def f_check(block: Block, x: torch.Tensor, tp: int, *, skip_f: bool) -> FCheck:
    """Each rank's norm gradients (both norms together) and input gradient against one
    process's, and every rank's norm gradients against rank 0's; tolerance
    ``RELATIVE_TOLERANCE`` times the largest value of the one-process gradient."""
    reference, ranks = block_gradients(block, x, tp, skip_f=skip_f)

    def norms(grads: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([grads[n] for n in NORMS])

    norm_allowed = RELATIVE_TOLERANCE * norms(reference).abs().max().item()
    input_allowed = RELATIVE_TOLERANCE * reference[INPUT].abs().max().item()
    proofs = [Proof(f"rank {r} norms", max_abs_diff(norms(got), norms(reference)), norm_allowed)
              for r, got in enumerate(ranks)]
    proofs += [Proof(f"rank {r} input", max_abs_diff(got[INPUT], reference[INPUT]),
                     input_allowed) for r, got in enumerate(ranks)]
    apart = [Proof(f"norms, rank {r} vs 0", max_abs_diff(norms(got), norms(ranks[0])),
                   norm_allowed) for r, got in enumerate(ranks[1:], start=1)]
    claim = f"{'with' if not skip_f else 'without'} f: block = one process"
    return FCheck(Verdict(claim, [*proofs, *apart]), max(p.max_diff for p in apart))
