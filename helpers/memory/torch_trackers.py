"""PyTorch's memory trackers (``MemTracker``, ``FSDPMemTracker``) beside the ledger.

Both are private API, read from torch 2.14.1: :func:`check_tracker_api` names what is gone."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn

from helpers.memory.ledger import DeviceMemory
from helpers.memory.measure import Loss, default_loss
from helpers.memory.optimizers import make_optimizer, validate_optimizer

PINNED_TORCH = "2.14.1"
_MEM = "torch.distributed._tools.mem_tracker"
_FSDP = "torch.distributed._tools.fsdp2_mem_tracker"
TRACKED_API = (
    *(f"{_MEM}.{n}" for n in ("MemTracker", "MemTracker.track_external", "MemTracker._update_snap",
                              "MemTracker.get_tracker_snapshot", "_MemRefType", "_TOTAL_KEY")),
    *(f"{_FSDP}.{n}" for n in ("FSDPMemTracker", "FSDPMemTracker.track_inputs", "_FSDPRefType")))
# Each tracker's categories (``_MemRefType``, ``_FSDPRefType``): member -> our name.
MEM_CATEGORIES = {"PARAM": "parameters", "BUFFER": "buffers", "GRAD": "gradients",
                  "ACT": "activations", "TEMP": "temp", "OPT": "optimizer_state", "OTH": "other"}
FSDP_CATEGORIES = {"SHARDED_PARAM": "sharded_params", "UNSHARDED_PARAM": "unsharded_params",
                   "BUFFER": "buffers", "SHARDED_GRAD": "sharded_grads", "UNSHARDED_GRAD":
                   "unsharded_grads", "ACT": "activations", "TEMP": "temp", "ALL_GATHER":
                   "all_gather", "REDUCE_SCATTER": "reduce_scatter", "OPT": "optimizer_state",
                   "INP": "inputs"}
_ENUMS = {f"{_MEM}._MemRefType": MEM_CATEGORIES, f"{_FSDP}._FSDPRefType": FSDP_CATEGORIES}

# Why a kind differs, after the functions of mem_tracker.py that decide it.
REASONS = {
    "weights": "track_external / _track_module_params_and_buffers file each parameter and "
    "buffer once, by whole storage (get_untyped_storages): equal unless one views a larger one.",
    "grads": "equal once accumulated; born in backward a gradient is temp (__torch_dispatch__, "
    "_mod_tracker.is_bw) until _grad_hook moves it, so at the global peak it may be temp.",
    "optimizer_state": "equal after the step (Adam's float32 step counters too: "
    "_track_optimizer_states); the own peak adds the step's temporaries, which "
    "__torch_dispatch__ files as optimizer state while _in_opt (e.g. Adam's sqrt(v), denominator).",
    "activations": "ours is what autograd saved for backward, the batch too when saved; the "
    "tracker's is each tensor created outside backward and the step while it lives (_track), "
    "saved or not (output, loss, the ones_like seed of backward), never the batch (other/inputs).",
}


def _resolve(name: str) -> object | None:
    """The object ``torch.distributed._tools.<module>.<attributes>`` names (None if gone)."""
    parts = name.split(".")
    try:
        found = importlib.import_module(".".join(parts[:4]))
    except ImportError:
        return None
    for attr in parts[4:]:
        found = getattr(found, attr, None)
    return found


def check_tracker_api() -> None:
    """Raise ImportError naming each private tracker name (or category) this torch lacks."""
    names = (*TRACKED_API, *(f"{e}.{m}" for e, members in _ENUMS.items() for m in members))
    if missing := [name for name in names if _resolve(name) is None]:
        raise ImportError(f"torch {torch.__version__} lacks {', '.join(missing)}; these "
                          f"memory trackers are private PyTorch API, pinned here to torch "
                          f"{PINNED_TORCH}; valid: torch=={PINNED_TORCH} (see TRACKED_API)")


@dataclass(frozen=True)
class TrackerReport:
    """Bytes ``MemTracker`` filed per category on the model's device during one step.

    ``at_peak`` is the tracker's own peak, ``get_tracker_snapshot("peak")``: every category
    at the one moment the device's total was highest (``_update_peak_stats`` copies the whole
    snapshot then), not each category's maximum; ``peak`` is that total. ``own_peaks``: each
    category's own maximum, read after every update the tracker makes (``_update_snap``).
    ``at_end``: what is held after the step (output, loss dropped). Module peaks: not read.
    """

    at_peak: Mapping[str, int]
    own_peaks: Mapping[str, int]
    at_end: Mapping[str, int]
    peak: int
    device: str
    optimizer: str

    LEDGER_MATCH: ClassVar[dict[str, tuple[str, ...]]] = {
        "weights": ("parameters", "buffers"), "grads": ("gradients",),
        "optimizer_state": ("optimizer_state",), "activations": ("activations",)}


@dataclass(frozen=True)
class FSDPTrackerReport(TrackerReport):
    """:class:`TrackerReport` from ``FSDPMemTracker`` (its categories), on this rank. Its
    activations' own peak holds each unsharded parameter, allocated (so filed as activation)
    before ``_fsdp_state_pre_forward`` re-files it as ``unsharded_params``."""

    world_size: int = 1

    LEDGER_MATCH: ClassVar[dict[str, tuple[str, ...]]] = {**TrackerReport.LEDGER_MATCH,
        "weights": ("sharded_params", "buffers"), "grads": ("sharded_grads",)}


def _watch_own_peaks(tracker: object) -> dict:
    """Make ``tracker`` record each category's maximum, per device, after every update."""
    peaks, update = {}, tracker._update_snap

    def update_and_record(*args: object, **kwargs: object) -> None:
        update(*args, **kwargs)
        for device, snap in tracker.get_tracker_snapshot().items():
            seen = peaks.setdefault(device, {})
            seen.update({k: max(seen.get(k, 0), v) for k, v in snap.items()})

    tracker._update_snap = update_and_record
    return peaks


