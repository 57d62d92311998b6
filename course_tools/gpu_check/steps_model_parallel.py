"""Steps 1-3 of ``make gpu-check``: the machine, lesson 01 (toy model), lesson 02 (ResNet50).

Each ``step_<name>(ctx, fig)`` proves what its lesson proves, then measures, and puts its
figures into ``fig`` as it goes, so a step that fails half-way keeps what it had.
"""

from __future__ import annotations

import copy
import platform
import shutil
import subprocess
from collections.abc import Iterable, Sequence

import torch

from course_tools.gpu_check.context import Context, release
from helpers.core.devices import cpu_cores, machine_info
from helpers.core.paths import display_path
from helpers.core.timing import Timing, measure, relative_difference

# --- 1. machine -------------------------------------------------------------------------


def nvidia_smi() -> list[dict]:
    """Name, memory and driver of every GPU, from nvidia-smi ([] when it is absent)."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = "--query-gpu=index,name,memory.total,driver_version"
    text = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    rows = [[c.strip() for c in line.split(",")] for line in text.strip().splitlines()]
    return [
        {"index": int(i), "name": n, "memory_mib": int(float(m)), "driver": d}
        for i, n, m, d in rows
    ]


def nccl_version() -> str | None:
    """NCCL's version as torch reports it, e.g. '2.27.3' (None without CUDA)."""
    if not torch.cuda.is_available():
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def step_machine(ctx: Context, fig: dict) -> None:
    """GPUs (names, memory, driver), torch, CUDA, NCCL, CPU cores, python."""
    info = machine_info()
    fig["description"] = info.describe()
    fig["gpus"] = [
        {
            "name": torch.cuda.get_device_name(i),
            "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
        }
        for i in range(info.gpu_count)
    ]
    try:
        fig["nvidia_smi"] = nvidia_smi()
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        fig["nvidia_smi"] = f"unreadable: {error}"
    smi = fig["nvidia_smi"]
    fig["driver"] = smi[0]["driver"] if isinstance(smi, list) and smi else "unknown (no nvidia-smi)"
    fig.update(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        nccl=nccl_version(),
        cpu_cores=cpu_cores(),
        python=platform.python_version(),
        cuda_visible=torch.cuda.is_available(),
        plan_2=ctx.plan(2).reason,
    )
    ctx.machine.update(fig)
    print(info.describe())


# --- 2. lesson 01 -----------------------------------------------------------------------


def _gb_s(mb: float, timing: Timing) -> float:
    return mb / 1e3 / timing.mean


