"""Steps 6-7 of ``make gpu-check``: the memory ledger and lesson 05's
``device_map``: tiny_lm on GPU 0 + CPU + disk with accelerate, proven and timed.
"""

from __future__ import annotations

import copy

import torch

from course_tools.gpu_check.context import Context, release
from helpers.core.timing import measure

# --- 6. memory --------------------------------------------------------------------------


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, int | float | str | bool | None) else str(value)


def _memory_cases(smoke: bool) -> dict:
    """(model, inputs, labels, what to estimate, estimate options) for each course model."""
    from helpers.model_parallel.resnet import one_hot_labels, resnet50, resnet_layers
    from helpers.models.llama import LMConfig, build_lm

    batch, size, seq = (4, 32, 16) if smoke else (32, 128, 1024)
    g = torch.Generator().manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    )
    lm = LMConfig(
        vocab=512 if smoke else 32000,
        hidden=64 if smoke else 1024,
        blocks=2 if smoke else 8,
        ffn=256 if smoke else 4096,
        heads=2 if smoke else 16,
    )
    ids = torch.randint(0, lm.vocab, (batch, seq), generator=g)
    resnet, llama = resnet50(1000), build_lm(lm)
    return {
        "mlp": (
            mlp,
            torch.randn(batch, 1024, generator=g),
            torch.randn(batch, 1024, generator=g),
            mlp,
            {"sample_shape": (1024,)},
        ),
        "resnet50": (
            resnet,
            torch.randn(batch, 3, size, size, generator=g),
            one_hot_labels(torch.arange(batch) % 1000, 1000),
            resnet_layers(resnet),  # torchvision's model: the estimator reads its layers
            {"sample_shape": (3, size, size)},
        ),
        "small_llama": (llama, ids, ids.roll(-1, dims=1), llama, {"seq": seq}),
    }


def step_memory(ctx: Context, fig: dict) -> None:
    """helpers.memory's measured ledger vs its estimate and vs the CUDA allocator's peak.

    One Adam step of each course model on one device: weights, grads and optimizer state
    must agree exactly; activations are reported as estimate / measured; the allocator's
    peak over the step is set beside the ledger's total (it also holds temporaries).
    """
    from helpers.memory import (
        Ledger,
        compare_ledgers,
        estimate_training_memory,
        measure_training_memory,
    )

    device = ctx.plan(1).devices[0]
    for name, (model, x, y, chain, options) in _memory_cases(ctx.smoke).items():
        model = model.to(device)  # in place: ``chain`` holds the same modules
        measured = measure_training_memory(model, x.to(device), y.to(device), optimizer="adam")
        row = str(device)
        estimated = estimate_training_memory(
            chain, batch=x.shape[0], optimizer="adam", names=[row], **options
        )
        # a kernel may keep a small tensor on the CPU (a random seed): reported, not compared
        ratios = {
            c["kind"]: c["ratio"] for c in compare_ledgers(Ledger({row: measured[row]}), estimated)
        }
        exact = all(ratios[k] == 1.0 for k in ("weights", "grads", "optimizer_state"))
        total, peak = measured[row].total, measured[row].peak_allocated
        fig[name] = {
            "measured": measured.as_dict()[row],
            "estimated": estimated.as_dict()[row],
            "estimate_over_measured": ratios,
            "parameter_state_exact": exact,
            "peak_allocated_over_ledger_total": peak / total if peak else None,
            "other_rows": {k: v for k, v in measured.as_dict().items() if k != row},
        }
        del model, chain
        release()
        if not exact:
            raise AssertionError(f"{name}: weights, grads or optimizer state differ: {ratios}")


# --- 7. device_map ----------------------------------------------------------------------


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
    from helpers.models.llama import build_lm
    from helpers.placement.offload import (
        accelerate_device_map,
        dispatch_with_offload,
        remove_offload_folder,
    )
    from helpers.placement.sizing import module_sizes

    profile = ctx.profile
    config = profile.lm.model
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
        (profile.lm.batch, profile.lm.seq),
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