def _named(per_device: Mapping, names: dict[str, str]) -> Mapping[str, int]:
    """One device's snapshot (enum member -> bytes) keyed by our category names."""
    by_member = {getattr(k, "name", k): v for k, v in per_device.items()}
    return MappingProxyType({ours: by_member.get(member, 0) for member, ours in names.items()})


@contextmanager
def _restoring(model: nn.Module) -> Iterator[None]:
    """Train mode inside; weights, buffers, grads and training flag put back afterwards."""
    params, was_training = list(model.parameters()), model.training
    tensors = [*params, *model.buffers()]
    saved = [t.detach().clone() for t in tensors]
    grads = [None if p.grad is None else p.grad.clone() for p in params]
    try:
        yield model.train(True)
    finally:
        with torch.no_grad():
            for t, copy in zip(tensors, saved, strict=True):
                t.copy_(copy)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        model.train(was_training)


def _run(fsdp: bool, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
         optimizer: str, lr: float, loss_fn: Loss | None) -> dict:
    """The ledger's step (zero_grad, forward, loss, backward, step) under a tracker."""
    validate_optimizer(optimizer)
    if len(devices := {p.device for p in model.parameters()}) != 1:
        raise ValueError(f"{type(model).__name__} has parameters on {sorted(map(str, devices))};"
                         " valid: a model with parameters, all on one device")
    check_tracker_api()
    device, loss_fn = devices.pop(), loss_fn or default_loss
    with _restoring(model):
        opt = make_optimizer(optimizer, model.parameters(), lr)
        opt.zero_grad(set_to_none=True)  # the step's first act, untracked: old grads never filed
        if fsdp:  # the batch is filed as inputs (FSDPMemTracker) or other (MemTracker)
            tracker = _resolve(f"{_FSDP}.FSDPMemTracker")(model, opt)
            tracker.track_inputs((inputs, labels))
        else:
            tracker = _resolve(f"{_MEM}.MemTracker")()
            tracker.track_external(model, opt, inputs, labels)
        own = _watch_own_peaks(tracker)
        with tracker:
            output = model(inputs)
            loss = loss_fn(output, labels.to(output.device))
            loss.backward()
            opt.step()
            del output, loss
            end = tracker.get_tracker_snapshot("current")
    peak, names = tracker.get_tracker_snapshot("peak"), FSDP_CATEGORIES if fsdp else MEM_CATEGORIES
    views = {"at_peak": peak, "own_peaks": own, "at_end": end}
    return {**{key: _named(snap.get(device, {}), names) for key, snap in views.items()},
            "peak": peak.get(device, {}).get(_resolve(f"{_MEM}._TOTAL_KEY"), 0),
            "device": str(device), "optimizer": optimizer}


