"""Lesson 10's exercises, solved. Try them in the notebook first."""


# %% Exercise 10.1: which ranks talk to each other
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


# %% Exercise 10.2: the layout that fits a given model and cluster
# from helpers.memory import LLAMA_70B_SHAPE
# from helpers.composed.layout_search import search_layouts
# best = search_layouts(LLAMA_70B_SHAPE, 64, recompute=(False,)).chosen
# (best.tp, best.pp)
layout_70b_64 = (2, 1)


ANSWERS = {"10.1": mesh_groups, "10.2": layout_70b_64}
