"""How many collectives the tensor-parallel plan of lesson 09 issues, predicted per module.

``CommDebugMode`` (``torch.distributed.tensor.debug``) counts every collective that DTensor
issues inside it, by the module that was running. PyTorch's plan issues more than the hand
split of lesson 09 (``helpers.runs.tp_llama.results.planned_calls``), for two reasons the
counts make visible:

- a ``ColwiseParallel`` module takes a replicated input, so in backward its input's gradient
  is a partial sum that it all-reduces by itself: q, k and v each once, gate and up each
  once (5 per block), where the hand split's f all-reduces once before the attention and
  once before the MLP (2 per block);
- with sequence parallelism the norms' weights stay replicated and their gradients come
  back ``Partial``; every read of such a gradient as a plain value all-reduces it. The
  step reads each twice (it keeps a copy, then updates the weight), where the hand split
  all-reduces all norm gradients once, together.
"""

from __future__ import annotations

FORWARD, BACKWARD = "forward", "backward"
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = ("all_reduce", "all_gather_into_tensor",
                                          "reduce_scatter_tensor")
LOSS_ALL_REDUCES = 3  # loss_parallel: the logits' max, the exponentials' sum, the targets'


def block_counts(sequence_parallel: bool) -> dict[str, dict[str, int]]:
    """One block's collectives by pass: without sequence parallelism 2 all-reduces forward
    (after o and down) and 5 backward (q, k, v, gate, up); with it, an all-gather before
    the attention and the MLP and a reduce-scatter after each, forward and backward."""
    if sequence_parallel:
        return {FORWARD: {ALL_GATHER: 2, REDUCE_SCATTER: 2},
                BACKWARD: {ALL_GATHER: 2, REDUCE_SCATTER: 2}}
    return {FORWARD: {ALL_REDUCE: 2}, BACKWARD: {ALL_REDUCE: 5}}


def predicted_totals(blocks: int, sequence_parallel: bool) -> dict[str, int]:
    """The whole step's collectives: every block's, the embedding's and the head's, the
    loss's 3 all-reduces, and with sequence parallelism two reads of each of the ``2L + 1``
    norm gradients."""
    if sequence_parallel:
        stream = 4 * blocks + 2  # each block's 4, the embedding's and the head's
        return {ALL_GATHER: stream, REDUCE_SCATTER: stream,
                ALL_REDUCE: LOSS_ALL_REDUCES + 2 * (2 * blocks + 1)}
    return {ALL_REDUCE: 7 * blocks + 2 + LOSS_ALL_REDUCES}


def predicted_per_block(blocks: int, sequence_parallel: bool, model: str = "TinyLM"
                        ) -> dict[str, dict[str, int]]:
    """``{"TinyLM.blocks.i (forward)": {collective: calls}, ...}`` for every block, in the
    keys the lesson's run reports ``CommDebugMode``'s per-module counts under."""
    return {f"{model}.blocks.{i} ({direction})": counts
            for i in range(blocks) for direction, counts in block_counts(sequence_parallel).items()}
