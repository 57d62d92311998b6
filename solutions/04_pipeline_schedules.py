"""Lesson 04's exercises, solved. Try them in the notebook first."""


# %% Exercise 04.1: the bubble of every schedule
def bubble(schedule: str, K: int, M: int, v: int) -> float:
    """Idle share of an ideal step (F = 1, backward = 2 units; I = W = 1 unit)."""
    if schedule in ("gpipe", "1f1b"):
        return (K - 1) / (M + K - 1)
    if schedule == "interleaved_1f1b":
        return (K - 1) / (v * M + K - 1)
    if schedule == "zero_bubble":
        return (K - 1) / (3 * v * M + K - 1)
    raise ValueError(f"unknown schedule {schedule!r}")


# %% Exercise 04.2: peak memory per stage
def peak_bytes(schedule: str, K: int, M: int, stage: int, weights: int, activation: int) -> int:
    """GPipe holds every micro-batch; 1F1B's stage k runs K - k forwards before its first
    backward (PyTorch's Schedule1F1B needs M >= K, so that is never more than M)."""
    in_flight = M if schedule == "gpipe" else K - stage
    return weights + in_flight * activation



# %% Exercise 04.3: why 1F1B holds fewer activations for the same bubble
def warmup(K: int, M: int, stage: int) -> int:
    """Stage k's first gradient comes back after K - k forwards' worth of time: fewer and
    it idles while waiting, more and it keeps extra micro-batches for the same bubble."""
    return min(M, K - stage)


ANSWERS = {"04.1": bubble, "04.2": peak_bytes, "04.3": warmup}
