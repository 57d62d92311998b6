"""Steps 4-5 of ``make gpu-check``: lesson 03's pipeline, in one process and one per stage,
and lesson 04's schedules.

In-process micro-batching on ``plan_devices(2)`` vs the naive split, then the CPU pipeline
with K stage processes (gloo, one thread each) vs one process with one thread.
"""

from __future__ import annotations

import functools

import torch

from course_tools.gpu_check.context import Context, release
from helpers.core.devices import cpu_cores, plan_devices
from helpers.core.timing import Timing, measure


def single_thread_step(batch: int, image: int, steps: int) -> Timing:
    """A ResNet50 training step in this process with one thread: the CPU bench's baseline."""
    from torch import nn

    from helpers.model_parallel.resnet import one_hot_labels, resnet50

    torch.manual_seed(0)
    model = resnet50()
    images, labels = (
        torch.randn(batch, 3, image, image),
        one_hot_labels(torch.randint(0, 1000, (batch,)), 1000),
    )
    optimizer, loss_fn = torch.optim.SGD(model.parameters(), lr=0.01), nn.MSELoss()

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(model(images), labels).backward()
        optimizer.step()

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        return measure(step, repeats=steps, warmup=1, label="one process, one thread")
    finally:
        torch.set_num_threads(threads)


@functools.cache
def balanced_cut(stages: int, image: int) -> list[str]:
    """``balanced_cut_names``, counted once per (stages, image size)."""
    from helpers.pipeline.stage_cuts import balanced_cut_names

    return balanced_cut_names(stages, image)


def in_process_pipeline(ctx: Context) -> dict:
    """Micro-batches in one process on plan_devices(2) vs the naive split and one device."""
    from helpers.runs.pipeline.timings import in_process_timings

    s, p, plan = ctx.sizes, ctx.profile.pipeline, ctx.plan(2)
    cut = balanced_cut(2, p.image_size)
    timings = in_process_timings(
        p.batch,
        p.image_size,
        2,
        p.microbatches,
        cut,
        repeats=s.pipe_repeats,
        warmup=1,
        devices=plan.devices,
    )
    out = {"devices": [str(d) for d in plan.devices], "simulated": plan.simulated, "cut": cut}
    out.update({"single": timings.single.as_dict(), "naive_mp": timings.naive_mp.as_dict(),
                "microbatched": timings.microbatched.as_dict()})
    out["naive_over_microbatched"] = timings.naive_mp.mean / timings.microbatched.mean
    return out


def pipeline_processes(ctx: Context, stages: int, baseline: Timing) -> dict:
    """K stage processes (gloo on the CPU unless K GPUs give NCCL), proven, then timed at M
    micro-batches and at M = 1 (the same processes with nothing to overlap)."""
    from helpers.pipeline.schedule import ideal_speedup
    from helpers.runs.contract import launch
    from helpers.runs.pipeline.config import PipelineConfig

    s, p = ctx.sizes, ctx.cpu_profile.pipeline
    cut = balanced_cut(stages, p.image_size)
    config = PipelineConfig(batch=p.batch, image_size=p.image_size,
                            runs=(("gpipe", p.microbatches), ("gpipe", 1)), split=tuple(cut),
                            steps=s.cpu_steps, warmup=1)
    piped = launch(config, timeout=300)  # one process per stage
    timed = piped.timings()
    timing, no_overlap = timed[("gpipe", p.microbatches)], timed[("gpipe", 1)]
    return {
        "stages": stages,
        "backend": piped.backend,
        "backend_reason": plan_devices(stages, processes=True).reason,
        "cut_before": cut,
        **timing.as_dict(),
        "speedup": baseline.mean / timing.mean,
        "speedup_over_m1": no_overlap.mean / timing.mean,
        "ideal_speedup": ideal_speedup(stages, p.microbatches),
        "checks": [p.to_dict() for p in piped.proofs],
        # gloo: the same CPU arithmetic as the reference; NCCL stages run on GPUs (TF32)
        "check_agrees": piped.proofs_ok if piped.backend == "gloo" else None,
    }


def skip_reason(stages: int, cores: int, wanted: tuple[int, ...]) -> str | None:
    """Why K=``stages`` stage processes are not launched here (None: they are)."""
    if cores < stages:
        return f"{cores} CPU core(s): K={stages} stage processes need {stages}"
    if stages not in wanted:
        return "not in --smoke: it runs the code of K=2 again"
    return None


def step_pipeline(ctx: Context, fig: dict) -> None:
    """In-process micro-batching on the GPU(s); the CPU pipeline's speed-up vs K."""
    fig["in_process"] = in_process_pipeline(ctx)
    print(fig["in_process"]["naive_over_microbatched"], "= naive / micro-batched")
    release()
    s, p, cores = ctx.sizes, ctx.cpu_profile.pipeline, cpu_cores()
    baseline = single_thread_step(p.batch, p.image_size, s.cpu_steps)
    fig["cpu_bench"] = {
        "batch": p.batch,
        "image": p.image_size,
        "microbatches": p.microbatches,
        "cpu_cores": cores,
        "one_process_one_thread": baseline.as_dict(),
        "runs": [],
        "skipped": {},
    }
    for stages in (2, 4):
        reason = skip_reason(stages, cores, s.cpu_stages)
        if reason:
            print(f"K={stages} skipped: {reason}")
            fig["cpu_bench"]["skipped"][f"K={stages}"] = reason
            continue
        row = pipeline_processes(ctx, stages, baseline)
        fig["cpu_bench"]["runs"].append(row)
        print(f"K={stages} ({row['backend']}): speed-up {row['speedup_over_m1']:.2f} over the same "
              f"processes at M=1, {row['speedup']:.2f} over one process with one thread")
    bad = [r["stages"] for r in fig["cpu_bench"]["runs"] if r["check_agrees"] is False]
    if bad:
        from helpers.pipeline.schedule import PROOF_TOLERANCE

        raise AssertionError(f"pipelined step differs from one process for K={bad} "
                             f"(beyond {PROOF_TOLERANCE:g})")


def step_schedules(ctx: Context, fig: dict) -> None:
    """Lesson 04: GPipe, 1F1B, interleaved 1F1B and zero bubble on 2 ranks (NCCL with a GPU
    per rank, else gloo on the CPU), each proven against one process, then timed."""
    from course_tools.gpu_check.context import StepSkipped
    from helpers.pipeline.events import validate_instrumentable
    from helpers.pipeline.schedule import PROOF_TOLERANCE
    from helpers.runs.contract import launch
    from helpers.runs.schedules.config import SchedulesConfig

    try:
        validate_instrumentable()
    except RuntimeError as error:  # an older or newer torch without what lesson 04 wraps
        raise StepSkipped(str(error)) from None
    config = SchedulesConfig.for_profile(ctx.profile, steps=ctx.sizes.sched_steps, processes=2)
    result = launch(config, timeout=300)
    print(result.table())
    fig.update(result.numbers())
    fig["backend_reason"] = plan_devices(config.processes, processes=True).reason
    fig["proof_tolerance"] = PROOF_TOLERANCE
    # gloo: float32 on the CPU, as the reference; NCCL stages run on GPUs (recorded, not judged)
    bad = [name for name, run in result.runs.items() if not run.proof.ok]
    if bad and result.backend == "gloo":
        raise AssertionError(f"{bad} differ from one process beyond {PROOF_TOLERANCE:g}")
