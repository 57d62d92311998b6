"""helpers.memory.torch_trackers: PyTorch's MemTracker beside the ledger, on lesson 01's toy."""

from functools import cache

import pytest
import torch
import torch.distributed._tools.mem_tracker as mem_tracker
import torch.nn.functional as F
from torch import nn

from helpers.memory import OPTIMIZERS, measure_training_memory
from helpers.memory.ledger import KINDS, DeviceMemory
from helpers.memory.torch_trackers import (
    PINNED_TORCH,
    TRACKED_API,
    FSDPTrackerReport,
    check_tracker_api,
    compare_with_ledger,
    explain_differences,
    track_fsdp_step,
    track_step,
    tracker_table,
)
from helpers.models.toy import ToyModel
from helpers.profiles import get_profile

SEED_BYTES = 4  # loss.backward() seeds backward with ones_like(loss): one float32


def toy():
    sizes = get_profile("small").toy
    torch.manual_seed(0)
    model = ToyModel("cpu", "cpu", sizes.inputs, sizes.hidden, sizes.outputs)
    return model, torch.randn(sizes.batch, sizes.inputs), torch.randn(sizes.batch, sizes.outputs)


def nbytes(t):
    return t.numel() * t.element_size()


@cache
def measured(optimizer):
    """The toy model, its batch, our ledger's row and the tracker's report, for one optimizer."""
    model, x, y = toy()
    row = measure_training_memory(model, x, y, optimizer=optimizer)["cpu"]
    return model, x, y, row, track_step(model, x, y, optimizer=optimizer)


def adam_step_temporaries(model):
    """Single-tensor Adam holds sqrt(v) and the denominator of one parameter while the
    previous parameter's denominator (the loop's ``denom``) is still alive."""
    sizes = [nbytes(p) for p in model.parameters()]
    return max(previous + 2 * size for previous, size in zip([0, *sizes[:-1]], sizes, strict=True))


def test_the_pinned_private_api_is_there():
    check_tracker_api()
    assert all(name.startswith("torch.distributed._tools.") for name in TRACKED_API)


def test_a_missing_name_is_named_with_both_torch_versions(monkeypatch):
    monkeypatch.delattr(mem_tracker, "MemTracker")
    for call in (check_tracker_api, lambda: track_step(*toy())):
        with pytest.raises(ImportError) as error:
            call()
        message = str(error.value)
        assert "torch.distributed._tools.mem_tracker.MemTracker" in message
        assert torch.__version__ in message and PINNED_TORCH in message


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_weights_grads_and_optimizer_state_match_the_ledger_byte_for_byte(optimizer):
    model, _, _, row, report = measured(optimizer)
    assert report.own_peaks["parameters"] + report.own_peaks["buffers"] == row.weights
    assert report.own_peaks["gradients"] == report.at_end["gradients"] == row.grads
    assert report.at_end["optimizer_state"] == row.optimizer_state
    # the step's temporaries are filed as optimizer state while the step runs
    extra = adam_step_temporaries(model) if optimizer == "adam" else 0
    assert report.own_peaks["optimizer_state"] == row.optimizer_state + extra


def test_activations_are_ours_less_the_batch_plus_forward_tensors_nobody_saved():
    model, x, y, row, report = measured("sgd")
    with torch.no_grad():  # the loss's storage, as the CPU kernel allocates it
        loss_storage = F.mse_loss(model(x), y).untyped_storage().nbytes()
    batch = nbytes(x) + nbytes(y)  # saved by net1 (for its weight grad) and by the loss
    assert report.own_peaks["other"] == report.at_end["other"] == batch
    assert report.own_peaks["activations"] == row.activations - batch + loss_storage + SEED_BYTES
    assert report.at_end["activations"] == 0


def test_the_tracker_peak_is_one_moment_and_holds_every_own_peak():
    _, _, _, row, report = measured("sgd")
    assert report.peak == sum(report.at_peak.values())
    assert all(value <= report.peak for value in report.own_peaks.values())
    # plain SGD peaks in backward, while the big gradient is still filed as temp
    assert report.at_peak["gradients"] < row.grads <= report.at_peak["temp"]


def test_tracking_changes_nothing_in_the_model():
    model, x, y = toy()
    model.net1(x).sum().backward()  # grads that are not the tracked step's
    model.eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    track_step(model, x, y, optimizer="adam", lr=0.1)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    for p, g in zip(model.parameters(), grads, strict=True):
        assert (p.grad is None and g is None) or torch.equal(p.grad, g)
    assert not model.training


def test_the_comparison_explains_each_difference_from_the_source():
    _, _, _, row, report = measured("adam")
    rows = compare_with_ledger(report, row)
    assert [r.kind for r in rows] == list(KINDS)
    assert {r.kind: r.difference for r in rows}["weights"] == 0
    text = tracker_table(report, row, title="toy, adam")
    assert all(word in text for word in (*KINDS, "temp", "other", f"{report.peak:,}"))
    lines = explain_differences(report, row)
    assert [line.split(":")[0] for line in lines] == ["optimizer_state", "activations"]
    assert "_in_opt" in lines[0] and "_track" in lines[1]


def test_bad_input_names_the_value_and_the_choices():
    model, x, y = toy()
    with pytest.raises(ValueError, match="'rmsprop'.*adam"):
        track_step(model, x, y, optimizer="rmsprop")
    with pytest.raises(ValueError, match="Ledger.*DeviceMemory"):
        compare_with_ledger(measured("sgd")[-1], measure_training_memory(model, x, y))
    with pytest.raises(ValueError, match="no process group.*init_process_group"):
        track_fsdp_step(model, x, y)


def test_fsdp_on_one_rank_shards_nothing(one_rank_group):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))
    x, y = torch.randn(4, 64), torch.randn(4, 8)
    with pytest.raises(ValueError, match="not wrapped with fully_shard"):
        track_fsdp_step(model, x, y)
    full = sum(nbytes(p) for p in model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    for module in (model[0], model[2], model):
        fully_shard(module)
    report = track_fsdp_step(model, x, y, optimizer="adam")
    assert isinstance(report, FSDPTrackerReport) and report.world_size == 1
    assert report.own_peaks["sharded_params"] == full
    assert report.at_end["sharded_grads"] == full
    assert report.own_peaks["inputs"] == nbytes(x) + nbytes(y)
    # at world size 1 FSDP2 skips both collectives (FSDPParamGroup.unshard, foreach_reduce)
    assert report.own_peaks["all_gather"] == report.own_peaks["reduce_scatter"] == 0
    # an unsharded parameter is filed as an activation until the pre-forward hook re-files it
    assert report.own_peaks["activations"] >= report.own_peaks["unsharded_params"] > 0
    weights = compare_with_ledger(report, DeviceMemory(weights=full))[0]
    assert weights.categories == ("sharded_params", "buffers") and weights.own_peak == full
    after = [p.full_tensor() for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
