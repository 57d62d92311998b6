"""``make bench`` section ``expert_parallel`` (lesson 11): one MoE layer with more experts
and more tokens than in class, on 2 and 4 gloo ranks, then the three balance runs for
longer.

Layers: 8 and 16 experts (top-2) on ep = 2 and 4, 512 tokens per rank, hidden 128 and
expert MLP 256 in float64 (the worker's dtype: its proofs are against one process). Each
launch is proven against one process and its bytes counted against what its routing
predicts; per rank it records its dispatch and combine all-to-alls' times (mean and std
over the timed calls, the warm-up excluded) beside the alpha-beta fit of
``all_to_all_single`` on the same ranks, its whole pass's time, the rows it received, and
the layer's imbalance (busiest rank, and busiest expert, over the mean).

Balance: the lesson's MoE small Llama (the small profile's) trained without balancing,
with the auxiliary loss and with the bias update (``balance_run``, the lesson's seed), for
the full profile's ``balance_steps`` (the lesson runs the small profile's, fewer); chart
``results/moe_balance_bench.png``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from helpers.core.paths import display_path, results_path
from helpers.expert_parallel.moe import MoEShape
from helpers.profiles import PROFILES, ExpertParallelSizes
from helpers.runs.contract import launch
from helpers.runs.expert_parallel.balance_runs import (
    MODES,
    BalanceRun,
    balance_chart,
    balance_run,
)
from helpers.runs.expert_parallel.config import EPLayerConfig
from helpers.runs.expert_parallel.results import A2ATime, EPLayerResult

FULL = PROFILES["full"]  # its balance_steps; the lesson's MoE Llama is the small profile's
LESSON = PROFILES["small"].expert_parallel
LAYOUTS = ((2, 8), (2, 16), (4, 8), (4, 16))  # (ep, experts)
LAYER = {"top_k": 2, "hidden": 128, "ffn": 256, "tokens": 512, "repeats": 8, "warmup": 2}
SEED = 3  # the lesson's balance runs' seed
LAST = 10  # steps a balance run's final loss and imbalance are averaged over
CHART = "moe_balance_bench.png"
NO_SLOPE = ("the fitted slope beta is not > 0 (the sizes' times differ by less than "
            "their noise): no bandwidth")


def timing(row: A2ATime) -> dict[str, float]:
    """One all-to-all's bytes, measured time (mean and std, ms) and the fit's time."""
    return {"sent_bytes": row.sent, "received_bytes": row.received, "mean_ms": row.mean_ms,
            "std_ms": row.std_ms, "fit_ms": row.predicted_ms}


def layer_figures(result: EPLayerResult) -> dict:
    """One launch: verdicts, imbalance, the all-to-all fit, and per rank its rows, bytes,
    dispatch and combine times and pass time; then the calls as a whole (slowest rank)."""
    fit, rows = result.a2a_fit, result.a2a_rows()
    ranks = []
    for side in result.ranks:
        counted = side.forward.get("all_to_all", 0.0) + side.backward.get("all_to_all", 0.0)
        mine = {row.call: timing(row) for row in rows if row.who == f"rank {side.rank}"}
        ranks.append({"rank": side.rank, "received_rows": sum(side.arrived),
                      "all_to_all_bytes": counted,
                      "predicted_all_to_all_bytes": result.predicted(side.rank).all_to_all,
                      **mine, "pass": {"mean_ms": side.mean_ms, "std_ms": side.std_ms}})
    return {"ep": result.ep, "experts": result.experts, **result.verdicts,
            "imbalance_ranks": result.rank_imbalance, "imbalance_experts": result.imbalance,
            "fit": {"sizes_bytes": result.a2a_sent, "alpha_us": fit.alpha_s * 1e6,
                    "gb_per_s": fit.bandwidth / 1e9 if math.isfinite(fit.bandwidth) else None,
                    "relative_residuals": fit.relative_residuals,
                    **({} if math.isfinite(fit.bandwidth) else {"note": NO_SLOPE})},
            "ranks": ranks,
            "slowest_rank": {row.call: timing(row) for row in rows if row.who == "slowest rank"}}


def balance_figures(run: BalanceRun) -> dict:
    """One balance run: the loss and the imbalance at the start and over the last steps."""
    last = min(LAST, run.steps)
    return {"steps": run.steps, "first_loss": run.losses[0],
            "final_loss": sum(run.losses[-last:]) / last,
            "first_imbalance": run.imbalance_per_step()[0],
            "final_imbalance": run.final_imbalance(last=last)}


def expert_parallel_section(layouts: Sequence[tuple[int, int]] = LAYOUTS,
                            layer: dict | None = None, *,
                            balance: ExpertParallelSizes = LESSON,
                            balance_steps: int = FULL.expert_parallel.balance_steps,
                            chart: str | Path = CHART) -> dict:
    """Per layout (ep, experts): one launch's verdicts, imbalance, per-rank bytes and times;
    then the three balance runs of ``balance``'s MoE Llama for ``balance_steps`` and their
    chart (``chart`` under results/ when relative)."""
    options = {f.name for f in fields(EPLayerConfig)} - {"ep", "experts", "device"}
    unknown = sorted(set(layer or {}) - options)
    if unknown:
        raise ValueError(f"layer keys {unknown}; valid: {sorted(options)}")
    bad = [(ep, experts) for ep, experts in layouts if ep < 2]
    if bad:
        raise ValueError(f"layouts {bad}; valid: ep >= 2 (one rank sends nothing to time)")
    sizes = {**LAYER, **(layer or {})}
    config = EPLayerConfig(device="cpu", **sizes)  # the flags not given keep their defaults
    recorded = {k: getattr(config, k) for k in {*sizes, "a2a_sizes", "a2a_repeats"}}
    recorded["a2a_sizes"] = list(recorded["a2a_sizes"])
    out: dict = {"layer": {**dict(sorted(recorded.items())), "dtype": "float64",
                           "backend": "gloo"}, "layouts": {}}
    for ep, experts in layouts:
        start = time.perf_counter()
        config = EPLayerConfig(ep=ep, experts=experts, device="cpu", **sizes)
        result = launch(config, nproc=ep, timeout=900)
        out["layouts"][f"ep={ep}, {experts} experts"] = f = layer_figures(result)
        rows = ", ".join(f"rank {r['rank']} {r['dispatch']['mean_ms']:.2f} ± "
                         f"{r['dispatch']['std_ms']:.2f} ms" for r in f["ranks"])
        print(f"  expert_parallel ep={ep}, {experts} experts: proven {f['proven']}, bytes "
              f"{f['bytes_as_predicted']}, imbalance (ranks) {f['imbalance_ranks']:.2f}; "
              f"dispatch {rows} ({time.perf_counter() - start:.0f} s)", flush=True)
    steps, lm = balance_steps, balance.model
    shape = MoEShape(lm.hidden, balance.moe_ffn, balance.experts, balance.top_k)
    runs = []
    for mode in MODES:  # balance_run runs on one thread
        start = time.perf_counter()
        runs.append(balance_run(lm, shape, steps=steps, mode=mode, seed=SEED,
                                batch=balance.batch, seq=balance.seq))
        f = balance_figures(runs[-1])
        print(f"  expert_parallel balance {mode}: {steps} steps, imbalance "
              f"{f['first_imbalance']:.2f} -> {f['final_imbalance']:.2f}, loss "
              f"{f['first_loss']:.2f} -> {f['final_loss']:.2f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    final = ", ".join(f"{run.mode} {balance_figures(run)['final_imbalance']:.2f}"
                      for run in runs)
    path = balance_chart(runs, chart if Path(chart).is_absolute() else results_path(chart),
                         f"{shape.experts} experts, top-{shape.top_k}: busiest expert / mean, "
                         f"last {LAST} of {steps} steps: {final}")
    out["balance"] = {"model": {k: getattr(lm, k) for k in
                                ("vocab", "hidden", "heads", "kv_heads", "blocks")},
                      "experts": shape.experts, "top_k": shape.top_k, "moe_ffn": shape.ffn,
                      "batch": balance.batch, "seq": balance.seq, "seed": SEED, "threads": 1,
                      "modes": {run.mode: balance_figures(run) for run in runs},
                      "chart": display_path(path)}
    layouts = out["layouts"].values()
    return {"proven": all(f["proven"] for f in layouts),
            "bytes_as_predicted": all(f["bytes_as_predicted"] for f in layouts),
            "chart": display_path(path), **out}
