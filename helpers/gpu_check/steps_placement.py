"""Steps 5-6 of ``make gpu-check``: memory (if ``helpers.memory`` exists) and lesson 04's
``device_map``: tiny_lm on GPU 0 + CPU + disk with accelerate, proven and timed.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect

import torch

from helpers.core.timing import measure
from helpers.gpu_check.context import Context, StepSkipped

# --- 5. memory --------------------------------------------------------------------------


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, int | float | str | bool | None) else str(value)


def step_memory(ctx: Context, fig: dict) -> None:
    """helpers.memory's ledger vs torch.cuda.max_memory_allocated (skipped when absent).

    Written before that module existed: it calls ``measure_training_memory(model, inputs,
    targets)`` on a small MLP and records what comes back beside the CUDA peak.
    """
    names = [n for n in ("helpers.memory", "helpers.core.memory") if importlib.util.find_spec(n)]
    if not names:
        raise StepSkipped("helpers.memory not present")
    module = importlib.import_module(names[0])
    fn = getattr(module, "measure_training_memory", None)
    if fn is None:
        raise StepSkipped(f"{names[0]} has no measure_training_memory")
    try:
        inspect.signature(fn).bind(None, None, None)
    except TypeError:
        raise StepSkipped(
            f"measure_training_memory{inspect.signature(fn)} does not take (model, inputs, "
            "targets), the call this check was written for"
        ) from None
    device = ctx.plan(1).devices[0]
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).to(device)
    x, y = torch.randn(64, 1024, device=device), torch.randn(64, 1024, device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    fig["ledger"] = _jsonable(fn(model, x, y))
    fig["max_memory_allocated"] = (
        torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    )


# --- 6. device_map ----------------------------------------------------------------------


def offload_budgets(sizes: dict[str, int], on_gpu: bool) -> dict:
    """Budgets from the module sizes: the embedding and two blocks on the first device, two
    blocks on the CPU (if GPU), the rest on disk; each main device keeps room for the
    largest layer (accelerate's reserve)."""
    block = sizes["blocks.0"]
    largest = max(sizes["embed"], sizes["head"], block)
    first = sizes["embed"] + 2 * block + largest + block // 2
    budgets: dict = (
        {0: first, "cpu": 2 * block + largest + block // 2} if on_gpu else {"cpu": first}
    )
    budgets["disk"] = sizes[""] * 2
    return budgets


def step_device_map(ctx: Context, fig: dict) -> None:
    """tiny_lm on GPU 0 + CPU + disk via accelerate, proven equal to one device, timed."""
    from helpers.core.profiles import get_profile
    from helpers.placement.offload import (
        accelerate_device_map,
        dispatch_with_offload,
        remove_offload_folder,
    )
    from helpers.placement.sizing import module_sizes
    from helpers.placement.tiny_lm import build_lm, lm_config_for

    profile = get_profile(ctx.sizes.lm_profile)
    config = lm_config_for(profile)
    model = build_lm(config)
    main = ctx.plan(1).devices[0]
    budgets = offload_budgets(module_sizes(model), main.type == "cuda")
    device_map = accelerate_device_map(model, budgets)
    placed = {str(d): sum(1 for v in device_map.values() if v == d) for d in budgets}
    fig.update(
        model=str(config),
        main_device=str(main),
        max_memory=_jsonable(budgets),
        modules_per_device=placed,
    )
    missing = [d for d, n in placed.items() if n == 0]
    if missing:
        raise AssertionError(f"the plan puts nothing on {missing}: {device_map}")
    reference = copy.deepcopy(model).to(main)
    folder = ctx.scratch / "offload"
    offload = dispatch_with_offload(model, device_map, folder)
    ids = torch.randint(
        0,
        config.vocab,
        (profile.lm_batch, profile.lm_seq),
        generator=torch.Generator().manual_seed(0),
    ).to(main)
    try:
        with torch.no_grad():
            diff = (reference(ids).double() - model(ids).double()).abs().max().item()
        tol = 1e-5 if main.type == "cuda" else 1e-6
        fig["proof"] = {"max_abs_diff": diff, "tolerance": tol, "agrees": diff <= tol}
        fig["offload_bytes"] = offload.nbytes if offload else 0
        if diff > tol:
            raise AssertionError(f"dispatched model differs: max |diff| {diff:.3g} > {tol:g}")
        fig.update(timed_forwards(ctx, reference, model, ids, main))
    finally:
        remove_offload_folder(folder)


def timed_forwards(
    ctx: Context,
    reference: torch.nn.Module,
    dispatched: torch.nn.Module,
    ids: torch.Tensor,
    main: torch.device,
) -> dict:
    """Forward time: all on the main device vs GPU + CPU + disk."""

    def forward(net: torch.nn.Module):
        def run():
            with torch.no_grad():
                return net(ids)

        return run

    r = ctx.sizes.lm_repeats
    one = measure(forward(reference), repeats=r, warmup=1, label=f"all on {main}")
    spread = measure(forward(dispatched), repeats=r, warmup=1, label="GPU + CPU + disk")
    print(one, spread, sep="\n")
    return {
        "all_on_main": one.as_dict(),
        "offloaded": spread.as_dict(),
        "offloaded_over_one": spread.mean / one.mean,
    }
