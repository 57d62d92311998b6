"""Checkers for the lesson on seeing and debugging a run: 12.1 (a rank's overlap share,
from its intervals), 12.2 (the MFU of a stated run, with the sparse peak as the trap) and
12.3 (which rank a set of Flight Recorder records blames). Each answer is checked against
the lesson's own code: ``overlap.breakdown``, ``flops`` and ``hangs.diagnose``."""

from __future__ import annotations

from numbers import Real

from helpers.debugging.hangs import Call, diagnose
from helpers.debugging.intervals import length
from helpers.debugging.overlap import breakdown
from helpers.exercises.feedback import Wrong, answer, checker, given

# --- 12.1 -----------------------------------------------------------------------------------

# (computing intervals, communicating intervals), in microseconds; the first two have
# nested and overlapping events, where summing instead of taking the union goes wrong
OVERLAP_CASES = (
    (((0, 50), (10, 30), (60, 90)), ((40, 70), (65, 100))),
    (((0, 30), (20, 60)), ((50, 80), (55, 65))),
    (((0, 10),), ((20, 30),)),
    (((0, 100),), ((10, 20), (30, 40))),
)


def _as_share(got: object, call: str) -> float:
    if isinstance(got, bool) or not isinstance(got, Real):
        raise Wrong(f"{call} returned {type(got).__name__} {got!r}; expected a number from 0 "
                    "to 1")
    return float(got)


def _overlap_mistakes(computing, communicating) -> list[tuple[float, str]]:
    both = breakdown(computing, communicating)
    summed = sum(e - s for s, e in communicating)
    inter = both.both
    pairwise = sum(max(0, min(ce, me) - max(cs, ms)) for cs, ce in computing
                   for ms, me in communicating)
    union_hint = ("measure each kind as a union first: nested or overlapping events count "
                  "once (intervals.union, then intersect and length)")
    return [
        (pairwise / summed if summed else 0.0, union_hint),
        (pairwise / both.communicating_total if both.communicating_total else 0.0,
         union_hint),
        (inter / summed if summed else 0.0, union_hint),
        (inter / both.window, "divide by the communication time, not by the whole window"),
        (1 - both.overlap_share, "that is the share left exposed: the share hidden is the "
         "time both ran over the communication time"),
        (inter / length(computing) if length(computing) else 0.0,
         "divide by the communication time, not by the computing time"),
    ]


@checker("12.1", "Write the body of overlap_share(computing, communicating), then run this "
         "cell again.")
def check_overlap_share(overlap_share) -> str:
    """A rank's overlap share from its intervals, against ``overlap.breakdown``."""
    for computing, communicating in OVERLAP_CASES:
        call = f"overlap_share({list(computing)}, {list(communicating)})"
        got = _as_share(answer(overlap_share, list(computing), list(communicating)), call)
        want = breakdown(computing, communicating).overlap_share
        if abs(got - want) > 1e-9:
            hint = next((h for value, h in _overlap_mistakes(computing, communicating)
                         if abs(got - value) < 1e-9),
                        "take the union of each kind, intersect them, and divide the "
                        "intersection's length by the communication's")
            raise Wrong(f"{call} = {got:.4g}, expected {want:.4g}", hint)
    return ("the share of communication time that ran while the rank also computed. 100 % "
            "is the most overlap can give: the step can then be no shorter than its "
            "computing.")


# --- 12.2 -----------------------------------------------------------------------------------

# A stated run: a dense model of N weights, L blocks, width d, sequences of s tokens,
# trained at this many tokens per second per GPU; the data sheet's BF16 figure is "with
# sparsity" (H100: 1979 TFLOPS, A100: 624), the dense peak is half of it.
MFU_CASES = (
    # (tokens/s per GPU, N, L, d, s, dense peak FLOP/s)
    (9_000.0, 6.7e9, 32, 4096, 4096, 989e12),
    (1_200.0, 13e9, 40, 5120, 2048, 312e12),
    (30_000.0, 1.3e9, 24, 2048, 2048, 989e12),
)


