"""Checkers for lessons 03 (pipeline parallelism) and 04 (pipeline schedules)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from helpers.exercises.feedback import Wrong, answer, checker, given
from helpers.memory.fits import SCHEDULES, ClusterLayout
from helpers.pipeline.diagrams import ideal_timeline, idle_share, most_held, warmup_order
from helpers.pipeline.events import bubble_theory
from helpers.pipeline.runtime import CHUNKS_PER_RANK, SCHEDULE_NAMES
from helpers.pipeline.schedule import gpipe_timeline

TARGET_STAGES, TARGET_BUBBLE = 4, 0.10
STAGE_COST_CASES = (((1, 1), 4), ((1, 1, 1, 1), 8), ((1, 2), 4), ((3, 1, 1), 6),
                    ((1, 1, 4, 1), 2), ((2, 2, 2), 1))


def drawn_bubble(stages: int, microbatches: int) -> float:
    """The idle share counted cell by cell on the lesson's drawn GPipe timeline."""
    rows = [r for r in gpipe_timeline(stages, microbatches).splitlines() if r.startswith("stage")]
    cells = [c for row in rows for c in row.split(":", 1)[1].split()]
    return cells.count("..") / len(cells)


def replayed_bubble(stage_costs: Sequence[float], microbatches: int) -> float:
    """GPipe's idle share with these forward costs per stage (a backward costs twice its
    forward), from lesson 04's replay of a schedule with free communication."""
    actions, ranks = [], len(stage_costs)
    for rank, cost in enumerate(stage_costs):
        order = [("F", m, cost) for m in range(microbatches)]
        order += [("B", m, 2 * cost) for m in range(microbatches)]
        for i, (kind, mb, duration) in enumerate(order):
            actions.append({"rank": rank, "stage": rank, "kind": kind, "microbatch": mb,
                            "start_ns": i, "end_ns": i + int(duration * 1e6)})
    replay = ideal_timeline(actions, ranks, 1, measured_costs=True)
    step = max(a["end"] for a in replay)
    return 1 - sum(a["end"] - a["start"] for a in replay) / (ranks * step)


@checker("03.1", "Write the body of gpipe_bubble(stage_costs, M), then run this cell again.")
def check_gpipe_bubble(gpipe_bubble: Callable[[Sequence[float], int], float]) -> str:
    """GPipe's idle share with unequal stages, against a replay of the schedule."""
    for costs, m in STAGE_COST_CASES:
        got = float(answer(gpipe_bubble, list(costs), m))
        want = replayed_bubble(costs, m)
        if abs(got - want) > 1e-9:
            k = len(costs)
            hint = ("that is the formula for equal stages; here the slowest stage sets the "
                    "pace: how long does the forward pass of all M micro-batches take?"
                    if abs(got - (k - 1) / (m + k - 1)) < 1e-9 else
                    "the idle share is the device time a step lasts, less the time each "
                    "stage is busy with its own work; the step lasts from the first forward "
                    "to the last backward, and the slowest stage stretches it")
            raise Wrong(f"gpipe_bubble({list(costs)}, M={m}) = {got:.4f}; the replayed GPipe "
                        f"step is idle {want:.4f} of the device time", hint)
    floor = replayed_bubble((1, 1, 1, 2), 512)
    return (f"Your formula matches the replay for every case tried. Note what imbalance does: "
            f"with costs [1, 1, 1, 2] even M=512 leaves the devices idle {floor:.1%} of the "
            "time, because three stages wait for the slow one however many micro-batches flow.")


def fewest_microbatches(stages: int, bubble: float) -> int:
    """The smallest M whose drawn GPipe timeline idles at most ``bubble``."""
    m = 1
    while drawn_bubble(stages, m) > bubble + 1e-12:
        m += 1
    return m


@checker("03.2", "Set fewest_m to a number, then run this cell again.")
def check_fewest_m(fewest_m: int) -> str:
    """The fewest micro-batches that keep a 4-stage GPipe bubble at or under 10%."""
    got = given(fewest_m)
    if not isinstance(got, int) or got < 1:
        raise Wrong(f"fewest_m = {got!r}; expected a whole number of micro-batches, 1 or more")
    want = fewest_microbatches(TARGET_STAGES, TARGET_BUBBLE)
    if got < want:
        raise Wrong(f"With M={got} the bubble is {drawn_bubble(TARGET_STAGES, got):.1%}, over "
                    f"{TARGET_BUBBLE:.0%}",
                    "filling and draining the pipeline idles every stage for the same K-1 "
                    "ticks whatever M is; more micro-batches only add busy ticks, so M must "
                    "grow until those idle ticks are a tenth of the step")
    if got > want:
        raise Wrong(f"M={got} keeps the bubble under {TARGET_BUBBLE:.0%}, but fewer micro-batches "
                    "do too (and each extra one makes the micro-batches smaller and the GPU "
                    "less busy)",
                    "the fewest micro-batches that meet the target win: each one more only "
                    "shrinks the micro-batches further")
    return (f"M={want}: the bubble is {drawn_bubble(TARGET_STAGES, want):.1%}, and "
            f"{drawn_bubble(TARGET_STAGES, want - 1):.1%} with one fewer. The batch must split "
            f"into {want} micro-batches, so it needs at least {want} samples.")


