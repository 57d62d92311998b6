"""Lessons 03 and 04's pictures: every box an action the schedule runs, in PyTorch's order."""

import struct
from types import SimpleNamespace

import pytest
from torch import nn
from torch.distributed.pipelining import ScheduleGPipe

from helpers.pipeline.diagrams import (
    chunks_diagram,
    ideal_timeline,
    idle_share,
    most_held,
    pipeline_diagram,
    schedule_order,
    schedules_diagram,
    sequence,
    warmup_order,
)
from helpers.pipeline.events import bubble_theory
from helpers.pipeline.runtime import CHUNKS_PER_RANK
from helpers.runs.schedules.transfers import planned_sends

# What each rank of a two-rank launch of lesson 04's worker ran at M=4 (record_actions),
# rank by rank: kind, chunk, micro-batch.
RAN = {
    "gpipe": ["F0.0 F0.1 F0.2 F0.3 B0.0 B0.1 B0.2 B0.3",
              "F1.0 F1.1 F1.2 F1.3 B1.0 B1.1 B1.2 B1.3"],
    "1f1b": ["F0.0 F0.1 B0.0 F0.2 B0.1 F0.3 B0.2 B0.3",
             "F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F1.3 B1.3"],
    "interleaved_1f1b": [
        "F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3",
        "F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3"],
    "zero_bubble": [
        "F0.0 F0.1 F2.0 F2.1 I2.0 W2.0 F0.2 I2.1 W2.1 F0.3 I0.0 W0.0 F2.2 I0.1 W0.1 F2.3 "
        "I2.2 W2.2 I2.3 W2.3 I0.2 W0.2 I0.3 W0.3",
        "F1.0 F1.1 F3.0 I3.0 F3.1 I3.1 W3.0 F1.2 I1.0 W3.1 F1.3 I1.1 W1.0 F3.2 I3.2 W1.1 "
        "F3.3 I3.3 W3.2 I1.2 W3.3 I1.3 W1.2 W1.3"],
}


@pytest.mark.parametrize("name", RAN)
def test_the_drawn_order_is_the_order_pytorch_ran(name):
    order = schedule_order(name, 2, 4)
    assert [" ".join(sequence(order, r)) for r in range(2)] == RAN[name]


def test_gpipe_s_order_is_pytorch_s_own_plan_at_other_sizes():
    plan = ScheduleGPipe(SimpleNamespace(num_stages=3), 5, loss_fn=nn.MSELoss()).pipeline_order
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B"}  # (and a REDUCE_GRAD, no compute)
    for rank in range(3):
        torch_steps = [f"{kinds[a.computation_type.name]}{a.stage_index}.{a.microbatch_index}"
                       for a in plan[rank] if a is not None and a.computation_type.name in kinds]
        assert sequence(schedule_order("gpipe", 3, 5), rank) == torch_steps


def test_activations_held_follow_the_rules_and_the_measured_order():
    assert most_held(schedule_order("gpipe", 4, 8), 4, 1) == [8] * 4  # all M
    assert most_held(schedule_order("1f1b", 4, 8), 4, 1) == [4, 3, 2, 1]  # K - k
    # lesson 04's measured peaks: interleaved above 1F1B, zero bubble equal on the first rank
    # and above it on the last
    assert most_held(schedule_order("interleaved_1f1b", 2, 4), 2, 2) == [2.5, 1.5]
    assert most_held(schedule_order("zero_bubble", 2, 4), 2, 2) == [2.0, 2.0]


@pytest.mark.parametrize("name, k, m", [("gpipe", 2, 4), ("1f1b", 4, 8), ("gpipe", 3, 1),
                                        ("interleaved_1f1b", 2, 4), ("zero_bubble", 2, 4)])
def test_each_replay_idles_its_formula_s_share(name, k, m):
    v = CHUNKS_PER_RANK[name]
    replay = ideal_timeline(schedule_order(name, k, m), k, v)
    assert idle_share(replay, k) == pytest.approx(bubble_theory(name, k, m, v))


def test_a_warm_up_too_short_idles_more_and_one_that_cannot_run_is_refused():
    early = ideal_timeline(warmup_order(2, 4, [1, 1]), 2, 1)
    assert idle_share(early, 2) == pytest.approx(0.5)
    assert bubble_theory("1f1b", 2, 4) == pytest.approx(0.2)
    with pytest.raises(ValueError, match=r"rank 1: B1\.0 waits on an action that comes later"):
        ideal_timeline(warmup_order(2, 4, [1, 0]), 2, 1)  # a backward before its forward


@pytest.mark.parametrize("call, words", [
    (lambda: warmup_order(2, 4, [5, 1]), r"warmup=\[5, 1\]; valid: 2 counts"),
    (lambda: schedule_order("dualpipe", 2, 4), "schedule='dualpipe'"),
    (lambda: schedule_order("1f1b", 4, 2), "microbatches=2"),
    (lambda: pipeline_diagram(1, 4), "stages=1"),
    (lambda: schedules_diagram(("gpipe", "gpipe"), 2, 4), "distinct"),
    (lambda: schedules_diagram(("gpipe", "looped"), 2, 4), "schedule='looped'"),
    (lambda: chunks_diagram(("1f1b",), 1), "ranks=1"),
])
def test_bad_input_is_refused_by_name(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def _png_width(diagram) -> int:
    return struct.unpack(">II", diagram.png()[16:24])[0]


def test_the_pipeline_diagram_draws_gpipe_s_actions_and_its_bubble():
    d = pipeline_diagram(2, 4)
    computed = [label for label in d.labels if label[0] in "FB" and label[1:].isdigit()]
    assert sorted(computed) == sorted(f"{k}{m}" for k in "FB" for m in range(4) for _ in range(2))
    assert d.labels.count("idle") == 3  # stage 0 between its passes, stage 1 at both ends
    assert "stage 1\nrank 1" in d.labels and "4 micro-batches" in d.labels
    assert any("= 1/5 = 20%" in label for label in d.labels)
    assert "idles 20% of the step" in d.title
    assert d.arrows == 1 + 2 * 2 + 1  # the queue, activations and gradients per stage, time
    assert _png_width(d) <= 940


def test_the_schedules_diagram_draws_every_action_and_what_each_rank_holds():
    names = ("gpipe", "1f1b", "interleaved_1f1b")
    d = schedules_diagram(names, 2, 4)
    actions = sum(len(sequence(schedule_order(n, 2, 4), r)) for n in names for r in range(2))
    digits = [label for label in d.labels if label.isdigit()]
    assert len(digits) == actions == 16 + 16 + 32
    held = [label for label in d.labels if label.endswith(("micro-batch", "micro-batches"))]
    assert held == ["4 micro-batches"] * 2 + ["2 micro-batches", "1 micro-batch",
                                              "2.5 micro-batches", "1.5 micro-batches"]
    assert "GPipe holds all 4 micro-batches at once, 1F1B at most 2" in d.title
    assert "interleaving idles 11% instead of 20%" in d.title
    assert _png_width(d) <= 940


def test_the_chunks_diagram_draws_the_cuts_the_sends_cross():
    d = chunks_diagram(("1f1b", "interleaved_1f1b"), 2)
    assert d.arrows == 1 + 3
    for name, crossings in (("1f1b", 1), ("interleaved_1f1b", 3)):
        v = CHUNKS_PER_RANK[name]
        assert sum(planned_sends(r, 2, v, 4) for r in range(2)) == 2 * 4 * crossings
    assert "chunk 3\nrank 1" in d.labels and "3 crossings" in d.labels
    assert "3 times forward instead of 1, and its gradient 3 times back" in d.title
