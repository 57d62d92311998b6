"""Lesson 03's exercises, solved. Try them in the notebook first."""


# %% Exercise 03.1: GPipe's bubble with unequal stages
def gpipe_bubble(stage_costs: list[float], M: int) -> float:
    """All forwards flow through the stages like jobs through a production line: the first
    micro-batch takes sum(costs), each later one finishes max(costs) after the previous.
    The backwards do the same at twice the cost, so the step lasts
    3 * (sum + (M - 1) * max), while the stages are busy 3 * M * sum of it in all."""
    K, total, slowest = len(stage_costs), sum(stage_costs), max(stage_costs)
    return 1 - M * total / (K * (total + (M - 1) * slowest))


# %% Exercise 03.2: enough micro-batches
# Four equal stages: the bubble is (K-1)/(M+K-1) = 3/(M+3) <= 0.1, so M >= 27.
fewest_m = 27



# %% Exercise 03.3: why more micro-batches shrink the bubble
def stage_ticks(K: int, M: int) -> tuple[int, int]:
    """A stage runs M forwards and M backwards (busy); it waits K-1 ticks for the pipeline
    to fill and K-1 for it to drain (idle), whatever M is."""
    return 2 * M, 2 * (K - 1)


ANSWERS = {"03.1": gpipe_bubble, "03.2": fewest_m, "03.3": stage_ticks}
