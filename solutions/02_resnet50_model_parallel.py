"""Lesson 02's exercises, solved. Try them in the notebook first."""

import itertools
import math


# %% Exercise 02.1: a balanced three-stage cut
def three_stage_cut(costs: list[float]) -> list[int]:
    """Try every pair of cuts; keep the one whose costliest stage is cheapest."""
    n = len(costs)

    def slowest(i: int, j: int) -> float:
        return max(sum(costs[:i]), sum(costs[i:j]), sum(costs[j:]))

    return list(min(itertools.combinations(range(1, n), 2), key=lambda c: slowest(*c)))


# %% Exercise 02.2: the activation at a cut
def cut_bytes(block: str, batch: int, image_size: int) -> int:
    """The cut carries the output of the block before it. Before layer1_0 that is the
    max-pool's output (64 channels, side / 4); layer1..layer4 put out 256, 512, 1024, 2048
    channels at side / 4, / 8, / 16, / 32 (each halving rounds up). float32: 4 bytes."""
    stage, index = (int(part) for part in block.removeprefix("layer").split("_"))
    before = stage if index > 0 else stage - 1  # the stage whose output crosses
    channels = 64 if before == 0 else 256 * 2 ** (before - 1)
    side = math.ceil(image_size / 2 ** max(2, before + 1))
    return batch * channels * side * side * 4


# %% Exercise 02.3: why the split is not faster
def naive_speedup(stage_times: list[float], copy: float) -> float:
    """The stages take turns, so the split takes what one device takes, the sum of the
    stages' times, plus a copy each way (activation forward, gradient back) at every cut."""
    one_device = sum(stage_times)
    return one_device / (one_device + 2 * (len(stage_times) - 1) * copy)


ANSWERS = {"02.1": three_stage_cut, "02.2": cut_bytes, "02.3": naive_speedup}
