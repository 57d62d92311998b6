"""Lesson 05's views of a placement: tables of modules and devices, and a chart."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path

from torch import nn

from helpers.core.checks import Proof, Verdict
from helpers.core.sizes import format_bytes
from helpers.core.timing import Timing, within_spread
from helpers.memory.ledger import Ledger, compare_ledgers
from helpers.placement.planner import Device, Plan, device_of


def device_label(device: Device) -> str:
    """'GPU 0', 'CPU', 'disk'."""
    return f"GPU {device}" if isinstance(device, int) else {"cpu": "CPU"}.get(device, device)


def caught(error: Exception, width: int = 100) -> str:
    """A refusal as a lesson prints it: "caught: " and what was wrong, then the valid choices
    on lines of their own, wrapped at ``width`` characters."""
    what, found, valid = str(error).partition("; valid")
    wrap = dict(break_long_words=False, break_on_hyphens=False)
    lines = textwrap.wrap(f"caught: {what}", width, subsequent_indent="  ", **wrap)
    if found:
        lines += textwrap.wrap(f"valid{valid}", width, initial_indent="  ",
                               subsequent_indent="    ", **wrap)
    return "\n".join(lines)


def slower_verdict(timing: Timing, one: Timing) -> str:
    """Whether ``timing`` was slower (or faster) than ``one`` beyond the two runs' spread
    (their means further apart than their stds together), or within it."""
    ratio = f"{timing.label}: {timing.mean / one.mean:.2f}x the time of {one.label}"
    if within_spread(timing, one):
        return f"{ratio}, within the spread: no difference this run can show"
    return f"{ratio}: {'slower' if timing.mean > one.mean else 'faster'} beyond the spread"


def entry_device(model: nn.Module, name: str, device_map: Mapping[str, Device]) -> str:
    """Where ``device_map`` puts module ``name``: one device, or 'split: a+b' if it is cut."""
    prefix = f"{name}."
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    found = {device_of(n, device_map) for n in names if n == name or n.startswith(prefix)}
    labels = sorted(device_label(d) for d in found)
    return labels[0] if len(labels) == 1 else "split: " + "+".join(labels)


def plan_table(
    model: nn.Module,
    plan: Plan,
    others: Mapping[str, Mapping[str, Device]] | None = None,
    *,
    label: str = "hand planner",
) -> str:
    """One row per placed module: name, class, size, device; plus a column per other map."""
    others = others or {}
    modules = dict(model.named_modules())
    kinds = {n: type(modules[n]).__name__ if n in modules else "tensor" for n in plan.device_map}
    wn = max(len("module"), *map(len, kinds))
    wk = max(len("class"), *map(len, kinds.values()))
    lines = [f"{'module':<{wn}} {'class':<{wk}} {'size':>10}  {label:<12}"]
    lines[0] += "".join(f"  {k:<12}" for k in others)
    for name, device in plan.device_map.items():
        row = f"{name:<{wn}} {kinds[name]:<{wk}} {format_bytes(plan.sizes[name]):>10}  "
        row += f"{device_label(device):<12}"
        lines.append(
            row + "".join(f"  {entry_device(model, name, m):<12}" for m in others.values())
        )
    return "\n".join(line.rstrip() for line in lines)


def balanced(plan: Plan) -> bool:
    """True if balancing lowered some budget below ``max_memory``."""
    return any(plan.budgets[d] != b for d, b in plan.max_memory.items() if d in plan.budgets)


def usage_table(plan: Plan) -> str:
    """Per device: budget (and max_memory, if balancing lowered it), placed, held back, modules."""
    asked = balanced(plan)
    given = f" {'max_memory':>11}" if asked else ""
    lines = [f"{'device':<7}{given} {'budget':>11} {'placed':>11} {'held back':>11}  modules"]
    for device, budget in plan.budgets.items():
        names = plan.on(device)
        listed = ", ".join(names) if len(names) <= 4 else f"{names[0]} ... {names[-1]}"
        given = f" {format_bytes(plan.max_memory[device]):>11}" if asked else ""
        lines.append(
            f"{device_label(device):<7}{given} {format_bytes(budget):>11} "
            f"{format_bytes(plan.used.get(device, 0)):>11} "
            f"{format_bytes(plan.reserved.get(device, 0)):>11}  {len(names)}: {listed or '-'}"
        )
    return "\n".join(lines)


def _kind(name: str, model: nn.Module) -> str:
    modules = dict(model.named_modules())
    obj = modules.get(name)
    return type(obj).__name__ if obj is not None else "tensor"


def plot_plans(
    model: nn.Module, plans: Mapping[str, Plan], path: str | Path, *, title: str = ""
) -> Path:
    """Stacked bars of bytes per device, one panel per plan, saved atomically as PNG.

    Each bar stacks the modules placed on that device, coloured by class; a hatched
    segment is the room a plan held back; a dashed line marks the device's budget, and a
    dotted one its ``max_memory`` where balancing lowered the budget. A class too thin to
    see (no module of it over 1% of the axis) gets no legend entry. 7.5 inches wide, so
    that JupyterLab shows it at its own size; ``title`` should say what it shows.
    """
    import matplotlib.pyplot as plt

    from helpers.core.plotting import save_figure

    kinds = sorted({_kind(n, model) for p in plans.values() for n in p.device_map})
    colours = dict(zip(kinds, plt.get_cmap("tab10").colors, strict=False))
    fig, axes = plt.subplots(
        1, len(plans), figsize=(7.5, 3.9), sharey=True, squeeze=False
    )
    mib = 2**20
    stacks = [p.used.get(d, 0) + p.reserved.get(d, 0) for p in plans.values() for d in p.budgets]
    top = 1.25 * max(stacks) / mib  # budgets far above what is placed are written, not drawn
    for ax, (label, plan) in zip(axes[0], plans.items(), strict=True):
        devices = list(plan.budgets)
        for x, device in enumerate(devices):
            bottom = 0.0
            for name in plan.on(device):
                height = plan.sizes[name] / mib
                ax.bar(
                    x,
                    height,
                    bottom=bottom,
                    width=0.6,
                    edgecolor="white",
                    linewidth=0.6,
                    color=colours[_kind(name, model)],
                )
                bottom += height
            held = plan.reserved.get(device, 0) / mib
            if held:
                ax.bar(
                    x,
                    held,
                    bottom=bottom,
                    width=0.6,
                    color="none",
                    edgecolor="grey",
                    hatch="///",
                    linewidth=0.6,
                )
            budget = plan.budgets[device] / mib
            given = plan.max_memory.get(device, plan.budgets[device]) / mib
            if budget < given <= top:
                ax.hlines(given, x - 0.4, x + 0.4, colors="grey", linestyles="dotted")
            if budget <= top:
                ax.hlines(budget, x - 0.4, x + 0.4, colors="black", linestyles="dashed")
            else:
                ax.annotate(
                    f"budget {format_bytes(plan.budgets[device])} ↑",
                    (x, 0.97 * top),
                    ha="center",
                    va="top",
                    fontsize=8,
                )
        ax.set_ylim(0, top)
        ax.set_xticks(range(len(devices)), [device_label(d) for d in devices])
        ax.set_title(label, fontsize=9)
        ax.yaxis.grid(True, alpha=0.4)
        ax.set_axisbelow(True)
    axes[0][0].set_ylabel("MiB of weights")
    seen = [k for k in kinds if any(plan.sizes[n] >= 0.01 * top * mib and _kind(n, model) == k
                                    for plan in plans.values() for n in plan.device_map)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[k]) for k in seen]
    handles += [
        plt.Rectangle((0, 0), 1, 1, facecolor="none", edgecolor="grey", hatch="///"),
        plt.Line2D([0], [0], color="black", linestyle="dashed"),
    ]
    names = [*seen, "held back", "budget"]
    if any(balanced(p) for p in plans.values()):
        handles.append(plt.Line2D([0], [0], color="grey", linestyle="dotted"))
        names.append("max_memory")
    fig.legend(
        handles,
        names,
        loc="lower center",
        ncol=(len(handles) + 1) // 2,
        frameon=False,
        fontsize=8,
    )
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return save_figure(fig, path)


def ledger_verdict(measured: Ledger, estimated: Ledger, claim: str) -> Verdict:
    """One proof per row and kind of memory: |estimated - measured| bytes, allowed 0, since
    the estimate claims an exact count."""
    return Verdict(claim, [Proof(f"{r['row']} {r['kind']}", abs(r["estimated"] - r["measured"]), 0)
                           for r in compare_ledgers(measured, estimated)])
