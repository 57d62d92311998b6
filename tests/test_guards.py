"""Guards for the correctness-critical helpers, found by mutation testing (``make mutants``).

Each test pins a behaviour that a plausible slip in the code would change: a boundary, a
default, a message a learner reads, a file property. All run in a few seconds, on the
CPU, without torchrun (the launcher runs tiny stand-in processes instead).
"""

import copy
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from helpers.core import devices, files
from helpers.core.checks import (
    StepComparison,
    StepResult,
    compare_steps,
    compare_training_step,
    max_abs_diff,
    snapshot,
    training_step,
)
from helpers.core.errors import DoesNotFitError, FolderError, LaunchError, ShardError
from helpers.distributed import launcher
from helpers.distributed.ranks import RESULT_ENV
from helpers.memory.saved import SavedTensorMeter
from helpers.model_parallel.stages import StagedModel, check_split_points, input_device
from helpers.placement.planner import device_of, largest_layer, parts_of, plan_device_map
from helpers.placement.sizing import module_sizes, parse_budgets, parse_size
from helpers.tensor_parallel import comm
from helpers.tensor_parallel.ffn import (
    FeedForward,
    FeedForwardShard,
    check_split,
    cut_shard,
    make_input,
    shard_vs_full,
    tp_simulate,
)
from helpers.tensor_parallel.proofs import checksums_match, eps, outputs_agree
from helpers.tensor_parallel.shards import (
    MANIFEST,
    chunk_file_bytes,
    describe_shards,
    load_shard,
    write_shards,
)

CPU, META = torch.device("cpu"), torch.device("meta")


# ---- stages ----------------------------------------------------------------------------


def _layers() -> list[tuple[str, nn.Module]]:
    torch.manual_seed(0)
    return [("l0", nn.Linear(4, 6)), ("act", nn.Tanh()), ("l1", nn.Linear(6, 3))]


def test_split_point_messages_give_the_valid_range():
    with pytest.raises(ValueError, match=r"valid: at most 3 stages \(2 split points\)$"):
        check_split_points([1, 2, 3], 3)
    with pytest.raises(ValueError, match=r"\(2 then 1\); valid: each cut after the previous one$"):
        check_split_points([2, 1], 3)


