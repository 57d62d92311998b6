"""The debugging step of ``make gpu-check``: lesson 12's instruments on the GPUs present.

With two GPUs or more: the traced launch on 2 ranks (NCCL, the full profile's sizes):
each rank's ``torch.profiler`` trace with its CUDA kernels, merged into one timeline, and
the share of DDP's all-reduce kernels (NCCL's) that ran beside other kernels, with buckets
and with one bucket; ``CommDebugMode``'s counts of the tensor-parallel plan against the
prediction. On any GPU: the MFU of a bfloat16 training step of the small Llama (timed by
``helpers.core.timing.measure``: warm-up excluded, the GPU synchronised at each reading)
against the GPU's published dense BF16 peak,
when the course knows the GPU's name. ``--smoke``: the traced launch on two gloo ranks at
the smoke sizes, and the MFU against this CPU's measured peak.
"""

from __future__ import annotations

import torch

from course_tools.gpu_check.context import Context, StepSkipped

TIMEOUT_S = 600.0
STEPS = 10  # timed bfloat16 steps (after 3 warm-up steps)


def traced_figures(ctx: Context, device: str) -> dict:
    """The traced launch on 2 ranks: overlap per rank and setting, plan counts."""
    from helpers.debugging import plan_counts
    from helpers.debugging.overlap import breakdown
    from helpers.debugging.trace import merge_traces, rank_activity, read_merged
    from helpers.runs.contract import launch
    from helpers.runs.debugging.config import TraceConfig

    folder = ctx.scratch / "traces"
    result = launch(TraceConfig.for_profile(ctx.profile, trace_dir=str(folder), device=device),
                    nproc=2, timeout=TIMEOUT_S)
    gpu = device == "cuda"
    out: dict = {"device": result.device, "ddp": {}}
    for setting, runs in (("overlap", result.ddp_overlap), ("one_bucket", result.ddp_one_bucket)):
        merged = merge_traces([r.path for r in runs], folder / f"ddp_{setting}_merged.json")
        rows = []
        for trace, run in zip(read_merged(merged.path), runs, strict=True):
            act = rank_activity(trace, gpu=gpu)
            b = breakdown(act.computing, act.communicating, trace.span("ddp step"))
            rows.append({"rank": trace.rank, "overlap_share": round(b.overlap_share, 4),
                         "shares": {k: round(v, 4) for k, v in b.shares().items()},
                         "communicating_events": len(act.communicating),
                         "buckets": len(run.buckets),
                         "hook_overlapped_ms": round(run.hook_overlapped_ms, 3)})
        out["ddp"][setting] = {"merged_trace": str(merged.path), "ranks": rows}
    blocks = result.model.blocks
    out["plans"] = [{"sequence_parallel": p.sequence_parallel, "counted": p.total,
                     "predicted": plan_counts.predicted_totals(blocks, p.sequence_parallel),
                     "as_predicted": p.total == plan_counts.predicted_totals(
                         blocks, p.sequence_parallel)} for p in result.plans]
    return out


def mfu_figures(ctx: Context, gpu: bool) -> dict:
    """One training step of the profile's small Llama: its model FLOPs over its time, against
    the GPU's dense BF16 peak (or this CPU's measured peak)."""
    from helpers.core.timing import measure
    from helpers.debugging.flops import gpu_peak, measure_peak, step_flops, training_step
    from helpers.models.llama import build_lm
    from helpers.runs.tp_llama.step import make_batch

    sizes = ctx.profile.debugging
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    model = build_lm(sizes.model, seed=0).train().to(device, dtype)
    ids, targets = (t.to(device) for t in make_batch(sizes.model.vocab, sizes.batch, sizes.seq, 0))
    step = training_step(model, ids, targets)

    # warm-up excluded; the clock synchronises CUDA before each reading
    timing = measure(step, repeats=2 if ctx.smoke else STEPS, warmup=3, label="training step")
    flops = step_flops(sizes.model, sizes.batch, sizes.seq)
    if gpu:
        name = torch.cuda.get_device_name()
        try:
            peak = gpu_peak(name)
        except ValueError as error:
            return {"gpu": name, "step_mean_ms": round(1e3 * timing.mean, 3),
                    "note": str(error)}
        peak_flops, source = peak.dense_tflops * 1e12, f"{peak.name} dense BF16 ({peak.source})"
    else:
        measured = measure_peak(ctx.cpu_profile.debugging.peak_size)
        peak_flops, source = measured.flops_per_s, "this CPU, measured (1 thread, float32)"
    mean = timing.mean
    return {"dtype": str(dtype).removeprefix("torch."), "tokens": flops.tokens,
            "model_flops": flops.model, "hardware_flops": flops.hardware,
            "step_mean_ms": round(1e3 * mean, 3),
            "step_std_ms": round(1e3 * timing.std, 3),
            "peak_flops_per_s": peak_flops, "peak_source": source,
            "mfu": round(flops.model / mean / peak_flops, 5),
            "hfu": round(flops.hardware / mean / peak_flops, 5)}


def step_debugging(ctx: Context, fig: dict) -> None:
    """Lesson 12's traces, overlap, plan counts and MFU on the GPUs present."""
    gpus = torch.cuda.device_count() if ctx.device_type == "cuda" else 0
    if gpus == 1:
        fig["traced"] = {"note": "the traced launch needs 2 GPUs (one per rank); 1 present"}
    elif gpus >= 2 or ctx.smoke:
        fig["traced"] = traced_figures(ctx, "cuda" if gpus >= 2 else "cpu")
    else:
        raise StepSkipped("no GPU: lesson 12 runs its launch on the CPU itself")
    fig["mfu"] = mfu_figures(ctx, gpu=gpus > 0)
    traced = fig["traced"]
    for setting, data in traced.get("ddp", {}).items():
        shares = ", ".join(f"rank {r['rank']} {r['overlap_share']:.0%}" for r in data["ranks"])
        print(f"DDP {setting}: hidden {shares}", flush=True)
    m = fig["mfu"]
    if "mfu" in m:
        print(f"MFU {m['mfu']:.1%}, HFU {m['hfu']:.1%} against {m['peak_source']}", flush=True)
    bad = [p for p in traced.get("plans", []) if not p["as_predicted"]]
    if bad:
        raise AssertionError(f"CommDebugMode's counts differ from the prediction: {bad}")
