"""Lesson 09's exercises, solved. Try them in the notebook first."""

import torch
import torch.distributed as dist

# %% Exercise 09.1: which weights are split, and how
# What a rank holds of each weight, as PyTorch stores it: nn.Linear (out, in), nn.Embedding
# (vocab, hidden). Column-parallel layers keep rows (their output features), row-parallel
# ones keep columns (their input features); the norms normalise the whole hidden vector.
split_of_block = {
    "attn_norm.weight": "replicated",
    "attn.q_proj.weight": "rows",  # this rank's query heads
    "attn.k_proj.weight": "rows",  # its key/value heads
    "attn.v_proj.weight": "rows",
    "attn.o_proj.weight": "columns",  # the input columns of its heads; g sums the outputs
    "mlp_norm.weight": "replicated",
    "mlp.gate_proj.weight": "rows",  # its part of the MLP width
    "mlp.up_proj.weight": "rows",
    "mlp.down_proj.weight": "columns",
    "embed.weight": "rows",  # its slice of the vocabulary
    "norm.weight": "replicated",
    "head.weight": "rows",  # its columns of the logits
}


# %% Exercise 09.2: what sequence parallelism saves
def sp_saving(tokens: int, hidden: int, tp: int, element_size: int) -> float:
    """Sequence parallelism cuts by tokens four width-h tensors around the norms (the block
    input, the two normalised values, the residual sum) and the two norms' float32 rstd
    (4 bytes per token each); a rank keeps 1/tp of them, so it saves (tp - 1)/tp. The two
    norm outputs, all-gathered for the column-parallel projections, stay whole; the split
    layers' tensors were cut by tp already, so heads and the MLP width do not enter."""
    return tokens * (4 * hidden * element_size + 2 * 4) * (tp - 1) / tp


# %% Exercise 09.3: the vocab-parallel loss from three all-reduces
def my_vocab_parallel_loss(local_logits: torch.Tensor, targets: torch.Tensor, start: int,
                           end: int, group) -> torch.Tensor:
    """log(sum over the vocabulary of exp(logit - max)) - (target logit - max), averaged
    over the tokens: each term is a per-token reduction of the ranks' columns."""
    row_max = local_logits.max(dim=-1).values
    dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)  # the same shift everywhere
    shifted = local_logits - row_max.unsqueeze(-1)
    sum_exp = shifted.exp().sum(dim=-1)
    dist.all_reduce(sum_exp, op=dist.ReduceOp.SUM, group=group)
    inside = (targets >= start) & (targets < end)
    index = torch.where(inside, targets - start, 0).unsqueeze(-1)
    target = torch.where(inside, shifted.gather(-1, index).squeeze(-1), 0.0)
    dist.all_reduce(target, op=dist.ReduceOp.SUM, group=group)  # one rank holds each target
    return (sum_exp.log() - target).mean()


ANSWERS = {"09.1": split_of_block, "09.2": sp_saving, "09.3": my_vocab_parallel_loss}