def counted_ticks(stages: int, microbatches: int) -> list[tuple[int, int]]:
    """(busy, idle) ticks of each stage, counted on the lesson's drawn GPipe timeline."""
    rows = [r for r in gpipe_timeline(stages, microbatches).splitlines() if r.startswith("stage")]
    cells = [row.split(":", 1)[1].split() for row in rows]
    return [(len(c) - c.count(".."), c.count("..")) for c in cells]


@checker("03.3", "Write the body of stage_ticks(K, M), then run this cell again.")
def check_stage_ticks(stage_ticks: Callable[[int, int], tuple[int, int]]) -> str:
    """A GPipe stage's busy and idle ticks, against the cells of ``gpipe_timeline``."""
    for k, m in ((2, 1), (2, 4), (4, 4), (4, 16), (3, 7)):
        got = answer(stage_ticks, k, m)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise Wrong(f"stage_ticks({k}, {m}) = {got!r}; expected a pair (busy, idle)")
        busy, idle = counted_ticks(k, m)[0]
        if got[0] != busy:
            raise Wrong(f"stage_ticks({k}, {m}) says {got[0]} busy ticks; the timeline has "
                        f"{busy}", "each micro-batch costs a stage one forward tick and one "
                        "backward tick")
        if got[1] != idle:
            hint = ("the pipeline fills once and drains once per step, however many "
                    "micro-batches flow: does that wait depend on M?" if got[1] != k - 1 else
                    "count both ends: the forwards fill the pipeline, the backwards drain it")
            raise Wrong(f"stage_ticks({k}, {m}) says {got[1]} idle ticks; the timeline has {idle}",
                        hint)
    shares = ", ".join(f"M={m}: {counted_ticks(4, m)[0][1]} idle of "
                       f"{sum(counted_ticks(4, m)[0])}" for m in (4, 16, 64))
    return ("Right. Filling and draining cost every stage 2(K-1) ticks whatever M is; more "
            "micro-batches only add busy ticks. So the bubble, idle / (busy + idle) = "
            f"(K-1)/(M+K-1), shrinks like 1/M but never reaches zero (K=4: {shares}).")


def bubble_hint(schedule: str, k: int, m: int, v: int, got: float) -> str:
    """From the likely misconception behind a wrong ``bubble`` to the principle."""
    if abs(got - (k - 1) / (v * m)) < 1e-9:
        return ("that is the bubble as a fraction of the ideal step's time, the papers' form; "
                "the exercise asks for the idle share of the whole step, in which the idle "
                "time itself counts")
    return {
        "gpipe": "a rank idles only while the pipeline fills and drains (lesson 03's bubble); "
        "its share is that idle time over the whole step, idle time included",
        "1f1b": "1F1B reorders the work within the step but does not shorten the ramps",
        "interleaved_1f1b": "with v chunks per rank, each piece of work is 1/v as long, so the "
        "ramps shrink v-fold; the work each rank does per micro-batch does not",
        "zero_bubble": "the backward is two pieces, I and W, each as long as F; the W's, which "
        "no rank waits for, fill the ramps, so count the work per micro-batch and what is left "
        "of the ramps",
    }[schedule]


@checker("04.1", "Write the body of bubble(schedule, K, M, v), then run this cell again.")
def check_bubble(bubble: Callable[[str, int, int, int], float]) -> str:
    """The ideal idle share of all four schedules, against the lesson's ``bubble_theory``."""
    for schedule in SCHEDULE_NAMES:
        chunks = (1,) if CHUNKS_PER_RANK[schedule] == 1 else (1, 2, 4)
        for k, m in ((2, 4), (4, 8), (8, 16)):
            for v in chunks:
                got = float(answer(bubble, schedule, k, m, v))
                want = bubble_theory(schedule, k, m, v)
                if abs(got - want) > 1e-9:
                    hint = bubble_hint(schedule, k, m, v, got)
                    raise Wrong(f"bubble({schedule!r}, K={k}, M={m}, v={v}) = {got:.4f}; the "
                                f"ideal schedule idles {want:.4f}", hint)
    return ("All four schedules match. At K=4, M=8: "
            + ", ".join(f"{s} {bubble_theory(s, 4, 8, CHUNKS_PER_RANK[s]):.1%}"
                        for s in SCHEDULE_NAMES) + " (v as in this lesson: 2 for the last two).")