class _Where(nn.Module):
    """Passes its input through, noting the device it arrived on."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.device] = []

    def forward(self, x):
        self.seen.append(x.device)
        return x


def test_each_stage_lives_on_its_device_and_the_activation_follows():
    staged = StagedModel(_layers(), [2], [CPU, META])
    assert staged.stages[0].l0.weight.device == CPU
    assert staged.stages[1].l1.weight.device == META
    first, second = _Where(), _Where()
    out = StagedModel([("a", first), ("b", second)], [1], [CPU, META])(torch.randn(5, 4))
    assert first.seen == [CPU] and second.seen == [META] and out.device == META
    assert input_device(staged) == CPU
    assert input_device(StagedModel(_layers(), [1], [META, CPU])) == META
    assert input_device(nn.Linear(2, 2, device=META)) == META  # not staged: first parameter


def saved_activation_bytes(model: StagedModel, x: torch.Tensor) -> list[int]:
    """Peak bytes kept for backward per stage, for one training-mode forward (the meter's)."""
    parts = {str(k): stage for k, stage in enumerate(model.stages)}
    model.train()
    with SavedTensorMeter(model, parts) as meter:
        model(x)
        return [meter.peak.get(name, 0) for name in parts]


def test_saved_activations_are_counted_once_per_stage_without_the_weights():
    torch.manual_seed(0)
    x = torch.randn(5, 4)  # 80 bytes; the Tanh output is 5 x 6 floats = 120 bytes
    cut_after_tanh = StagedModel(_layers(), [2], [CPU, CPU])
    # stage 0: l0 keeps its input, Tanh its output; stage 1: l1 keeps that output again
    assert saved_activation_bytes(cut_after_tanh, x) == [200, 120]
    cut_before_tanh = StagedModel(_layers(), [1], [CPU, CPU])
    # stage 1: Tanh's output and l1's input are one tensor, counted once
    assert saved_activation_bytes(cut_before_tanh, x) == [80, 120]
    layers = [*_layers()[:2], ("drop", nn.Dropout(0.5)), ("l1", nn.Linear(6, 3))]
    dropping = StagedModel(layers, [2], [CPU, CPU])
    per_stage = saved_activation_bytes(dropping, x)  # dropout keeps its mask in training
    assert per_stage[0] == 200 and per_stage[1] > 120
    where = _Where()
    assert saved_activation_bytes(
        StagedModel([("a", _Where()), ("b", where)], [1], [CPU, META]), x
    ) == [0, 0]
    assert where.seen == [META]  # the activation went to the next stage's device


# ---- checks: one training step compared ------------------------------------------------


def test_snapshot_copies_gradients_and_zero_fills_missing_ones():
    class WithUnused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(2, 2)
            self.unused = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return self.used(x)

    model = WithUnused()
    model(torch.ones(1, 2)).sum().backward()
    grads, weights = snapshot(model)
    assert [n for n, _ in grads] == ["unused", "used.weight", "used.bias"]
    assert torch.equal(grads[0][1], torch.zeros(3)) and grads[0][1].device == CPU
    assert torch.equal(grads[2][1], torch.ones(2))  # d(sum)/d(bias) = 1
    model.used.bias.grad.add_(5.0)
    assert torch.equal(grads[2][1], torch.ones(2))  # a copy, not the live gradient
    assert torch.equal(weights[0][1], torch.ones(3))


def test_max_abs_diff_of_one_element_and_of_empty_tensors():
    assert max_abs_diff(torch.tensor([1.0]), torch.tensor([3.5])) == 2.5
    assert max_abs_diff(torch.zeros(0, 3), torch.zeros(0, 3)) == 0.0


def test_training_step_takes_one_sgd_step_with_lr_001_by_default():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    with torch.no_grad():
        expected_out = model(x)
    result = training_step(model, x, y)
    assert torch.equal(result.output, expected_out)
    assert result.loss == pytest.approx(nn.functional.mse_loss(expected_out, y).item())
    assert [n for n, _ in result.grads] == ["weight", "bias"] == [n for n, _ in result.weights]
    for w0, (_, g), (_, w1) in zip(before, result.grads, result.weights, strict=True):
        assert g.abs().max() > 0.05
        assert torch.allclose(w1, w0 - 0.01 * g, rtol=0, atol=1e-6)
    l1 = training_step(nn.Linear(3, 2), x, y, loss_fn=lambda o, t: (o - t).abs().sum(), lr=0.0)
    assert l1.loss == pytest.approx((l1.output - y).abs().sum().item(), rel=1e-6)


def test_a_split_model_matches_its_unsplit_self_and_a_changed_one_does_not():
    layers = _layers()
    reference = nn.Sequential(OrderedDict(copy.deepcopy(layers)))
    x, y = torch.randn(5, 4), torch.randn(5, 3)
    same = compare_training_step(
        reference, StagedModel(copy.deepcopy(layers), [2], [CPU, CPU]), x, y, lr=0.5
    )
    assert same == StepComparison(0.0, 0.0, 0.0, 0.0, "stages.0.l0.weight", "stages.0.l0.weight")
    reference = nn.Sequential(OrderedDict(copy.deepcopy(layers)))
    changed = StagedModel(copy.deepcopy(layers), [2], [CPU, CPU])
    with torch.no_grad():
        changed.stages[1].l1.bias.add_(0.5)
    diff = compare_training_step(reference, changed, x, y, lr=0.5)
    assert diff.output == pytest.approx(0.5, abs=1e-6)  # the bias adds 0.5 to every output
    assert diff.loss > 0.05 and diff.grads > 0.1 and diff.weights > 0.1
    assert diff.worst_grad == "stages.1.l1.bias" and diff.worst_weight == "stages.1.l1.bias"


def test_compare_steps_refuses_models_that_do_not_match():
    def step(*shapes):
        named = [(f"p{i}", torch.zeros(s)) for i, s in enumerate(shapes)]
        return StepResult(torch.zeros(1), 0.0, named, named)

    with pytest.raises(ValueError, match=r"the models have 2 and 1 parameters; they must match"):
        compare_steps(step(2, 3), step(2))
    with pytest.raises(ValueError, match=r"parameter p1 \(3,\) != p1 \(4,\)"):
        compare_steps(step(2, 3), step(2, 4))


def test_report_marks_each_difference_against_the_tolerance():
    c = StepComparison(0.0, 2e-6, 5e-7, 0.0, "fc.weight", "fc.bias")
    assert c.rows() == [
        ("outputs", 0.0),
        ("loss", 2e-6),
        ("gradients", 5e-7),
        ("updated weights", 0.0),
    ]
    assert c.report(1e-6).splitlines() == [
        "outputs          max |diff| ≈ 0.0e+00  OK (tolerance 1e-06)",
        "loss             max |diff| ≈ 2.0e-06  FAILED (tolerance 1e-06)",
        "gradients        max |diff| ≈ 5.0e-07  OK (tolerance 1e-06)",
        "updated weights  max |diff| ≈ 0.0e+00  OK (tolerance 1e-06)",
    ]
    with pytest.raises(AssertionError, match=r"^differs beyond tolerance 1e-06: loss\noutputs "):
        c.check(1e-6)
    assert c.check(2e-6) == c.report(2e-6)  # exactly at the tolerance passes
    assert c.report(2e-6).splitlines()[1].endswith(" OK (tolerance 2e-06)")
    both = StepComparison(1.0, 0.0, 1.0, 0.0, "g", "w")
    with pytest.raises(AssertionError, match=r"tolerance 0\.5: outputs, gradients \(worst: g\)\n"):
        both.check(0.5)


# ---- devices ---------------------------------------------------------------------------


@pytest.fixture
def fake_gpus(monkeypatch):
    def set_count(n):
        monkeypatch.setattr(devices, "gpu_count", lambda: n)

    return set_count


def test_machine_description():
    info = devices.MachineInfo("2.9", "12.1", 2, ["A100", "H100"], 8, True, True)
    assert info.describe() == (
        "torch 2.9; 2 GPU(s): A100, H100; 8 CPU core(s); backends: gloo, nccl"
    )
    bare = devices.MachineInfo("2.9", None, 0, [], 1, False, False)
    assert bare.describe() == "torch 2.9; 0 GPU(s): no CUDA GPU; 1 CPU core(s); backends: none"


def test_machine_info_reads_torch_and_the_gpus(monkeypatch):
    dist = devices.dist
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_gloo_available", lambda: False)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(devices.torch.cuda, "get_device_name", lambda i=None: f"gpu{i}")
    for count, nccl in ((0, False), (1, True), (2, True)):
        monkeypatch.setattr(devices, "gpu_count", lambda c=count: c)
        info = devices.machine_info()
        assert info.gpu_names == [f"gpu{i}" for i in range(count)]
        assert (info.gpu_count, info.nccl_available, info.gloo_available) == (count, nccl, False)
        assert info.torch_version == torch.__version__
        assert info.cuda_version == torch.version.cuda
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert not devices.machine_info().nccl_available  # GPUs, but no NCCL built in
    monkeypatch.setattr(dist, "is_available", lambda: False)
    monkeypatch.setattr(dist, "is_gloo_available", lambda: True)
    assert not devices.machine_info().gloo_available  # no torch.distributed at all


def test_cpu_cores_and_gpu_count_fallbacks(monkeypatch):
    monkeypatch.delattr(devices.os, "sched_getaffinity")
    monkeypatch.setattr(devices.os, "cpu_count", lambda: None)
    assert devices.cpu_cores() == 1
    monkeypatch.setattr(devices.os, "cpu_count", lambda: 3)
    assert devices.cpu_cores() == 3
    monkeypatch.setattr(devices.torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: False)
    assert devices.gpu_count() == 0
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: True)
    assert devices.gpu_count() == 4


