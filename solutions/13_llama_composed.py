"""Lesson 13's exercises, solved. Try them in the notebook first."""


# %% Exercise 13.1: which ranks talk to each other
def mesh_groups(pp: int, dp: int, tp: int) -> dict[str, list[list[int]]]:
    """DeviceMesh numbers the ranks row-major, as torch.arange(pp * dp * tp).reshape(pp, dp,
    tp): rank = (p * dp + d) * tp + t. A group along one dimension lets that index run and
    fixes the other two, so there is one group per pair of the other two indices."""
    def rank(p: int, d: int, t: int) -> int:
        return (p * dp + d) * tp + t

    return {
        "pp": [[rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
        "dp": [[rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
        "tp": [[rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)],
    }


# %% Exercise 13.2: what fills the card, and which cut divides it
# FSDP over 64 GPUs already divides weights, gradients and optimizer state by 64; no ZeRO
# stage shards the activations, and without recomputation every GPU keeps each block's
# activations for its micro-batch: they fill the card.
# - dp: more data parallelism splits the batch, not a sequence: each GPU still runs a
#   whole micro-batch through all 80 blocks.
# - pp: a stage holds half the blocks, but 1F1B's first stage keeps one micro-batch in
#   flight per stage, so it keeps as many block activations as before.
# - tp: with sequence parallelism, every block's activations are split over the ranks.
fills_and_cut = ("activations", "tp")


# %% Exercise 13.3: why tp is innermost
# On nodes of 2 GPUs, the 2 x 2 x 2 mesh keeps only its innermost groups inside a node
# (ranks 1 apart); the groups of the other two dimensions hold ranks 2 or 4 apart. So the
# calls along the innermost dimension stay on the fast links and the others cross nodes.
# Rank 0 counted, per step, tp 40 calls, dp 6 and pp 3 (section 6's print): tp innermost
# leaves 6 + 3 = 9 calls crossing nodes, dp innermost 43, pp innermost 46.
innermost_and_crossing = ("tp", 9)


ANSWERS = {"13.1": mesh_groups, "13.2": fills_and_cut, "13.3": innermost_and_crossing}
