"""Lesson 05's pictures draw the planner's own plans, and refuse what they cannot draw."""

from __future__ import annotations

import pytest
import torch

from helpers.core.drawing import DPI
from helpers.core.sizes import format_bytes
from helpers.models.llama import LMConfig, TinyLM, build_lm
from helpers.placement.diagrams import (
    device_map_diagram,
    execution_path,
    offloaded_layers,
    peak_on_main,
    reserve_diagram,
    run_label,
)
from helpers.placement.planner import Plan, plan_device_map
from helpers.placement.sizing import module_sizes

CONFIG = LMConfig(vocab=4096, hidden=128, blocks=6, ffn=512, heads=2)


@pytest.fixture(scope="module")
def lm() -> TinyLM:
    return build_lm(CONFIG, seed=0)


def _budgets(lm: TinyLM, *shares: float, disk: bool = True) -> dict:
    total = module_sizes(lm)[""]
    devices = [*range(len(shares) - 1), "cpu"]
    budgets = {d: int(s * total) for d, s in zip(devices, shares, strict=True)}
    return budgets | ({"disk": 10 * total} if disk else {})


@pytest.fixture(scope="module")
def three(lm) -> dict[str, Plan]:
    """Three GPUs that can each hold most of the model: "auto" and "sequential" differ."""
    budgets = _budgets(lm, 0.9, 0.9, 0.9, 0.3)
    return {s: plan_device_map(lm, budgets, strategy=s) for s in ("auto", "sequential")}


@pytest.fixture(scope="module")
def tight(lm) -> dict[str, Plan]:
    """Two small GPUs: layers go to the CPU and the disk, with and without the reserve."""
    budgets = _budgets(lm, 0.45, 0.35, 0.25)
    return {f"reserve {r}": plan_device_map(lm, budgets, strategy="sequential",
                                            reserve_largest_layer=r) for r in (False, True)}


def test_the_activation_visits_each_gpu_in_order_and_offloaded_layers_run_on_gpu_0(three, tight):
    assert execution_path(three["auto"]) == [0, 1, 2]
    assert execution_path(three["sequential"]) == [0, 1]
    plain = tight["reserve False"]
    assert plain.on("cpu") and plain.on("disk")  # so they run on GPU 0, after GPU 1
    assert execution_path(plain) == [0, 1, 0]
    with pytest.raises(ValueError, match="places no module"):
        execution_path(Plan({}, {0: 1}, {}))


def test_run_labels_merge_consecutive_blocks_only():
    assert run_label(["blocks.0", "blocks.1", "blocks.2"]) == "blocks.0–2"
    assert run_label(["embed", "blocks.0", "blocks.1"]) == "embed\nblocks.0–1"
    assert run_label(["blocks.0", "blocks.2"]) == "blocks.0\nblocks.2"
    assert run_label(["a", "b", "c", "d"]) == "a\n...\nd"


def test_the_device_map_diagram_draws_each_plans_devices_layers_and_hops(lm, three):
    d = device_map_diagram(three)
    auto, sequential = three["auto"], three["sequential"]
    for plan in three.values():  # every device of every row, with the budget the fill used
        for device, budget in plan.budgets.items():
            if device != "disk":
                assert f"budget {format_bytes(budget)}" in d.labels
    assert d.labels.count("GPU 0") == 2 and d.labels.count("disk") == 2
    # what each GPU holds, as the planner placed it: "auto" caps GPUs 0 and 1
    assert auto.budgets[0] < auto.max_memory[0] and f"budget {format_bytes(auto.budgets[0])}" \
        in d.labels
    assert "blocks.0–3" in d.labels and "blocks.4–5\nnorm\nhead" in d.labels
    assert auto.on(1) == [f"blocks.{i}" for i in range(4)]
    assert auto.on(0) == ["embed"] and len(sequential.on(0)) > 4  # "sequential" fills GPU 0
    assert run_label(sequential.on(0)) in d.labels and not sequential.on(2)
    held = [label for label in d.labels if label.startswith("held back")]
    assert held == [f"held back\n{format_bytes(p.reserved[0])}" for p in three.values()]
    assert d.labels.count("nothing") == 2 + 3  # auto: CPU, disk; sequential: GPU 2, CPU, disk
    # one arrow per hop of the activation, none for copies (nothing is offloaded)
    assert d.arrows == (len(execution_path(auto)) - 1) + (len(execution_path(sequential)) - 1)
    assert d.title.startswith("auto puts layers on 3 of 3 GPUs; sequential puts layers on 2 of 3")
    assert d.figure.get_size_inches()[0] * DPI <= 940
    assert device_map_diagram(three, simulated=True).title.endswith("(simulated GPUs: planning only)")


def test_offloaded_weights_get_one_copy_arrow_per_device_they_come_from(tight):
    plain = tight["reserve False"]
    d = device_map_diagram({"plain": plain})
    copies = d.labels.count("weights copied to GPU 0, every forward")
    assert copies == 2  # from the CPU and from the disk
    assert d.arrows == (len(execution_path(plain)) - 1) + copies
    assert "copied in for every forward" in d.title


