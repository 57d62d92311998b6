"""``make bench``'s sections for lessons 03, 04 and 08: each lesson's run at a larger size
(lesson 03's also sweeps M and draws it, ``results/split_size_tradeoff.png``).

Each section is measured within one run, so its ratios compare like with like.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict

from helpers.core.devices import plan_devices
from helpers.core.paths import display_path, results_path
from helpers.pipeline.schedule import ideal_speedup
from helpers.pipeline.stage_cuts import balanced_cut_names
from helpers.profiles import PROFILES
from helpers.runs.contract import launch
from helpers.runs.pipeline.config import PipelineConfig
from helpers.runs.pipeline.report import split_size_chart
from helpers.runs.pipeline.timings import cost_per_image, in_process_timings
from helpers.runs.schedules.config import SchedulesConfig
from helpers.runs.tp_ffn.config import WORLD_SIZES, TPFFNConfig
from helpers.runs.tp_ffn.timings import tp_sweep

FULL = PROFILES["full"]  # make bench runs the full profile's sizes


def pipeline_section(
    batch: int = FULL.pipeline.batch,
    image_size: int = FULL.pipeline.image_size,
    stages: int = 2,
    microbatches: int = FULL.pipeline.microbatches,
    sweep: Sequence[int] = (1, 2, 4, 8),
    *,
    repeats: int = 5,
    warmup: int = FULL.warmup,
) -> dict:
    """The ``pipeline`` section of bench.json: all timings from the same run."""
    cut = balanced_cut_names(stages, image_size)
    local = in_process_timings(
        batch,
        image_size,
        stages,
        microbatches,
        cut,
        repeats=repeats,
        warmup=warmup,
        devices=plan_devices(stages, processes=True).devices,
    )
    runs = [("gpipe", microbatches), ("1f1b", microbatches)]
    runs += [("gpipe", m) for m in sorted(set(sweep) - {microbatches} | {1})]
    piped = launch(PipelineConfig(batch, image_size, tuple(runs), tuple(cut),
                                  steps=repeats, warmup=warmup, baselines=True), timeout=1800)
    timed = piped.timings()
    gpipe = timed[("gpipe", microbatches)]
    single = local.single
    chart = split_size_chart(single, timed, stages, results_path("split_size_tradeoff.png"),
                             title=f"batch {batch} at {image_size}x{image_size}, K={stages}")
    return {
        "stages": stages,
        "microbatches": microbatches,
        "batch": batch,
        "image_size": image_size,
        "cut_before": cut,
        "single_s": single.mean,
        "naive_mp_s": local.naive_mp.mean,
        "pipelined_s": gpipe.mean,
        "speedup": single.mean / gpipe.mean,
        "ideal_speedup": ideal_speedup(stages, microbatches),
        # like for like: the same processes with one micro-batch (nothing overlaps)
        "speedup_over_m1": timed[("gpipe", 1)].mean / gpipe.mean,
        "efficiency": timed[("gpipe", 1)].mean / gpipe.mean / ideal_speedup(stages, microbatches),
        "naive_vs_single": (local.naive_mp.mean - single.mean) / single.mean,
        "std_s": {"single": single.std, "naive_mp": local.naive_mp.std, "pipelined": gpipe.std},
        "single_all_threads_s": local.single_threads.mean if local.single_threads else None,
        "inprocess_microbatched_s": local.microbatched.mean,
        "sweep": [
            {
                "schedule": s,
                "microbatches": m,
                "mean_s": t.mean,
                "std_s": t.std,
                "speedup": single.mean / t.mean,
                "ideal_speedup": ideal_speedup(stages, m),
            }
            for (s, m), t in sorted(timed.items())
        ],
        "checks": [{**asdict(p), "ok": p.ok} for p in piped.proofs],
        "backend": piped.backend,
        "threads_per_stage": piped.config.threads if piped.backend == "gloo" else None,
        "repeats": repeats,
        "median_s": {"single": statistics.median(single.times), "pipelined": gpipe.median},
        "sweep_chart": display_path(chart),
        # lesson 03's baselines: the whole model in a stage process, 1 and K threads
        "single_stage_process_s": piped.single.mean,
        "single_stage_process_threads_s": piped.single_threads.mean,
        "speedup_over_one_process": piped.single.mean / gpipe.mean,
        # what a micro-batch costs per image against the whole batch (one thread)
        "cost_per_image_s": {
            f"{size}x{size}, batch {b}": cost
            for (size, b), cost in cost_per_image([image_size], [batch // microbatches, batch]).items()
        },
    }


def schedules_section(ranks: int = 2, steps: int = 5) -> dict:
    """``make bench``'s ``schedules`` section: lesson 04's run at the full profile's size."""
    config = SchedulesConfig.for_profile(FULL, steps=steps, processes=ranks)
    return launch(config, timeout=1800).numbers()


def tp_section() -> dict:
    """The ``tp`` section of bench.json: the source's sizes (full profile)."""
    config = TPFFNConfig.for_profile(FULL, ranks=max(WORLD_SIZES))
    sweep = tp_sweep(config, WORLD_SIZES)
    return {
        "sizes": {
            k: getattr(config, k) for k in ("hidden_size", "ffn_size", "seq_len", "batch_size")
        },
        "device": config.device,
        "dtype": config.dtype,
        "iters": config.iters,
        "warmup": config.warmup,
        "threads_per_rank": 1,
        "per_world_size": sweep.numbers(),
    }
