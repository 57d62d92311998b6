"""Lesson 09's exercises, solved. Try them in the notebook first."""

import torch
import torch.distributed as dist

# %% Exercise 09.1: why each block needs f
# Follow the gradient back from the block's output. g's backward is the identity, so the MLP's
# shards (gate, up, down) get their output's whole gradient, and their input, mlp_norm's
# output, is right in forward: their gradients stay right. Without f, mlp_norm's output gets
# only this rank's MLP columns' share of its gradient: its weight's gradient is wrong, and so
# is the gradient it passes on into h. Everything of the attention half is trained from that
# wrong gradient: o, q, k, v and attn_norm.
wrong_without_f = {
    "mlp_norm.weight",
    "attn.o_proj.weight",
    "attn.q_proj.weight",
    "attn.k_proj.weight",
    "attn.v_proj.weight",
    "attn_norm.weight",
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


ANSWERS = {"09.1": wrong_without_f, "09.2": sp_saving, "09.3": my_vocab_parallel_loss}