def test_the_diagram_refuses_an_empty_dict_and_a_device_without_budget(three):
    with pytest.raises(ValueError, match="no plans to draw"):
        device_map_diagram({})
    auto = three["auto"]
    wrong = Plan({**auto.device_map, "head": 7}, auto.budgets, auto.sizes)
    with pytest.raises(ValueError, match="puts 'head' on 7, which has no budget"):
        device_map_diagram({"wrong": wrong})


def test_offloaded_layers_are_leaves_or_unsplittable_modules(lm):
    budgets = _budgets(lm, 0.45, 0.35, 0.25)
    whole = plan_device_map(lm, budgets, strategy="sequential", reserve_largest_layer=False)
    assert list(offloaded_layers(lm, whole)) == whole.on("cpu") + whole.on("disk")
    leaves = offloaded_layers(lm, whole, no_split=[])  # a block splits into its leaves
    assert "blocks.5.mlp.up_proj" in leaves and "blocks.5" not in leaves
    assert max(leaves.values()) == module_sizes(lm)["head"]


def test_the_reserve_is_what_keeps_the_copied_in_layer_within_the_budget(lm, tight):
    for label, plan in tight.items():
        peak, name, size = peak_on_main(lm, plan)
        assert name == "head" and size == module_sizes(lm)["head"]
        assert peak == plan.used[0] + size
        assert (peak > plan.budgets[0]) == (label == "reserve False"), label
    d = reserve_diagram(lm, tight)
    plain, kept = (peak_on_main(lm, p)[0] for p in tight.values())
    assert f"over by {format_bytes(plain - tight['reserve False'].budgets[0])}" in d.labels
    assert f"fits: peak {format_bytes(kept)}" in d.labels
    assert d.labels.count("head\ncopied in") == 1 and d.arrows == 2  # no reserve: it overflows
    assert d.labels.count("head\ncopied in\ninto the room\nheld back") == 1
    assert "copying in 'head'" in d.title and "overflows GPU 0" in d.title
    assert d.figure.get_size_inches()[0] * DPI <= 940


def test_the_reserve_diagram_refuses_a_plan_that_offloads_nothing(lm, three):
    with pytest.raises(ValueError, match="offloads nothing"):
        reserve_diagram(lm, {"auto": three["auto"]})
    with pytest.raises(ValueError, match="no plans to draw"):
        reserve_diagram(lm, {})
    stray = Plan({"nowhere": "cpu"}, {0: 1, "cpu": 1}, {"nowhere": 1})
    with pytest.raises(ValueError, match="'nowhere', which is not in the model"):
        offloaded_layers(lm, stray)


def test_a_cpu_only_plan_runs_on_the_cpu_and_copies_from_disk(lm):
    total = module_sizes(lm)[""]
    plan = plan_device_map(lm, {"cpu": int(0.65 * total), "disk": 10 * total})
    assert execution_path(plan) == ["cpu"]
    d = device_map_diagram({"cpu": plan})
    assert "weights copied to CPU, every forward" in d.labels
    assert d.title.startswith("cpu: every layer runs on the CPU")


# The lesson's "Break it" and its one-line verdicts, from helpers/runs/placement (no file of
# their own: they serve the same lesson as the pictures above).

def test_a_stale_offload_folder_is_reused_unchecked_and_the_proof_catches_it(tmp_path):
    from accelerate.utils import offload_state_dict

    from helpers.core.checks import Proof, Verdict, max_abs_diff
    from helpers.placement.offload import DISPATCH_TOLERANCE, disk_tensors
    from helpers.runs.placement.broken import dispatch_unchecked

    small = LMConfig(vocab=64, hidden=16, blocks=2, ffn=32, heads=2)
    reference, broken = build_lm(small, seed=0), build_lm(small, seed=0)
    device_map = {"embed": "cpu", "blocks": "cpu", "norm": "disk", "head": "disk"}
    with pytest.raises(ValueError, match="holds no index.json"):
        dispatch_unchecked(broken, device_map, tmp_path)
    offload_state_dict(str(tmp_path), disk_tensors(build_lm(small, seed=1), device_map))
    dispatch_unchecked(broken, device_map, tmp_path)
    ids = torch.arange(8).view(1, 8)
    with torch.no_grad():
        diff = max_abs_diff(reference(ids), broken(ids))
    verdict = Verdict("the dispatched model matches one device",
                      [Proof("logits", diff, DISPATCH_TOLERANCE)])
    assert not verdict.ok and verdict.line().startswith("✗")


def test_the_memory_verdict_is_exact_or_names_the_kind_that_differs():
    from helpers.memory.ledger import DeviceMemory, Ledger
    from helpers.runs.placement.report import ledger_verdict

    measured = Ledger({"one device": DeviceMemory(10, 10, 20, 7)})
    assert ledger_verdict(measured, measured, "same").line() == "✓ same (4 checks, all exact)"
    off = Ledger({"one device": DeviceMemory(10, 10, 20, 8)})
    verdict = ledger_verdict(measured, off, "same")
    assert not verdict.ok and "one device activations" in verdict.line()