def test_resolve_dtype_and_device_edges(fake_gpus):
    with pytest.raises(ValueError, match=r"unknown dtype torch\.int8"):
        devices.resolve_dtype(torch.int8)
    assert devices.resolve_dtype(torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match=r"^unknown device 'meta'; valid choices here: cpu$"):
        devices.resolve_device("meta")
    with pytest.raises(ValueError, match=r"^unknown device 'gpu0'; valid choices here: cpu$"):
        devices.resolve_device("gpu0")
    assert devices.resolve_device("cpu:0") == torch.device("cpu", 0)
    fake_gpus(2)
    assert devices.resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(
        ValueError,
        match=r"^device 'cuda:2' does not exist: this machine has 2 GPU\(s\); "
        r"valid here: cpu, cuda, cuda:0 \.\. cuda:1$",
    ):
        devices.resolve_device("cuda:2")
    with pytest.raises(ValueError, match=r"valid choices here: cpu, cuda, cuda:0 \.\. cuda:1$"):
        devices.resolve_device("tpu")


def test_in_process_plans(fake_gpus):
    plan = devices.plan_devices(8)
    assert plan.devices == [CPU] * 8 and plan.dtype == torch.float32  # 8 is still allowed
    assert plan.reason == (
        "8 logical devices on cpu (simulated: one CPU stands in for all 8, "
        "because this machine has 0 GPU(s))"
    )
    fake_gpus(1)
    plan = devices.plan_devices(3)
    assert plan.devices == [torch.device("cuda", 0)] * 3 and plan.dtype == torch.float32
    assert plan.reason == (
        "3 logical devices on cuda:0 (simulated: one GPU cuda:0 stands in for all 3, "
        "because this machine has 1 GPU(s))"
    )
    fake_gpus(2)
    plan = devices.plan_devices(2)
    assert plan.dtype == torch.float32 and plan.reason == "2 real device(s): one GPU each"
    assert devices.plan_devices(1, device="cuda:1").device_type == "cuda"


@pytest.mark.parametrize(
    "gpus,n,device,backend,reason",
    [
        (0, 2, "auto", "auto", "gloo on the CPU: this machine has no CUDA GPU"),
        (4, 4, "auto", "gloo", "gloo on the CPU, as requested"),
        (4, 2, "cpu", "auto", "gloo on the CPU, as requested"),
        (
            1,
            2,
            "auto",
            "auto",
            "gloo on the CPU: 2 ranks but only 1 GPU(s), and NCCL refuses two ranks on "
            "one GPU ('Multiple Ranks are using the same GPU')",
        ),
        (4, 2, "auto", "auto", "nccl: one GPU per rank (2 of 4 GPUs)"),
    ],
)
def test_process_plan_reasons(fake_gpus, gpus, n, device, backend, reason):
    fake_gpus(gpus)
    assert devices.plan_devices(n, processes=True, device=device, backend=backend).reason == reason


def test_process_refusals_offer_only_the_alternatives_that_exist(fake_gpus):
    fake_gpus(4)
    with pytest.raises(ValueError) as error:
        devices.plan_devices(2, processes=True, device="cpu", backend="nccl")
    assert str(error.value) == (
        "backend 'nccl' needs one GPU per rank (--device cpu was asked for); NCCL refuses two "
        "ranks on one GPU ('Multiple Ranks are using the same GPU'); valid: backend 'gloo' (CPU)"
    )
    fake_gpus(0)
    with pytest.raises(
        ValueError, match=r"0 GPU\(s\) for 1 ranks\).*valid: backend 'gloo' \(CPU\)$"
    ):
        devices.plan_devices(1, processes=True, backend="nccl")
    fake_gpus(1)
    with pytest.raises(ValueError, match=r"valid: device 'cpu' or 'auto', or at most 1 ranks$"):
        devices.plan_devices(2, processes=True, device="cuda")


# ---- files -----------------------------------------------------------------------------


def test_atomic_write_goes_through_a_hidden_sibling_and_is_world_readable(tmp_path, monkeypatch):
    renames = []
    real = files.os.replace

    def spy(src, dst):
        renames.append((Path(src), Path(dst)))
        real(src, dst)

    monkeypatch.setattr(files.os, "replace", spy)
    path = files.atomic_write_bytes(tmp_path / "a" / "b" / "c.bin", b"xyz")
    assert path.read_bytes() == b"xyz"
    ((src, dst),) = renames
    assert dst == path and src.parent == path.parent
    assert src.name.startswith(".c.bin.") and src.name.endswith(".tmp")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_failed_rename_reports_its_own_error_even_if_the_temporary_is_gone(tmp_path, monkeypatch):
    def vanish_then_fail(src, dst):
        os.unlink(src)
        raise OSError("rename failed (simulated)")

    monkeypatch.setattr(files.os, "replace", vanish_then_fail)
    with pytest.raises(OSError, match="rename failed"):
        files.atomic_write_bytes(tmp_path / "x.bin", b"1")
    assert list(tmp_path.iterdir()) == []


def test_json_is_written_indented_with_a_final_newline(tmp_path):
    path = files.atomic_write_json(tmp_path / "m.json", {"a": [1], "é": "ü"})
    assert (
        path.read_text(encoding="utf-8") == '{\n  "a": [\n    1\n  ],\n  "\\u00e9": "\\u00fc"\n}\n'
    )


def _folder(tmp_path, name="out", data=b"abc"):
    folder = tmp_path / name

    def fill(tmp):
        (tmp / "a.bin").write_bytes(data)

    files.write_verified_folder(folder, fill, meta={"kind": "test"})
    return folder


def test_verified_folder_is_filled_beside_its_target_and_lists_only_files(tmp_path):
    seen = []

    def fill(tmp):
        seen.append(tmp)
        (tmp / "a.bin").write_bytes(b"abc")
        (tmp / "sub").mkdir()

    folder = tmp_path / "x" / "y" / "out"
    manifest = files.write_verified_folder(folder, fill)
    assert seen[0].parent == folder.parent and seen[0].name.startswith(".out.tmp-")
    assert list(manifest["files"]) == ["a.bin"]
    assert sorted(p.name for p in folder.parent.iterdir()) == ["out"]