def track_step(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, *,
               optimizer: str = "sgd", lr: float = 0.01,
               loss_fn: Loss | None = None) -> TrackerReport:
    """One step under ``MemTracker`` on ``model`` itself, then its weights, grads, mode put back."""
    return TrackerReport(**_run(False, model, inputs, labels, optimizer, lr, loss_fn))


def track_fsdp_step(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, *,
                    optimizer: str = "sgd", lr: float = 0.01,
                    loss_fn: Loss | None = None) -> FSDPTrackerReport:
    """:func:`track_step` under ``FSDPMemTracker``, for a ``fully_shard`` model, on this rank."""
    from torch.distributed.fsdp import FSDPModule  # here: only FSDP callers need it

    if not dist.is_initialized():
        raise ValueError("no process group is initialized; valid: call track_fsdp_step inside "
                         "a rank, after torch.distributed.init_process_group")
    if not isinstance(model, FSDPModule):
        raise ValueError(f"{type(model).__name__} is not wrapped with fully_shard; valid: a model "
                         "passed to torch.distributed.fsdp.fully_shard")
    fields = _run(True, model, inputs, labels, optimizer, lr, loss_fn)
    return FSDPTrackerReport(**fields, world_size=dist.get_world_size())


@dataclass(frozen=True)
class Comparison:
    """A ledger kind beside its tracker categories (bytes); difference: own peak - ours."""

    kind: str
    categories: tuple[str, ...]
    ours: int
    own_peak: int
    at_peak: int
    at_end: int
    difference: int
    reason: str


def compare_with_ledger(report: TrackerReport, ledger_row: DeviceMemory) -> list[Comparison]:
    """Weights, grads, optimizer state and activations: tracker beside ledger."""
    if not isinstance(report, TrackerReport) or not isinstance(ledger_row, DeviceMemory):
        raise ValueError(f"got {type(report).__name__} and {type(ledger_row).__name__}; valid: a "
                         "TrackerReport and one DeviceMemory row (e.g. ledger['cpu'])")
    views, rows = (report.own_peaks, report.at_peak, report.at_end), []
    for kind, cats in report.LEDGER_MATCH.items():
        own, at_peak, end = (sum(view[c] for c in cats) for view in views)
        ours = getattr(ledger_row, kind)
        rows.append(Comparison(kind, cats, ours, own, at_peak, end, own - ours, REASONS[kind]))
    return rows


def explain_differences(report: TrackerReport, ledger_row: DeviceMemory) -> list[str]:
    """One line per kind whose tracker peak (own or global) differs from ours, with its cause."""
    return [f"{r.kind}: tracker {r.own_peak:,} B (at the global peak {r.at_peak:,}, after the "
            f"step {r.at_end:,}), ours {r.ours:,} B: {r.reason}"
            for r in compare_with_ledger(report, ledger_row) if r.difference or r.at_peak != r.ours]


def tracker_table(report: TrackerReport, ledger_row: DeviceMemory, title: str = "") -> str:
    """:func:`compare_with_ledger` as text in bytes (within 100 characters a line): per kind
    ours, the tracker's own peak, their difference, the tracker at its global peak and after
    the step; then the categories the ledger leaves out, and the two peaks."""
    rows = [("kind", "tracker categories", "ours", "tracker", "difference", "at peak", "after")]
    rows += [(r.kind, "+".join(r.categories), r.ours, r.own_peak, r.difference, r.at_peak,
              r.at_end) for r in compare_with_ledger(report, ledger_row)]
    matched = {c for cats in report.LEDGER_MATCH.values() for c in cats}
    rows += [("(not ours)", n, "-", report.own_peaks[n], "-", report.at_peak[n], report.at_end[n])
             for n in report.own_peaks if n not in matched]
    lines = [title] if title else []
    lines += [f"{a:<16}{b:<22}" + "".join(f"{c:>12,}" if isinstance(c, int) else f"{c:>12}"
                                          for c in cells) for a, b, *cells in rows]
    return "\n".join([*lines, f"peak: tracker {report.peak:,} B at one moment "
                       f"(_update_peak_stats); ours adds four peaks: {ledger_row.total:,} B"])