def peak_reference(schedule: str, stages: int, microbatches: int, stage: int,
                   weights: int, activation: int) -> int:
    """Weights plus the in-flight micro-batches' activations at ``stage``'s peak."""
    layout = ClusterLayout(schedule, pp=stages, schedule=schedule)
    return weights + layout.in_flight(microbatches)[stage] * activation


def peak_hint(schedule: str, k: int, m: int, held: float, no_weights: bool) -> str:
    """From the likely misconception behind a wrong ``peak_bytes`` to the principle
    (``no_weights``: the answer is right but for the weights)."""
    if no_weights:
        return ("a stage holds its weights all the time, on top of the activations of the "
                "micro-batches in flight")
    if schedule == "gpipe":
        return ("GPipe runs every forward before the first backward, and a micro-batch's "
                "activations are freed only by its backward")
    if held == m:
        return ("that is GPipe's count: 1F1B starts the backwards after a warm-up, and each "
                "backward frees its micro-batch")
    return ("1F1B's warm-up is shorter the later the stage: how many forwards does stage k run "
            "before its first backward?")


@checker("04.2", "Write the body of peak_bytes(schedule, K, M, stage, weights, activation), "
                 "then run this cell again.")
def check_peak_bytes(peak_bytes: Callable[[str, int, int, int, int, int], int]) -> str:
    """A stage's peak memory under GPipe and 1F1B, against the ``fits`` layouts' rule."""
    weights, activation = 3 * 2**30, 2**30
    for schedule in SCHEDULES:
        for k, m in ((4, 8), (4, 4), (8, 32)):  # M >= K: Schedule1F1B refuses fewer
            for stage in range(k):
                got = int(answer(peak_bytes, schedule, k, m, stage, weights, activation))
                want = peak_reference(schedule, k, m, stage, weights, activation)
                if got != want:
                    held = (got - weights) / activation
                    hint = peak_hint(schedule, k, m, held, got + weights == want)
                    raise Wrong(f"peak_bytes({schedule!r}, K={k}, M={m}, stage={stage}) says "
                                f"{held:g} micro-batches in flight; the schedule holds "
                                f"{(want - weights) // activation}", hint)
    budget = 12 * 2**30
    verdict = {s: all(peak_reference(s, 4, 16, k, weights, activation) <= budget for k in range(4))
               for s in SCHEDULES}
    return ("Every stage of every case tried is right. Example: 4 stages, 16 micro-batches, 3 GiB of weights and "
            "1 GiB of activations per micro-batch per stage, 12 GiB per GPU: "
            + ", ".join(f"{s} {'fits' if ok else 'does not fit'}" for s, ok in verdict.items())
            + ".")


@checker("04.3", "Write the body of warmup(K, M, stage), then run this cell again.")
def check_warmup(warmup: Callable[[int, int, int], int]) -> str:
    """1F1B's warm-up: the bubble stays GPipe's, the activations held are the fewest."""
    for k, m in ((2, 4), (4, 8), (4, 4), (3, 6)):
        counts = [answer(warmup, k, m, stage) for stage in range(k)]
        if not all(isinstance(c, int) for c in counts):
            raise Wrong(f"warmup at K={k}, M={m} gave {counts}; expected whole numbers")
        fewest = [min(m, k - stage) for stage in range(k)]
        try:
            order = warmup_order(k, m, counts)
            replay = ideal_timeline(order, k, 1)
        except ValueError as error:
            raise Wrong(f"warm-ups {counts} at K={k}, M={m}: {error}",
                        "a stage cannot run a micro-batch's backward before its forward") from None
        idle, gpipe = idle_share(replay, k), bubble_theory("gpipe", k, m)
        if idle > gpipe + 1e-9:
            raise Wrong(f"with warm-ups {counts} at K={k}, M={m} the step idles {idle:.1%}, "
                        f"more than GPipe's {gpipe:.1%}",
                        "stage k's first backward waits for the gradient to come back from "
                        "the last stage: how many other micro-batches must stage k have in "
                        "flight to stay busy during one round trip?")
        held = [round(h) for h in most_held(order, k, 1)]
        if held != fewest:
            raise Wrong(f"warm-ups {counts} at K={k}, M={m} keep GPipe's bubble but hold "
                        f"{held} micro-batches' activations per stage; {fewest} is enough",
                        "each forward run before the first backward keeps one more "
                        "micro-batch's activations: run only as many as the wait needs")
    return ("Right: between a micro-batch's forward and its backward, stage k must stay busy "
            "while it travels to the last stage and back; K-k micro-batches in flight cover "
            "that round trip exactly. After the warm-up, each backward frees one micro-batch "
            "as each forward adds one, so stage k never holds more than K-k, where GPipe's "
            "warm-up of M holds all M for the same bubble. One fewer and the stage idles on "
            "every micro-batch.")