def reference_mfu(tokens_per_s: float, n: float, layers: int, d: int, s: int,
                  dense_peak: float) -> float:
    """(6 N + 12 L s d) FLOPs per token, times tokens per second, over the dense peak."""
    return (6 * n + 12 * layers * s * d) * tokens_per_s / dense_peak


def _mfu_mistakes(case: tuple) -> list[tuple[float, str]]:
    tps, n, layers, d, s, peak = case
    right = reference_mfu(*case)
    return [
        (right / 2, "that divides by the sparse figure: the data sheet's figure is with 2:4 "
         "sparsity; a dense training step can reach at most the dense peak, half of it"),
        (6 * n * tps / peak, "add the attention scores: 12 L s d FLOPs per token"),
        (2 * n * tps / peak, "a training step is 6 N per token (2 forward, 4 backward), not 2 N"),
        ((6 * n / 8 + 12 * layers * s * d) * tps / peak,
         "count every weight of the model, not the 1/8 that one FSDP rank holds"),
    ]


@checker("12.2", "Write the body of mfu(tokens_per_s, n, layers, d, s, datasheet_peak), then "
         "run this cell again.")
def check_mfu(mfu) -> str:
    """The MFU of a stated run, given the data sheet's sparse figure."""
    for case in MFU_CASES:
        tps, n, layers, d, s, peak = case
        call = f"mfu({tps:g}, {n:g}, {layers}, {d}, {s}, {2 * peak:g})"
        got = answer(mfu, tps, n, layers, d, s, 2 * peak)
        if isinstance(got, bool) or not isinstance(got, Real):
            raise Wrong(f"{call} returned {got!r}; expected a share (e.g. 0.41)")
        want = reference_mfu(*case)
        if abs(got - want) > 1e-6 * want:
            hint = next((h for value, h in _mfu_mistakes(case) if abs(got - value) < 1e-6 * want),
                        "model FLOPs per token (6 N + 12 L s d) times tokens per second, over "
                        "the dense peak (half the data sheet's sparse figure)")
            raise Wrong(f"{call} = {got:.4g}, expected {want:.4g}", hint)
    tps, n, layers, d, s, peak = MFU_CASES[0]
    first = reference_mfu(*MFU_CASES[0])
    one_rank = (6 * n / 8 + 12 * layers * s * d) * tps / peak
    return (f"the first run uses {first:.0%} of its GPU. Divided by the sparse figure it "
            f"would read {first / 2:.0%}; with one of 8 FSDP ranks' share of the weights, "
            f"{one_rank:.0%}.")


# --- 12.3 -----------------------------------------------------------------------------------

def _calls(*ops: str) -> list[Call]:
    return [Call("0", i + 1, False, op, ((1024,),), "train.py:1") for i, op in enumerate(ops)]


# what four ranks' Flight Recorders kept: rank 3's third collective is not the others'
RECORDS = {0: _calls("all_reduce", "all_reduce", "all_gather"),
           1: _calls("all_reduce", "all_reduce", "all_gather"),
           2: _calls("all_reduce", "all_reduce", "all_gather"),
           3: _calls("all_reduce", "all_reduce", "all_reduce")}


def records_table() -> str:
    """The records of 12.3 as the lesson prints them."""
    return "\n".join(f"rank {r}: " + ", ".join(f"#{c.seq} {c.op}" for c in calls)
                     for r, calls in RECORDS.items())


@checker("12.3", "Set which_rank to the rank these records blame (an int), then run this "
         "cell again.")
def check_which_rank(which_rank) -> str:
    """The rank ``hangs.diagnose`` blames in :data:`RECORDS`."""
    got = given(which_rank)
    finding = diagnose(RECORDS, "0")
    if isinstance(got, bool) or not isinstance(got, int):
        raise Wrong(f"which_rank = {got!r}: expected a rank, an int")
    if got not in RECORDS:
        raise Wrong(f"which_rank = {got}: no such rank; valid: 0 to {len(RECORDS) - 1}")
    if got != finding.culprits[0]:
        raise Wrong(f"which_rank = {got!r}: that rank agrees with the majority",
                    "find the first collective number at which the ranks disagree, then the "
                    "rank whose call differs from the others'")
    return finding.line()
