"""The steps of ``make gpu-check`` in order, with their estimates, and the function of each.

``STEPS`` imports nothing heavy (the help lists it); ``execute`` imports the step modules,
and with them torch, only when the run starts.
"""

from __future__ import annotations

from collections.abc import Callable

from course_tools.gpu_check.context import Context, Step

STEPS = (
    Step("machine", "GPU names and memory, driver, torch, CUDA, NCCL, CPU cores, python", 5, 1),
    Step(
        "lesson01_toy",
        "toy model on plan_devices(2) proven equal to one device (atol 1e-6); host-to-device "
        "(pageable vs pinned) and device-to-device copy bandwidth for 1, 16, 128 MB",
        10,
        4,
    ),
    Step(
        "lesson02_resnet",
        "ResNet50 split proven equal to one device in a training step (relative 1e-3 on CUDA); "
        "Model Parallel vs Single GPU (batch 120, 128x128, 3 batches, 10 repeats); mp_vs_rn.png",
        40,
        10,
    ),
    Step(
        "pipeline",
        "in-process micro-batching vs the naive split on plan_devices(2); CPU pipeline with "
        "K=2 and K=4 stage processes (gloo, one thread each, lesson 03's CPU sizes) vs the same "
        "processes at M=1",
        90,
        40,
    ),
    Step(
        "schedules",
        "lesson 04: GPipe, 1F1B, interleaved 1F1B, zero bubble on 2 ranks (NCCL with a GPU "
        "per rank, else gloo on the CPU), each proven against one process, then timed",
        40,
        12,
    ),
    Step("memory", "the memory ledger: measured vs estimated vs the CUDA allocator's peak", 15, 3),
    Step(
        "device_map",
        "tiny_lm (full profile) on GPU 0 + CPU + disk with accelerate; output proven equal to "
        "one device; forward time vs all on the GPU",
        30,
        4,
    ),
    Step(
        "data_parallel",
        "lesson 06: DDP, hand ZeRO-1/2/3 and FSDP2 on one GPU per rank (NCCL, at most 2 ranks; "
        "1 GPU: world size 1, nothing sent), full profile: proofs, bytes sent per technique, "
        "ledgers measured vs predicted, alpha-beta fit per collective",
        60,
        30,
    ),
    Step(
        "tensor_parallel",
        "the source's tp_demo command; shards; tp ranks (NCCL, one GPU per rank) and DTensor "
        "proven equal to native, plus one training step; native vs tp timings",
        90,
        45,
    ),
    Step(
        "transformer_tp",
        "lesson 09: the small Llama (GQA, RoPE, vocab-parallel embedding and loss) tensor-"
        "parallel on one GPU per rank (NCCL, tp 4, 2 or 1 as the GPUs allow; 1 GPU: tp 1, "
        "nothing sent), full profile, without and with sequence parallelism: proofs, "
        "parallelize_module vs the hand split, bytes sent and activations kept vs predicted, "
        "held weights, step/comm/compute times",
        60,
        15,
    ),
    Step(
        "context_parallel",
        "one attention layer split over the sequence (ring, zig-zag, all-gathered keys and "
        "values, Ulysses) on one GPU per rank (NCCL; cp 2, or 1 with one GPU), each proven "
        "against one process in float64, bytes counted, per-rank times; PyTorch's "
        "context_parallel() on the same layer (its default rotation, an all-gather, over the flash "
        "kernel) beside the hand version",
        40,
        15,
    ),
    Step(
        "expert_parallel",
        "lesson 11: one MoE layer (8 experts, top-2) with its experts split over one GPU per "
        "rank (NCCL; ep 2, then 4 and 8 as the GPUs allow, 1 with one GPU), and at ep 2 with "
        "a capacity limit and a shared expert: each proven against one process in float64, "
        "every rank's bytes counted vs predicted from its routing, tokens dropped as one "
        "process drops them, per-rank all-to-all and pass times",
        60,
        12,
    ),
    Step(
        "debugging",
        "lesson 12: the traced launch on 2 GPUs (NCCL): each rank's torch.profiler trace with "
        "its kernels merged into one timeline, the share of DDP's NCCL all-reduce kernels "
        "hidden beside other kernels (buckets vs one bucket), CommDebugMode's counts of the "
        "tensor-parallel plan vs the prediction; the MFU of a bfloat16 training step against "
        "the GPU's published dense BF16 peak",
        60,
        25,
    ),
    Step(
        "composed",
        "lesson 13: the small Llama in 3-D (FSDP x TP+SP x 1F1B) on one GPU per rank (NCCL), "
        "and its mixture of experts with the experts over the dp ranks (ep x tp x pp): with "
        "8 GPUs every layout and the checkpoint round trip, with fewer the layouts that fit, "
        "with 1 the one-device run; float64 proofs against one process, ledgers, bytes per "
        "mesh dimension and times recorded",
        120,
        20,
    ),
)

StepFunction = Callable[[Context, dict], None]


def step_functions() -> dict[str, StepFunction]:
    """Step name -> ``step_<name>(ctx, fig)``, found by that name in the ``steps_*`` modules
    (so a new step is one ``Step`` above and one ``step_<name>`` function); imports the step
    modules (and torch)."""
    from course_tools.gpu_check import (
        steps_composed,
        steps_context_parallel,
        steps_data_parallel,
        steps_debugging,
        steps_expert_parallel,
        steps_model_parallel,
        steps_pipeline,
        steps_placement,
        steps_tensor_parallel,
        steps_transformer_tp,
    )

    modules = (steps_model_parallel, steps_pipeline, steps_placement, steps_data_parallel,
               steps_tensor_parallel, steps_transformer_tp, steps_context_parallel,
               steps_expert_parallel, steps_debugging, steps_composed)
    found = {
        name.removeprefix("step_"): getattr(module, name)
        for module in modules
        for name in vars(module)
        if name.startswith("step_") and callable(getattr(module, name))
    }
    missing = [s.name for s in STEPS if s.name not in found]
    if missing:
        raise LookupError(f"no step_<name> function for step(s) {missing}; valid: {sorted(found)}")
    return {s.name: found[s.name] for s in STEPS}


def execute(ctx: Context) -> Callable[[Step, dict], None]:
    """The runner's callback: ``step_<name>(ctx, fig)``."""
    functions = step_functions()

    def run(step: Step, fig: dict) -> None:
        functions[step.name](ctx, fig)

    return run
