"""Lessons 01 and 02's pictures draw what the lessons run, and refuse what they cannot draw."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_tools.run_notebooks import lessons
from helpers.core.drawing import DPI, rank_colour
from helpers.model_parallel.diagrams import (
    ALL_THREE,
    DEBUGGING,
    WAYS_TO_CUT,
    Busy,
    busy_shares,
    naive_timeline,
    stages_diagram,
    two_devices_diagram,
    ways_to_cut_diagram,
)
from helpers.model_parallel.stages import StagedModel, stage_bytes
from helpers.models.toy import ToyModel

CPU = torch.device("cpu")


def _lesson(number: str) -> str:
    found = [p.stem for p in lessons([number + "_"])]
    assert len(found) == 1, (number, found)
    return found[0]


def test_the_course_map_names_every_lesson_once_and_by_its_topic():
    named = [n for way in WAYS_TO_CUT for n in way.lessons] + [DEBUGGING, ALL_THREE]
    assert sorted(named) == [p.stem[:2] for p in lessons()]
    topics = {"inside layers": ("tensor_parallel", "expert_parallel"), "the data": ("data_parallel",
                                                                  "context_parallel")}
    for way in WAYS_TO_CUT:
        if way.cut in topics:
            assert all(any(t in _lesson(n) for t in topics[way.cut]) for n in way.lessons), way
    assert "pipeline" in _lesson(WAYS_TO_CUT[0].lessons[2])


def test_the_course_map_draws_each_way_with_its_lessons():
    d = ways_to_cut_diagram()
    for way in WAYS_TO_CUT:
        assert f"cut {way.cut}" in d.labels and way.technique in d.labels
        assert any(label.endswith(", ".join(way.lessons)) for label in d.labels)
    # between layers: 4 whole layers; inside: 8 halves; batch: 8 layers and 2 half-batches
    assert sum(label.startswith("½L") for label in d.labels) == 8
    assert d.labels.count("½") == 2 and d.labels.count("batch") == 2
    assert d.figure.get_size_inches()[0] * DPI <= 940
    with pytest.raises(ValueError, match="got 2 ways"):
        ways_to_cut_diagram(WAYS_TO_CUT[:2])


def test_the_naive_timeline_runs_one_stage_at_a_time_in_forward_then_backward_order():
    events = naive_timeline([1.0, 2.0, 3.0], [2.0, 4.0, 6.0], copy=0.5)
    compute = [e for e in events if e.phase != "copy"]
    assert [(e.stage, e.phase) for e in compute] == [
        (0, "forward"), (1, "forward"), (2, "forward"),
        (2, "backward"), (1, "backward"), (0, "backward")]
    for a, b in zip(events, events[1:], strict=False):
        assert a.end == b.start  # one after another: nothing ever overlaps
    assert sum(e.phase == "copy" for e in events) == 4  # 2 cuts, each way
    assert events[-1].end == 18.0 + 4 * 0.5
    assert sum(busy_shares(naive_timeline([1.0, 2.0], [3.0, 1.0]))) == pytest.approx(1.0)
    assert naive_timeline([1.0], [2.0]) == [Busy(0, "forward", 0.0, 1.0),
                                            Busy(0, "backward", 1.0, 3.0)]


@pytest.mark.parametrize("args, match", [
    (([1.0, 1.0], [1.0]), "2 forward and 1 backward"),
    (([], []), "0 forward"),
    (([1.0, -2.0], [1.0, 1.0]), r"forward times \[1.0, -2.0\]"),
    (([1.0], [1.0], -1.0), r"copy times \[-1.0\]"),
])
def test_the_naive_timeline_refuses_bad_times(args, match):
    with pytest.raises(ValueError, match=match):
        naive_timeline(*args)


def test_two_devices_draws_the_cut_the_model_makes():
    model = ToyModel(CPU, CPU, 30, 7, 3)
    inputs = torch.randn(4, 30)
    d = two_devices_diagram(model, inputs)
    cut = tuple(model.relu(model.net1(inputs)).shape)
    assert f"activation {cut}" in d.labels and f"gradient {cut}" in d.labels
    assert "net1, relu" in d.labels and "net2" in d.labels
    assert f"{30 * 7 + 7:,} parameters" in d.labels and f"{7 * 3 + 3:,} parameters" in d.labels
    # the timeline: two forwards and two backwards, and each device idle twice or once
    assert d.labels.count("forward") == 2 and d.labels.count("backward") == 2
    assert d.labels.count("idle") == 3
    assert {rank_colour(0), rank_colour(1)} <= {b[4] for b in d.boxes}
    assert d.arrows >= 2 and "Only one device works at a time" in d.title


def test_two_devices_refuses_a_model_not_cut_once():
    layers = [(f"l{i}", nn.Linear(4, 4)) for i in range(3)]
    with pytest.raises(ValueError, match=r"cut at \[1, 2\]"):
        two_devices_diagram(StagedModel(layers, [1, 2], [CPU] * 3), torch.randn(2, 4))


def test_stages_draws_each_stage_its_layers_and_its_share():
    torch.manual_seed(0)
    layers = [("a", nn.Linear(8, 16)), ("b", nn.ReLU()), ("c", nn.Linear(16, 64)),
              ("d", nn.Linear(64, 2))]
    model = StagedModel(layers, [2, 3], [CPU] * 3)
    d = stages_diagram(model, torch.randn(5, 8), "Net")
    sizes = stage_bytes(model)
    assert all(name in d.labels for name, _ in layers)
    for k, stage in enumerate(model.stages):
        params = sum(p.numel() for p in stage.parameters())
        assert f"{params:,} parameters, {sizes[k] / 1e6:.1f} MB" in d.labels
        assert f"stage {k}: device {k}" in d.labels
    assert "activation (5, 16)" in d.labels and "activation (5, 64)" in d.labels
    heavy = max(range(3), key=sizes.__getitem__)
    assert d.title.startswith(f"Net in 3 stages: stage {heavy} holds "
                              f"{sizes[heavy] / sum(sizes):.0%}")
    assert d.labels.count("its gradient") == 2 and d.arrows == 4
    with pytest.raises(TypeError, match="model is a Linear; valid: a StagedModel"):
        stages_diagram(nn.Linear(2, 2), torch.randn(1, 2))


def test_drawing_reads_shapes_without_touching_the_model():
    layers = [("conv", nn.Conv2d(3, 4, 3)), ("bn", nn.BatchNorm2d(4)), ("flat", nn.Flatten(1))]
    model = StagedModel(layers, [2], [CPU] * 2)
    model.stages[1].eval()  # mixed modes must come back as they were
    before = {k: v.clone() for k, v in model.state_dict().items()}
    d = stages_diagram(model, torch.randn(2, 3, 6, 6))
    assert "activation (2, 4, 4, 4)" in d.labels
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.stages[0].training and not model.stages[1].training