def test_stale_temporaries_are_removed_and_nothing_else(tmp_path):
    for name in (".out.tmp-1", ".out.old-2", ".out.keep"):
        (tmp_path / name).mkdir()
    (tmp_path / ".out.tmp-file").write_text("a file, not a leftover folder")
    _folder(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.keep", ".out.tmp-file", "out"]


def test_read_verified_names_what_is_wrong(tmp_path):
    folder = _folder(tmp_path)
    manifest = files.read_manifest(folder)
    with pytest.raises(FolderError, match=r"^manifest\.json lists no file nope$"):
        files.read_verified(folder, "nope", manifest)
    (folder / "a.bin").write_bytes(b"abd")
    with pytest.raises(
        ShardError, match=r"its sha256 is [0-9a-f]{16}\.\.\., expected [0-9a-f]{16}\.\.\.; the file"
    ):
        files.verify_folder(folder, ShardError)
    (folder / MANIFEST).unlink()
    with pytest.raises(ShardError, match="manifest.json is missing"):
        files.verify_folder(folder, ShardError)


def test_replace_and_remove_refuse_foreign_content(tmp_path):
    (tmp_path / "plain").write_text("x")
    with pytest.raises(FolderError, match=r"^plain is a file, not a folder; choose another path$"):
        files.write_verified_folder(tmp_path / "plain", lambda tmp: None)
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in "dcba":
        (mine / name).write_text(name)
    with pytest.raises(
        FolderError,
        match=r"\(a, b, c\); refusing to replace it; valid: a new folder, or one written by this series$",
    ):
        files.remove_verified_folder(mine)
    files.remove_verified_folder(tmp_path / "never-written")  # nothing there: no error
    folder = _folder(tmp_path)
    files.remove_verified_folder(folder)
    assert not folder.exists()


# ---- placement planner -----------------------------------------------------------------


def test_size_messages_name_the_value_and_what_is_missing():
    with pytest.raises(ValueError, match=r"^size = 'abc' is not a size; valid forms: an int"):
        parse_size("abc")
    with pytest.raises(
        ValueError, match=r"^size = ' 10 ' is not a size \(a string needs a unit\);"
    ):
        parse_size(" 10 ")
    with pytest.raises(ValueError, match=r"^size = 2\.5 is a float; valid forms"):
        parse_size(2.5)
    with pytest.raises(ValueError, match=r"write '10GB' for bytes;"):
        parse_size("10Gb")
    with pytest.raises(ValueError, match=r"^max_memory\['cpu'\] = 'lots' is not a size;"):
        parse_budgets({"cpu": "lots"})
    with pytest.raises(ValueError, match=r"^unknown device 'gpu' in max_memory; valid: GPU"):
        parse_budgets({"gpu": 1})


class _Scaled(nn.Module):
    """Own parameter, a child with buffers, own buffer: parts come in that order."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(2))
        self.norm = nn.BatchNorm1d(2)
        self.register_buffer("step", torch.zeros(1))


def test_parts_and_sizes_of_a_module():
    assert [n for n, _ in parts_of(_Scaled())] == ["scale", "norm", "step"]
    assert [n for n, _ in parts_of(_Scaled(), "m")] == ["m.scale", "m.norm", "m.step"]
    sizes = module_sizes(nn.Linear(4, 4))
    assert sizes == {"": 80, "weight": 64, "bias": 16}
    assert largest_layer([], {}, []) == 0


def test_planner_on_a_model_without_no_split_modules_and_on_cpu_or_disk_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))  # 288 bytes each
    plan = plan_device_map(model, {"cpu": 1000}, reserve_largest_layer=True)
    assert plan.device_map == {"0": "cpu", "1": "cpu"}
    assert plan.reserved == {"cpu": 0}  # nothing left to place after the last layer
    assert plan.sizes == module_sizes(model)
    tight = plan_device_map(model, {"cpu": 500, "disk": 1000}, reserve_largest_layer=True)
    assert tight.device_map == {"0": "disk", "1": "disk"}  # the CPU holds room for layer 1
    assert tight.reserved == {"cpu": 288}
    on_disk = plan_device_map(model, {"disk": 576}, reserve_largest_layer=True)
    assert on_disk.device_map == {"0": "disk", "1": "disk"}
    assert on_disk.reserved == {}  # disk is never a main device


def test_balanced_budgets_follow_accelerate_with_the_given_no_split_and_dtype():
    from accelerate.utils import get_balanced_memory

    from helpers.placement.tiny_lm import LMConfig, build_lm

    lm = build_lm(LMConfig(vocab=512, hidden=64, blocks=4, ffn=256, heads=2), seed=0)
    total = module_sizes(lm)[""]
    asked = {0: total, 1: total, "cpu": total}
    for no_split, dtype in ((["Block"], None), ([], None), (["Block"], torch.float16)):
        plan = plan_device_map(lm, asked, strategy="balanced", no_split=no_split, dtype=dtype)
        reference = get_balanced_memory(
            lm, max_memory=dict(asked), no_split_module_classes=no_split, dtype=dtype
        )
        assert plan.budgets == reference and plan.strategy == "balanced"
        assert plan.max_memory == asked
    tight = {0: total, 1: total // 5}
    assert set(plan_device_map(lm, tight, strategy="sequential").device_map.values()) == {0}
    balanced = get_balanced_memory(lm, max_memory=dict(tight), no_split_module_classes=["Block"])
    with pytest.raises(DoesNotFitError) as error:
        plan_device_map(lm, tight)  # "auto" balances GPU 0 down first: the model no longer fits
    assert f"max_memory = {tight!r} (balanced by 'auto': {balanced!r}); valid:" in str(error.value)
    with pytest.raises(DoesNotFitError) as error:
        plan_device_map(lm, {0: total // 3, 1: total // 3})  # balancing changes nothing here
    assert f"max_memory = {dict.fromkeys((0, 1), total // 3)!r}; valid:" in str(error.value)


def test_device_of_an_unmapped_tensor_names_it_and_the_keys():
    assert device_of("a.b.weight", {"a": 0, "a.b": "cpu"}) == "cpu"
    assert device_of("z.weight", {"": "disk"}) == "disk"
    with pytest.raises(
        KeyError, match=r"'x\.y' is in no module of the device map \(keys: \['a'\]\)"
    ):
        device_of("x.y", {"a": 0})


# ---- tensor parallel: f, g, costs, the FFN -----------------------------------------------


@pytest.fixture
def three_ranks(monkeypatch):
    """all_reduce as if three ranks held the same tensor: the sum is 3x, in place."""
    calls = []

    def all_reduce(tensor, op=None, group=None):
        calls.append((op, group))
        tensor.mul_(3)

    monkeypatch.setattr(comm.dist, "all_reduce", all_reduce)
    return calls


def test_f_is_identity_forward_and_all_reduce_backward(three_ranks):
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    y = comm.f(x, "G")
    assert torch.equal(y, x) and three_ranks == []
    grad = torch.tensor([0.5, 1.0])
    y.backward(grad)
    assert torch.equal(x.grad, 3 * grad) and torch.equal(grad, torch.tensor([0.5, 1.0]))
    assert three_ranks == [(comm.dist.ReduceOp.SUM, "G")]


def test_g_is_all_reduce_forward_and_identity_backward(three_ranks):
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    y = comm.g(x, "G")
    assert torch.equal(y, torch.tensor([3.0, -6.0])) and torch.equal(x, torch.tensor([1.0, -2.0]))
    y.backward(torch.tensor([0.5, 1.0]))
    assert torch.equal(x.grad, torch.tensor([0.5, 1.0]))
    assert three_ranks == [(comm.dist.ReduceOp.SUM, "G")]


def test_tp_forward_is_g_of_the_shard_of_f(three_ranks):
    shard = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        shard.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
    x = torch.tensor([[1.0, 1.0]], requires_grad=True)
    out = comm.tp_forward(shard, x, "G")
    assert torch.equal(out, torch.tensor([[9.0, 3.0]]))  # 3 ranks x [3, 1]
    out.sum().backward()
    assert torch.equal(x.grad, torch.tensor([[3.0, 9.0]]))  # f's backward sums the ranks' grads
    assert [group for _, group in three_ranks] == ["G", "G"]


def test_cost_matches_the_shards_real_bytes_and_flops():
    from torch.utils.flop_counter import FlopCounterMode

    shard = FeedForwardShard(32, 128, 4, 1).half()
    x = torch.zeros(2, 3, 32, dtype=torch.float16)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        out = shard(x)
    cost = comm.tp_cost(2, 3, 32, 128, 4, 2)
    assert cost.world_size == 4
    assert cost.flops == counter.get_total_flops()
    assert cost.weight_bytes == sum(p.numel() * p.element_size() for p in shard.parameters())
    assert cost.allreduce_bytes == out.numel() * out.element_size() * 2 * 3 / 4
    with pytest.raises(ValueError, match=r"^world_size=0; valid: an integer >= 1$"):
        comm.ring_allreduce_bytes(100.0, 0)


def test_cost_table():
    table = comm.format_costs([comm.tp_cost(8, 512, 512, 4096, p, 2) for p in (1, 4)])
    assert table.splitlines() == [
        "ranks  GFLOP/rank  weights/rank  all-reduce sent/rank  FLOPs per byte sent",
        "    1      34.360      8.00 MiB                   0 B     no communication",
        "    4       8.590      2.00 MiB              6.00 MiB                1,365",
    ]


@pytest.mark.parametrize(
    "ffn,world,valid",
    [(6, 4, "1, 2, 3, 6"), (64, 3, "1, 2, 4, 8, 16, 32, 64"), (65, 2, "1, 5, 13, ..."),
     (130, 3, "1, 2, 5, 10, 13, 26, ...")],
)  # fmt: skip
def test_bad_split_lists_the_valid_world_sizes(ffn, world, valid):
    with pytest.raises(ValueError, match=rf"valid world sizes for ffn_size {ffn}: {valid}$"):
        check_split(ffn, world)


def test_ffn_size_must_be_a_positive_int():
    assert check_split(1, 1) == 1
    for bad in (0, 8.0):
        with pytest.raises(ValueError, match=rf"^ffn_size={bad!r}; valid: an integer >= 1$"):
            check_split(bad, 2)


def test_defaults_and_shapes_of_shards():
    torch.manual_seed(0)
    model = FeedForward(4, 8)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.allclose(model(2 * x), 2 * model(x))  # no activation: linear
    shard = FeedForwardShard(4, 8, 2, 1)
    assert isinstance(shard.act, nn.Identity) and shard.rows() == slice(4, 8)
    with pytest.raises(
        ValueError, match=r"^weight of shape \(3, 3\) given for a layer of shape \(4, 4\)$"
    ):
        shard.load_weights(torch.zeros(3, 3), torch.zeros(4, 4))
    half = cut_shard(model.half(), 2, 1)
    assert half.fc1.weight.dtype == torch.float16 and isinstance(half.act, nn.Identity)
    assert torch.equal(half.fc2.weight, model.fc2.weight[:, 4:])
    with pytest.raises(ValueError, match=r"^tp_simulate needs at least one shard$"):
        tp_simulate([], x)


def test_shard_vs_full_measures_the_matching_slices():
    full = (torch.arange(12.0).reshape(4, 3), torch.arange(8.0).reshape(2, 4))
    rows = slice(2, 4)
    shard = (full[0][rows].clone(), full[1][:, rows].clone())
    assert shard_vs_full(shard, full, rows) == 0.0
    shard[1][1, 0] += 0.25
    assert shard_vs_full(shard, full, rows) == 0.25
    shard[0][0, 2] -= 0.5
    assert shard_vs_full(shard, full, rows) == 0.5
    with pytest.raises(ValueError, match=r"shard shapes \(2, 3\), \(2, 2\) do not match the full "
                       r"model's slices \(1, 3\), \(2, 1\)"):  # fmt: skip
        shard_vs_full(shard, full, slice(3, 4))
    with pytest.raises(ValueError, match=r"shard shapes \(2, 3\), \(2, 1\) do not match"):
        shard_vs_full((shard[0], shard[1][:, :1]), full, rows)  # only fc2 is cut wrong


def test_input_is_float32_draws_whatever_the_default_dtype():
    reference = make_input(2, 3, 4)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert torch.equal(make_input(2, 3, 4), reference)
    finally:
        torch.set_default_dtype(default)
    assert make_input(1, 1, 2, device="meta").device == META


def test_agreement_holds_exactly_at_the_tolerance():
    y = torch.tensor([1.0, 0.5], dtype=torch.float64)
    tol = 4 * 2 * eps("float32")  # max|y| = 1, two ranks
    assert outputs_agree(y, y + torch.tensor([tol, 0.0], dtype=torch.float64), "float32", 2)[2]
    ref = {"checksum": 100.0, "abs_sum": 1024.0, "dtype": "float32"}
    assert checksums_match(ref, {"checksum": 100.0 + 1024.0 * eps("float32")})


# ---- shard files ---------------------------------------------------------------------------


def _shards(tmp_path):
    torch.manual_seed(1)
    model = FeedForward(16, 64)
    write_shards(model, 2, tmp_path)
    return model


def test_chunk_bytes_are_float32_whatever_the_dtype():
    t = torch.tensor([[1.5, -2.0]], dtype=torch.bfloat16)
    assert chunk_file_bytes(t) == np.array([[1.5, -2.0]], dtype="<f4").tobytes()


def test_manifest_records_each_files_tensor_rank_and_split(tmp_path):
    _shards(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["byte_order"] == "little" and manifest["order"] == "C"
    entry = {k: v for k, v in manifest["files"]["fc2_1.bin"].items() if k != "sha256"}
    assert entry == {
        "tensor": "fc2.weight",
        "rank": 1,
        "split_dim": 1,
        "shape": [16, 32],
        "bytes": 2048,
    }
    assert manifest["files"]["fc1_0.bin"]["split_dim"] == 0


def test_shard_manifest_without_a_field_or_of_another_format(tmp_path):
    _shards(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    del manifest["ffn_size"]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(
        ShardError,
        match=r"^manifest\.json is not a shard manifest of format 'tp-ffn-shards/1' "
        r"\(missing: ffn_size\); rewrite the shards$",
    ):
        load_shard(tmp_path, 2, 0)
    del manifest["hidden_size"]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"\(missing: hidden_size, ffn_size\); rewrite"):
        load_shard(tmp_path, 2, 0)
    manifest["hidden_size"], manifest["ffn_size"], manifest["format"] = 16, 64, "other/1"
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"\(missing: none\); rewrite the shards$"):
        load_shard(tmp_path, 2, 0)
    (tmp_path / MANIFEST).unlink()
    with pytest.raises(
        ShardError,
        match=r"write the shards first \(write_shards, or `python -m helpers\.tp_demo "
        r"--world_size N --shard_dir DIR` in native mode\)$",
    ):
        load_shard(tmp_path, 2, 0)


def test_a_manifest_entry_that_disagrees_with_the_sizes_is_refused(tmp_path):
    _shards(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["files"]["fc1_0.bin"]["bytes"] = 4095
    manifest["files"].pop("fc2_0.bin")
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(
        ShardError,
        match=r"^manifest\.json describes fc1_0\.bin as \[32, 16\] \(4095 bytes\) but the sizes it "
        r"records need 2048 bytes = float32 32x16; rewrite the shards$",
    ):
        load_shard(tmp_path, 2, 0)
    manifest["files"]["fc1_0.bin"]["bytes"] = 2048
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"describes fc2_0\.bin as None \(None bytes\)"):
        load_shard(tmp_path, 2, 0)


def test_loaded_shard_gets_the_activation_asked_for(tmp_path):
    model = _shards(tmp_path)
    shard = load_shard(tmp_path, 2, 1, activation="gelu")
    assert isinstance(shard.act, nn.GELU)
    assert torch.equal(shard.fc1.weight, model.fc1.weight[32:])


def test_describe_shards_table(tmp_path):
    folder = tmp_path / "shards"
    _shards(folder)
    (folder / "fc2_1.bin").unlink()
    lines = describe_shards(folder).splitlines()
    assert lines[:2] == [
        "shards: world size 2, hidden 16, ffn 64, float32 little-endian, C order",
        "file       tensor      split shape            bytes  sha256",
    ]
    assert len(lines) == 6 and lines[2].startswith(
        "fc1_0.bin  fc1.weight  dim 0 32x16             2048  "
    )
    assert lines[2].endswith("...") and len(lines[2].rsplit("  ", 1)[1]) == 16 + 3
    assert lines[5].startswith("fc2_1.bin  fc2.weight  dim 1 16x32          missing  ")


# ---- launcher (stand-in processes, no torchrun) -------------------------------------------


def test_failing_rank_is_read_after_the_root_cause():
    log = "rank : 0\nRoot Cause (first observed failure):\n  rank      : 12 (local_rank: 3)"
    assert launcher.root_cause(log) == (12, 3)
    assert launcher.root_cause("Root Cause\nrank: 2\nRoot Cause\nrank: 3") == (2, 2)
    assert launcher.root_cause("error: rank : 1 failed") == (1, 1)
    assert launcher.root_cause("[E] rank : 0 failed\nRoot Cause\n rank : 4") == (4, 4)
    assert launcher.root_cause("Root Cause: nothing here") == (None, None)


def test_torchrun_command_line(tmp_path):
    assert launcher.torchrun_command("pkg.mod", ["--a", "1"], nproc=3, port=29511, log_dir=tmp_path) == [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=3",
        "--master-addr=127.0.0.1", "--master-port=29511", "--max-restarts=0",
        "--monitor-interval=0.2", f"--log-dir={tmp_path}", "--redirects=3", "-m", "pkg.mod",
        "--a", "1",
    ]  # fmt: skip


def test_logs_with_undecodable_bytes_are_still_read(tmp_path):
    log = tmp_path / "launcher.log"
    log.write_bytes(b"worker said \xff\xfe\nEADDRINUSE\n")
    assert launcher._port_clash(log)
    assert launcher.tail(log) == "worker said \ufffd\ufffd\nEADDRINUSE"


def test_port_clash_is_read_from_the_launcher_log(tmp_path):
    log = tmp_path / "launcher.log"
    assert not launcher._port_clash(log)  # no log at all
    for text, clash in (
        ("ok", False),
        ("bind: Address already in use", True),
        ("EADDRINUSE", True),
    ):
        log.write_text(f"line\n{text}\nline")
        assert launcher._port_clash(log) is clash


def test_ports_in_range_free_or_taken():
    port = launcher.free_port()
    assert 1024 <= port <= 65535 and launcher.check_port(port) == port
    for bad in (0, 65536):
        with pytest.raises(ValueError, match=rf"^port {bad} is out of range; valid: 1\.\.65535"):
            launcher.check_port(bad)
    for edge in (1, 65535):  # in range: either free or in use, never "out of range"
        try:
            assert launcher.check_port(edge) == edge
        except LaunchError:
            pass
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(
            LaunchError, match=rf"^port {taken} is already in use \(.+\); pass port=None"
        ):
            launcher.check_port(taken)


def test_rank_logs_and_their_tails(tmp_path):
    rank0 = tmp_path / "run" / "attempt_0" / "0"
    rank0.mkdir(parents=True)
    (rank0 / "stdout.log").write_text("\n".join(f"out {i}" for i in range(30)))
    (rank0 / "stderr.log").write_text("err")
    (rank0 / "other.txt").write_text("not a log")
    assert launcher.rank_logs(tmp_path, 0) == [rank0 / "stderr.log", rank0 / "stdout.log"]
    assert launcher.rank_logs(tmp_path, 1) == []
    assert launcher.tail(tmp_path / "missing.log") == ""
    assert launcher.tail(rank0 / "stdout.log", 2) == "out 28\nout 29"
    assert launcher.tail(rank0 / "stdout.log").splitlines()[0] == "out 5"  # 25 lines by default
    assert (
        launcher.rank_tail(tmp_path, 0, 1)
        == "--- rank 0 stderr.log ---\nerr\n--- rank 0 stdout.log ---\nout 29"
    )
    assert launcher.rank_tail(tmp_path, 3) == "(no log files for rank 3)"


def _alive(pid: int) -> bool:
    state = Path(f"/proc/{pid}/stat")
    try:
        return state.read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _started(script: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    return proc, proc.stdout.readline().strip()


DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(10)"


def test_kill_group_escalates_to_sigkill_and_takes_the_workers_down():
    stubborn, _ = _started(DEAF)
    launcher.kill_group(stubborn, grace=0.2)
    assert stubborn.returncode == -signal.SIGKILL
    stubborn.stdout.close()
    parent, worker = _started(
        "import subprocess, sys, time\n"
        f"w = subprocess.Popen([sys.executable, '-c', {DEAF!r}], stdout=subprocess.PIPE)\n"
        "w.stdout.readline(); print(w.pid, flush=True); time.sleep(10)"
    )
    launcher.kill_group(parent, grace=5.0)
    assert parent.returncode == -signal.SIGTERM  # the launcher ended on SIGTERM ...
    deadline = time.time() + 5
    while _alive(int(worker)) and time.time() < deadline:
        time.sleep(0.02)
    assert not _alive(int(worker))  # ... and its worker, deaf to SIGTERM, was killed
    parent.stdout.close()
    launcher.kill_group(parent)  # already gone: nothing to do, no error


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """Launch ``python -c script module nproc port log_dir args...`` instead of torchrun."""

    def use(script: str):
        def command(module, args, *, nproc, port, log_dir):
            return [
                sys.executable,
                "-c",
                script,
                module,
                str(nproc),
                str(port),
                str(log_dir),
                *args,
            ]

        monkeypatch.setattr(launcher, "torchrun_command", command)

    monkeypatch.setenv(launcher.LOG_DIR_ENV, str(tmp_path / "launches"))
    return use


REPORT = (
    "import json, os, sys\n"
    "keys = ('OMP_NUM_THREADS', 'PYTHONUNBUFFERED', 'GUARD_EXTRA', 'GUARD_PARENT')\n"
    "result = {'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in keys}}\n"
    f"open(os.environ['{RESULT_ENV}'], 'w').write(json.dumps(result))\n"
)


def test_launch_returns_rank_0s_result_and_sets_the_environment(stand_in, tmp_path, monkeypatch):
    stand_in(REPORT)
    monkeypatch.setenv("GUARD_PARENT", "inherited")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    logs = tmp_path / "logs"
    (logs).mkdir()
    (logs / "result.json").write_text('{"stale": true}')
    port = launcher.free_port()
    env = {"GUARD_EXTRA": "given", "OMP_NUM_THREADS": "9"}
    result = launcher.launch(
        "pkg.worker", ["--x", "1"], nproc=3, threads_per_rank=2, port=port, log_dir=logs, env=env
    )
    assert result["argv"] == ["pkg.worker", "3", str(port), str(logs), "--x", "1"]
    assert result["env"] == {
        "OMP_NUM_THREADS": "2",
        "PYTHONUNBUFFERED": "1",
        "GUARD_EXTRA": "given",
        "GUARD_PARENT": "inherited",
    }
    assert sorted(p.name for p in logs.iterdir()) == ["launcher.log", "result.json"]  # kept


def test_a_launch_in_its_own_log_folder_leaves_nothing_after_success(
    stand_in, tmp_path, monkeypatch
):
    stand_in(REPORT)
    result = launcher.launch("pkg.sub.worker", nproc=1)
    used = Path(result["argv"][3])
    assert used.parent == tmp_path / "launches"
    assert used.name.startswith("worker-") and used.name[7:15].isdigit() and used.name[15] == "-"
    assert result["env"]["OMP_NUM_THREADS"] == "1" and not used.exists()
    again = Path(launcher.launch("worker", nproc=1)["argv"][3])  # same base folder, no package
    assert again.parent == used.parent and again.name.startswith("worker-")
    monkeypatch.delenv(launcher.LOG_DIR_ENV)  # the default: results/logs
    monkeypatch.setattr(launcher, "results_path", lambda name: tmp_path / "results" / name)
    used = Path(launcher.launch("pkg.mod", nproc=1)["argv"][3])
    assert used.parent == tmp_path / "results" / "logs" and used.name.startswith("mod-")
    assert list(used.parent.iterdir()) == []


def test_a_failed_launch_names_the_root_cause_rank_and_shows_its_log(stand_in, tmp_path):
    stand_in(
        "import sys; from pathlib import Path\n"
        "d = Path(sys.argv[4]) / 'run' / 'attempt_0' / '1'; d.mkdir(parents=True)\n"
        "(d / 'stderr.log').write_text('\\n'.join(f'line {i}' for i in range(40)))\n"
        "sys.stdout.buffer.write(b'worker bytes \\xff\\xfe\\n'); sys.stdout.flush()\n"
        "print('rank : 0 is fine\\nRoot Cause (first observed failure):\\n  rank : 5 (local_rank: 1)',"
        " file=sys.stderr)\n"  # torchrun reports the root cause on stderr
        "sys.exit(3)\n"
    )
    with pytest.raises(LaunchError) as error:
        launcher.launch("pkg.worker", nproc=2, log_dir=tmp_path / "deep" / "logs")
    assert str(error.value).startswith("pkg.worker failed (exit code 3) on rank 5; logs in logs\n")
    assert error.value.rank == 5 and not error.value.port_clash  # its log is local rank 1's
    assert error.value.log_tail.splitlines()[:2] == ["--- rank 1 stderr.log ---", "line 15"]
    assert error.value.log_tail.endswith("line 39")
    assert (tmp_path / "deep" / "logs" / "launcher.log").exists()  # a failure keeps its logs


def test_an_unknown_failing_rank_and_a_port_clash(stand_in, tmp_path):
    stand_in("import sys; print('bind failed: EADDRINUSE'); sys.exit(1)")
    with pytest.raises(LaunchError) as error:
        launcher.launch("pkg.worker", nproc=2, port=launcher.free_port(), log_dir=tmp_path / "l")
    assert "failed (exit code 1) on rank ?; logs in l\n(no log files for rank 0)" in str(
        error.value
    )
    assert error.value.rank is None and error.value.port_clash
    assert error.value.log_tail == "(no log files for rank 0)"


def test_a_launch_that_writes_no_result_is_an_error(stand_in, tmp_path):
    stand_in("pass")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "result.json").write_text("{}")  # from an earlier run: must not be returned
    with pytest.raises(
        LaunchError, match=r"^pkg\.worker finished but rank 0 wrote no result; logs in logs$"
    ):
        launcher.launch("pkg.worker", nproc=1, log_dir=logs)


def test_a_hung_launch_is_killed_at_its_timeout(stand_in, tmp_path, monkeypatch):
    started = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(launcher.subprocess, "Popen", Recorded)
    stand_in("import time; time.sleep(10)")
    rank0 = tmp_path / "logs" / "r" / "attempt_0" / "0"
    rank0.mkdir(parents=True)
    (rank0 / "stdout.log").write_text("\n".join(f"step {i}" for i in range(20)))
    start = time.time()
    with pytest.raises(LaunchError) as error:
        launcher.launch("pkg.worker", nproc=2, timeout=0.5, log_dir=tmp_path / "logs")
    assert time.time() - start < 10
    try:
        assert started[0].poll() == -signal.SIGTERM  # its whole process group was ended
    finally:
        started[0].kill()
    message = str(error.value)
    assert message.startswith(
        "pkg.worker with 2 rank(s) did not finish within 0.5 s; every rank was killed. Logs in logs\n"
    )
    assert error.value.log_tail == (
        "--- rank 0 stdout.log ---\n"
        + "\n".join(f"step {i}" for i in range(10, 20))
        + "\n(no log files for rank 1)"
    )


def test_launch_retries_a_picked_port_taken_meanwhile_but_nothing_else(monkeypatch):
    ports, attempts = iter(range(40001, 40010)), []
    monkeypatch.setattr(launcher, "free_port", lambda: next(ports))
    monkeypatch.setattr(launcher, "check_port", lambda port: port)

    def once_failing(outcomes):
        outcomes = iter(outcomes)

        def once(module, args, nproc, timeout, threads, port, log_dir, env):
            attempts.append(port)
            outcome = next(outcomes)
            if outcome == "ok":
                return {"port": port}
            error = LaunchError(outcome)
            error.port_clash = outcome == "clash"
            raise error

        monkeypatch.setattr(launcher, "_launch_once", once)

    once_failing(["clash", "clash", "ok"])
    assert launcher.launch("m", nproc=1) == {"port": 40003} and attempts == [40001, 40002, 40003]
    attempts.clear()
    once_failing(["clash", "clash", "clash", "ok"])
    with pytest.raises(LaunchError, match="clash"):
        launcher.launch("m", nproc=1)
    assert len(attempts) == 3
    attempts.clear()
    once_failing(["broken", "ok"])
    with pytest.raises(LaunchError, match="broken"):
        launcher.launch("m", nproc=1)
    assert len(attempts) == 1
    attempts.clear()
    once_failing(["clash", "ok"])
    with pytest.raises(LaunchError, match="clash"):
        launcher.launch("m", nproc=1, port=29999)  # a port the caller chose is not changed
    assert attempts == [29999]
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match=rf"^nproc={bad!r}; valid: an integer >= 1$"):
            launcher.launch("m", nproc=bad)
