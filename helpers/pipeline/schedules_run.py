"""Launch the pipeline-schedules lesson's ranks and turn their events into numbers.

Used by lesson 04 and by ``make bench`` (section ``schedules``). Every choice is checked
before any process starts; a failing rank comes back as a ``LaunchError`` with its log.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from helpers.distributed.launcher import launch
from helpers.pipeline.events import COMPUTE, bubble_theory, idle_fractions
from helpers.pipeline.mlp_stack import CHUNKS_PER_RANK, SCHEDULE_NAMES, validate_plan
from helpers.pipeline.timeline import ideal_timeline

MODULE = "helpers.pipeline.schedules_worker"
PROOF_TOLERANCE = 1e-5  # float32, the same products summed in another order


def launch_schedules(
    names: Sequence[str] = SCHEDULE_NAMES, *, ranks: int = 2, microbatches: int, batch: int,
    width: int, blocks: int, steps: int, timeout: float = 900,
) -> dict:
    """Run every schedule in one launch of ``ranks`` processes; adds each one's ideal timeline."""
    for name in names:
        validate_plan(name, ranks, microbatches, blocks, batch)
    args = {"--schedules": ",".join(names), "--microbatches": microbatches, "--batch": batch,
            "--width": width, "--blocks": blocks, "--steps": steps}
    result = launch(MODULE, [str(x) for kv in args.items() for x in kv], nproc=ranks,
                    timeout=timeout)
    for name, run in result["schedules"].items():
        run["ideal"] = ideal_timeline(run["actions"], ranks, CHUNKS_PER_RANK[name])
    return result


def _ideal_idle(ideal: list[dict], ranks: int) -> float:
    span = max(a["end"] for a in ideal)
    return 1 - sum(a["end"] - a["start"] for a in ideal) / (span * ranks)


def schedule_numbers(result: dict) -> dict[str, dict]:
    """Per schedule: step time, idle fraction per rank (measured), the bubble in theory and in
    the ideal replay, peak activation bytes per rank, and whether the proof passed."""
    ranks, m = result["ranks"], result["microbatches"]
    out = {}
    for name, run in result["schedules"].items():
        v = CHUNKS_PER_RANK[name]
        proof = run["proof"]
        busy = {k: [sum(a["end_ns"] - a["start_ns"] for a in run["actions"]
                        if a["rank"] == r and a["kind"] == k) / 1e9 for r in range(ranks)]
                for k in COMPUTE}
        out[name] = {
            "ranks": ranks, "microbatches": m, "chunks_per_rank": v,
            "step_s": statistics.mean(run["times_s"]),
            "step_std_s": statistics.stdev(run["times_s"]) if len(run["times_s"]) > 1 else 0.0,
            "idle_fraction": idle_fractions(run["actions"], ranks, run["start_ns"], run["end_ns"]),
            "ideal_idle_fraction": _ideal_idle(run["ideal"], ranks),
            "free_communication_idle_fraction": _ideal_idle(
                ideal_timeline(run["actions"], ranks, v, measured_costs=True), ranks),
            "bubble_theory": bubble_theory(name, ranks, m, v),
            "seconds_by_kind": {k: t for k, t in busy.items() if any(t)},
            "peak_activation_bytes": run["peak_activation_bytes"],
            "proof": proof,
            "proof_ok": max(proof.values()) <= PROOF_TOLERANCE,
        }
    return out


def format_numbers(numbers: dict[str, dict]) -> str:
    """The numbers as an aligned table (idle and peak per rank)."""
    lines = [f"{'schedule':<17}{'step (ms)':>10}  {'idle per rank':<14}{'free comm':>10}"
             f"{'ideal':>7}{'theory':>8}  {'peak activations (MiB)':<24}proof"]
    for name, n in numbers.items():
        idle = " ".join(f"{f:.0%}" for f in n["idle_fraction"])
        peak = " ".join(f"{b / 2**20:.1f}" for b in n["peak_activation_bytes"])
        lines.append(f"{name:<17}{n['step_s'] * 1e3:>10.0f}  {idle:<14}"
                     f"{n['free_communication_idle_fraction']:>10.0%}"
                     f"{n['ideal_idle_fraction']:>7.1%}{n['bubble_theory']:>8.1%}  {peak:<24}"
                     f"{'OK' if n['proof_ok'] else 'FAILED'}")
    return "\n".join(lines)


def cost_split_report(numbers: dict[str, dict], schedule: str = "zero_bubble") -> str:
    """Where zero bubble's idle time comes from: its measured I/F and W/F per rank, then its
    idle share three ways (the formula with I = W = F, the same order replayed with the
    measured costs and free sends, and measured)."""
    n = numbers[schedule]
    seconds = n["seconds_by_kind"]
    lines = [f"{schedule}, rank {r}: I/F = {seconds['I'][r] / seconds['F'][r]:.2f}, "
             f"W/F = {seconds['W'][r] / seconds['F'][r]:.2f} (the formula assumes 1 and 1)"
             for r in range(n["ranks"])]
    lines.append(f"idle share: {n['bubble_theory']:.1%} with I = W = F (formula and replay); "
                 f"{n['free_communication_idle_fraction']:.1%} replaying the same order with "
                 "this run's measured costs and free sends; measured per rank: "
                 + " ".join(f"{x:.0%}" for x in n["idle_fraction"]))
    return "\n".join(lines)
