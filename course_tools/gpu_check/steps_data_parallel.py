"""Step 8 of ``make gpu-check``: lesson 06's data parallelism (DDP, ZeRO-1/2/3, FSDP2).

The lesson's worker on one GPU per rank (NCCL, at most 2 ranks) at the full profile's
sizes: its proofs, the collectives each technique issues (the bytes by the ring formula
and by gloo's algorithms; with NCCL the sockets carry none of them, so no wire count), the
ledgers measured beside predicted, and the alpha-beta fit of each collective. ``--smoke``: two gloo ranks on the CPU at the
smoke profile's sizes.

The ranks run the lesson's worker through this module's :func:`main`, which only guards
PyTorch's private ``FSDPMemTracker``: on a torch where it is missing or differs, the
tracker's peaks are left out and the reason recorded, and everything else still runs.
With one GPU the world size is 1: every collective sends nothing and nothing is sharded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from types import SimpleNamespace
from typing import ClassVar

import torch

from course_tools.gpu_check.context import Context
from helpers.runs.contract import Record, launch, serve
from helpers.runs.data_parallel.config import DataParallelConfig
from helpers.runs.data_parallel.report import bytes_table
from helpers.runs.data_parallel.results import DataParallelResult
from helpers.torchrun.ranks import Rank

GUARDED_WORKER = "course_tools.gpu_check.steps_data_parallel"
MAX_RANKS = 2
ONE_RANK_NOTE = (
    "world size 1 (one GPU): the collectives and the sharding send nothing, so every byte "
    "count is 0, no alpha-beta fit has a slope, and the predicted ledger is the unsharded "
    "one for every stage (the hand ZeRO-2/3 still hold one unit's full buffer beside it)"
)

# --- the ranks: the lesson's worker, its FSDPMemTracker guarded -------------------------


def guarded_tracker(track: Callable, skipped: list[str]) -> Callable:
    """``track`` (``track_fsdp_step``); if it raises, no peaks, and the reason in ``skipped``.

    After one failure the tracker is not tried again, so every call skips it alike."""
    no_peaks = SimpleNamespace(own_peaks={})

    def run(*args: object, **kwargs: object) -> object:
        if skipped:
            return no_peaks
        try:
            return track(*args, **kwargs)
        except Exception as error:  # private API: missing (ImportError) or changed
            skipped.append(f"FSDPMemTracker skipped: {type(error).__name__}: {error}"[:600])
            return no_peaks

    return run


@dataclass(frozen=True)
class GuardedConfig(DataParallelConfig):
    """Lesson 06's launch, its ranks run by gpu-check's guarded worker."""

    WORKER: ClassVar[str] = GUARDED_WORKER


@dataclass(frozen=True)
class GuardedResult(Record):
    """The lesson's result, and what became of ``FSDPMemTracker`` ("ok" or why skipped)."""

    lesson: DataParallelResult
    fsdp_tracker: str


def main(config: GuardedConfig, rank: Rank) -> GuardedResult:
    """The lesson's worker, with the tracker guarded and its outcome in the result."""
    from helpers.runs.data_parallel import worker

    skipped: list[str] = []
    worker.track_fsdp_step = guarded_tracker(worker.track_fsdp_step, skipped)
    result = worker.main(config, rank)
    return GuardedResult(result, skipped[0] if skipped else "ok")


# --- the launch -------------------------------------------------------------------------


def dp_world_size(ctx: Context) -> int:
    """Ranks: the visible GPUs, at most 2 (one per rank); 2 on the CPU (``--smoke``)."""
    if ctx.device_type == "cpu":
        return MAX_RANKS
    return min(torch.cuda.device_count(), MAX_RANKS)


def dp_config(ctx: Context) -> DataParallelConfig:
    """The lesson's launch at this run's profile, on this run's device type."""
    return DataParallelConfig.for_profile(ctx.profile, device=ctx.device_type)


def launch_guarded(config: DataParallelConfig, nproc: int,
                   timeout: float = 300.0) -> tuple[DataParallelResult, str]:
    """The lesson's launch through this module's :func:`main`: (result, tracker outcome)."""
    guarded = GuardedConfig(**{f.name: getattr(config, f.name) for f in fields(config)})
    answer = launch(guarded, nproc=nproc, timeout=timeout)
    return answer.lesson, answer.fsdp_tracker


# --- what is recorded -------------------------------------------------------------------


def proof_figures(result: DataParallelResult) -> dict:
    """Every verdict: all together, the collectives, no_sync, and each run's failing proofs."""
    failing = {name: [p.as_dict() for p in run.proofs if not p.ok]
               for name, run in result.runs.items()}
    return {
        "ok": result.ok,
        "collectives_ok": all(p.ok for p in result.collective_checks),
        "no_sync_ok": result.no_sync_ok,
        "no_sync_all_reduces": result.no_sync_all_reduces,
        "runs_ok": {name: run.ok for name, run in result.runs.items()},
        "failing": {name: rows for name, rows in failing.items() if rows},
    }