def host_to_device_rows(
    sizes_mb: Sequence[float], device: torch.device, repeats: int
) -> list[dict]:
    """Pageable and pinned (non_blocking) host-to-device GB/s; measure() synchronises."""
    from helpers.model_parallel.transfer import copy_between

    rows = []
    for mb in sizes_mb:
        host = torch.empty(int(mb * 1e6) // 4).uniform_()
        fn, simulated = copy_between(host, device)
        row = {"size_mb": mb, "pageable_gb_s": _gb_s(mb, measure(fn, repeats=repeats))}
        if device.type == "cuda":
            pinned = host.pin_memory()
            t = measure(lambda p=pinned: p.to(device, non_blocking=True), repeats=repeats)
            row["pinned_gb_s"] = _gb_s(mb, t)
        else:
            row["pinned_gb_s"] = None
            row["note"] = "no CUDA: a clone stands in; pin_memory needs CUDA"
        row["simulated"] = simulated
        rows.append(row)
    return rows


def step_lesson01_toy(ctx: Context, fig: dict) -> None:
    """The toy model's training step proven equal to one device; copy bandwidths."""
    from helpers.core.checks import compare_training_step
    from helpers.model_parallel.transfer import transfer_rows
    from helpers.models.toy import SPLIT_TOLERANCE, ToyModel, copy_to_one_device

    plan, p = ctx.plan(2), ctx.profile.toy  # the source's sizes in every profile
    fig.update(devices=[str(d) for d in plan.devices], simulated=plan.simulated, plan=plan.reason)
    torch.manual_seed(0)
    model = ToyModel(*plan.devices, p.inputs, p.hidden, p.outputs)
    single = copy_to_one_device(model, plan.devices[0])
    x, y = torch.randn(p.batch, p.inputs), torch.randn(p.batch, p.outputs)
    comparison = compare_training_step(single, model, x.to(plan.devices[0]), y)
    fig["proof"] = {"atol": SPLIT_TOLERANCE, **{what: diff for what, diff in comparison.rows()}}
    print(comparison.check(atol=SPLIT_TOLERANCE))
    s = ctx.sizes
    fig["host_to_device"] = host_to_device_rows(s.copy_mb, plan.devices[0], s.copy_repeats)
    d2d = transfer_rows(list(s.copy_mb), *plan.devices, repeats=s.copy_repeats)
    fig["device_to_device"] = [
        {k: r[k] for k in ("size_mb", "seconds", "gb_s", "simulated")} for r in d2d
    ]
    for row in fig["host_to_device"]:
        print(row)


# --- 3. lesson 02 -----------------------------------------------------------------------


def _largest(tensors: Iterable[torch.Tensor]) -> float:
    return max((t.detach().abs().max().item() for t in tensors if t.numel()), default=0.0)


def resnet_proof(ctx: Context, devices: Sequence[torch.device], rtol: float) -> dict:
    """One training step of the split ResNet50 vs one device: max diffs, absolute and relative."""
    from helpers.core.checks import compare_steps, training_step
    from helpers.model_parallel.resnet import model_parallel_resnet50, one_hot_labels, resnet50

    torch.manual_seed(0)
    reference = resnet50().to(devices[0])
    candidate = model_parallel_resnet50(devices, model=copy.deepcopy(reference))
    b, size = ctx.profile.pipeline.batch, ctx.profile.pipeline.image_size
    x = torch.randn(b, 3, size, size).to(devices[0])
    labels = one_hot_labels(torch.randint(0, 1000, (b,)), 1000)
    ref = training_step(reference, x, labels)
    c = compare_steps(ref, training_step(candidate, x, labels))
    scale = {
        "output": _largest([ref.output]),
        "loss": abs(ref.loss),
        "grads": _largest(g for _, g in ref.grads),
        "weights": _largest(w for _, w in ref.weights),
    }
    diffs = {"output": c.output, "loss": c.loss, "grads": c.grads, "weights": c.weights}
    relative = {k: diffs[k] / scale[k] if scale[k] else diffs[k] for k in diffs}
    return {
        "mode": "training (BatchNorm uses batch statistics)",
        "rtol": rtol,
        "max_abs_diff": diffs,
        "relative_diff": relative,
        "worst_grad": c.worst_grad,
        "worst_weight": c.worst_weight,
        "agrees": all(v <= rtol for v in relative.values()),
    }


def step_lesson02_resnet(ctx: Context, fig: dict) -> None:
    """ResNet50 split proven in training mode; Model Parallel vs Single GPU; mp_vs_rn.png."""
    from helpers.core.plotting import bar_chart
    from helpers.model_parallel.resnet import model_parallel_resnet50, resnet50, train

    plan = ctx.plan(2)
    # cuDNN picks algorithms and sums in orders that vary between runs: a looser tolerance
    rtol = 1e-3 if ctx.device_type == "cuda" else 1e-5
    fig.update(devices=[str(d) for d in plan.devices], simulated=plan.simulated)
    fig["proof"] = resnet_proof(ctx, plan.devices, rtol)
    print(fig["proof"])
    if not fig["proof"]["agrees"]:
        raise AssertionError(f"ResNet50 split differs beyond rtol {rtol:g}: {fig['proof']}")
    release()
    s, r = ctx.sizes, ctx.profile.resnet
    fig["sizes"] = {
        "batch": r.batch,
        "image": r.image_size,
        "batches": r.batches,
        "repeats": s.rn_repeats,
        "warmup": 1,
    }
    single = resnet50().to(plan.devices[0])
    mp = model_parallel_resnet50(plan.devices)

    def loop(model: torch.nn.Module):
        return lambda: train(
            model, num_batches=r.batches, batch_size=r.batch, image_size=r.image_size
        )

    single_label = "Single GPU" if ctx.device_type == "cuda" else "Single CPU"
    t_mp = measure(loop(mp), repeats=s.rn_repeats, warmup=1, label="Model Parallel")
    t_single = measure(loop(single), repeats=s.rn_repeats, warmup=1, label=single_label)
    print(t_mp, t_single, sep="\n")
    fig["model_parallel"], fig["single"] = t_mp.as_dict(), t_single.as_dict()
    fig["mp_vs_single"] = relative_difference(t_mp, t_single)
    path = bar_chart(
        [t_mp.mean, t_single.mean],
        [t_mp.std, t_single.std],
        ["Model Parallel", single_label],
        ctx.figures / "mp_vs_rn.png",
        ylabel="ResNet50 Execution Time (Second)",
    )
    fig["figure"] = display_path(path)