def bytes_figures(result: DataParallelResult) -> dict:
    """What rank 0 sent per technique in one step: ``total`` by the ring formula (NCCL's
    ring), by gloo's algorithms, on the wire (None with NCCL: ``wire_reason``), the ring
    total over one all-reduce of the weights, and the verdict on the calls and the wire."""
    s, one = result.weight_bytes, result.all_reduce_bytes
    checks = {c.run: c for c in result.traffic_checks()}
    rows = {name: {"calls": dict(run.traffic.calls()), "total": run.traffic.total_ring,
                   "gloo": run.traffic.total_gloo, "wire": run.traffic.wire,
                   "x_all_reduce": run.traffic.total_ring / one if one else None,
                   "calls_as_planned": checks[name].calls_as_planned,
                   "wire_ok": checks[name].wire_ok}
            for name, run in result.runs.items()}
    return {"weight_bytes": s, "wire_reason": result.wire_reason, "per_technique": rows}


def ledger_figures(result: DataParallelResult) -> dict:
    """Rank 0's ledgers measured and predicted, whether they match, and where they differ."""
    measured, predicted = result.measured_ledgers(), result.predicted_ledgers()
    m, p = measured.as_dict(), predicted.as_dict()
    differences = {row: {k: m[row][k] - p[row][k] for k in m[row]
                         if k != "peak_allocated" and m[row][k] != p[row][k]} for row in m}
    return {"match": measured.matches(predicted), "measured": m, "predicted": p,
            "differences": {row: d for row, d in differences.items() if d}}


def fit_figures(result: DataParallelResult) -> dict:
    """Each collective's t = alpha + beta x bytes rank 0 sent, on the wire where it was
    read, else by gloo's algorithms (with NCCL they equal the ring formula's for
    all-reduce and all-gather); no slope when nothing is sent."""
    out = {}
    for name, fit in result.fits().items():
        sends = fit.beta_s_per_byte > 0
        out[name] = {"alpha_s": fit.alpha_s, "beta_s_per_byte": fit.beta_s_per_byte,
                     "bandwidth_gb_s": fit.bandwidth / 1e9 if sends else None,
                     "relative_residuals": fit.relative_residuals,
                     "sent_bytes": fit.sent_bytes, "times_s": fit.times_s}
    return out


def tracker_figures(result: DataParallelResult, outcome: str) -> dict:
    """FSDPMemTracker's own peaks per FSDP2 run, or why they are missing."""
    return {"outcome": outcome,
            "own_peaks": {name: asdict(run.tracker) for name, run in result.runs.items()
                          if run.tracker}}


def record(result: DataParallelResult, outcome: str, fig: dict) -> None:
    """Everything the step records, into ``fig``."""
    fig.update(world_size=result.world_size, backend=result.backend,
               backend_reason=result.reason, parameters=result.parameters)
    if result.world_size == 1:
        fig["note"] = ONE_RANK_NOTE
    fig["proofs"] = proof_figures(result)
    fig["bytes"] = bytes_figures(result)
    fig["ledgers"] = ledger_figures(result)
    fig["fits"] = fit_figures(result)
    fig["fsdp_tracker"] = tracker_figures(result, outcome)
    t = result.timeline
    fig["ddp_overlap"] = {"buckets": len(t.buckets), "comm_s": t.comm_s,
                          "overlapped_s": t.overlapped_s, "exposed_s": t.exposed_s,
                          "compute_with_comm_s": result.overlap_cost.with_comm_s,
                          "compute_without_comm_s": result.overlap_cost.without_comm_s}


def judge(result: DataParallelResult, fig: dict) -> None:
    """On gloo (float32 on the CPU, as the reference) the proofs must hold, and at 2 ranks
    the ledgers and the bytes sent must match their predictions; NCCL's runs on GPUs are
    recorded, not judged."""
    if result.backend != "gloo":
        return
    failing = [name for name, ok in fig["proofs"]["runs_ok"].items() if not ok]
    problems = [] if result.ok else [f"proofs: {', '.join(failing) or 'collectives, no_sync'}"]
    if result.world_size > 1 and not fig["ledgers"]["match"]:
        problems.append(f"ledgers differ: {fig['ledgers']['differences']}")
    if result.world_size > 1 and not result.traffic_ok:
        problems.append("bytes sent: calls not as planned or wire out of bounds")
    if problems:
        raise AssertionError("; ".join(problems))


def step_data_parallel(ctx: Context, fig: dict) -> None:
    """Lesson 06 on up to 2 GPUs: proofs, bytes, ledgers, alpha-beta fits."""
    config, nproc = dp_config(ctx), dp_world_size(ctx)
    fig.update(profile=ctx.profile.name, device=config.device, nproc=nproc,
               model={"vocab": config.model.vocab, "hidden": config.model.hidden,
                      "blocks": config.model.blocks, "batch": config.batch, "seq": config.seq})
    result, outcome = launch_guarded(config, nproc)
    record(result, outcome, fig)
    print(f"world size {result.world_size} ({result.backend}); proofs "
          f"{'ok' if result.ok else 'NOT ok'}; ledgers match: {fig['ledgers']['match']}; "
          f"FSDPMemTracker: {outcome}")
    if result.world_size > 1:  # the table's ratio divides by DDP's bytes: 0 at 1
        print(bytes_table(result))
    judge(result, fig)


if __name__ == "__main__":  # one rank of launch_guarded's torchrun launch
    serve(GuardedConfig, main)
