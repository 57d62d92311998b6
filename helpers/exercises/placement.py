"""Checkers for lesson 05 (``device_map="auto"`` placement)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import nn

from helpers.core.sizes import format_bytes
from helpers.exercises.feedback import Wrong, answer, checker
from helpers.placement.diagrams import peak_on_main
from helpers.placement.offload import accelerate_device_map
from helpers.placement.planner import Plan, device_of, plan_device_map, tensor_devices
from helpers.placement.sizing import Device, module_sizes, parse_budgets, tensor_bytes
from helpers.runs.placement.report import device_label


def target_map(model: nn.Module) -> dict[str, Device]:
    """Exercise 05.1's goal: embed and the first half of the blocks on GPU 0, the other blocks
    and the final norm on GPU 1, the head in CPU memory, nothing on disk."""
    blocks = len(model.blocks)
    goal: dict[str, Device] = {"embed": 0}
    goal |= {f"blocks.{i}": 0 if i < blocks // 2 else 1 for i in range(blocks)}
    return goal | {"norm": 1, "head": "cpu"}


def describe(device_map: Mapping[str, Device]) -> str:
    by_device: dict[str, list[str]] = {}
    for name, device in device_map.items():
        by_device.setdefault(device_label(device), []).append(name)
    return "; ".join(f"{d}: {', '.join(names)}" for d, names in by_device.items())


@checker("05.1", "Write the body of budgets_for_goal(sizes), then run this cell again.")
def check_budgets_for_goal(budgets_for_goal: Callable[[dict[str, int]], dict], model: nn.Module,
                           ) -> str:
    """Budgets under which accelerate's "sequential" plan is the goal, run through accelerate."""
    sizes = module_sizes(model)
    budgets = answer(budgets_for_goal, sizes)
    try:
        parse_budgets(budgets)
    except ValueError as error:
        raise Wrong(f"budgets_for_goal returned an invalid max_memory: {error}") from error
    planned = accelerate_device_map(model, budgets, strategy="sequential")
    goal = target_map(model)
    wrong = [(name, device_of(name, planned), want) for name, want in goal.items()
             if device_of(name, planned) != want]
    if wrong:
        name, got, want = wrong[0]
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        order = {0: 0, 1: 1, "cpu": 2, "disk": 3}
        hint = ("too little room before it: accelerate holds back room on a main device "
                "(GPU 0, and the CPU) for the largest layer still to place (Step 4)"
                if order[got] > order[want] else
                "too much room: a device takes modules in order while they fit under its budget")
        raise Wrong(f"With {budgets} accelerate puts {name} on {device_label(got)}, the goal is "
                    f"{device_label(want)}{more}. Its plan: {describe(planned)}", hint)
    return (f"accelerate's plan is the goal: {describe(planned)}. The same budgets passed as "
            "from_pretrained(..., device_map=\"sequential\", max_memory=...) give this map.")


def copied_reference(model: nn.Module, device_map: Mapping[str, Device]) -> int:
    """Bytes that one forward copies to GPU 0: every tensor mapped to the CPU or the disk."""
    placed = tensor_devices(model, device_map)
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    return sum(tensor_bytes(tensors[n]) for n, d in placed.items() if d in ("cpu", "disk"))


def _maps(model: nn.Module) -> list[dict[str, Device]]:
    total = module_sizes(model)[""]
    shares = ((0.45, 0.35, 0.25), (0.6, 0.0, 0.5), (0.3, 0.3, 0.1), (1.2, 0.0, 0.0))
    maps = []
    for gpu0, gpu1, cpu in shares:
        budgets = {0: int(gpu0 * total), 1: int(gpu1 * total), "cpu": int(cpu * total),
                   "disk": 10 * total}
        maps.append(accelerate_device_map(model, budgets, strategy="sequential"))
    return maps


def copied_hint(device_map: Mapping[str, Device], sizes: Mapping[str, int], got: int) -> str:
    """From the likely misconception behind a wrong ``copied_per_forward`` to the principle."""
    def on(*devices: Device) -> int:
        return sum(sizes[n] for n, d in device_map.items() if d in devices)

    if got == on("disk"):
        return ("layers in CPU memory are copied over too, not only those on disk: both run "
                "on the main device")
    if got == sizes[""]:
        return ("modules placed on a GPU stay there from one forward to the next; only what "
                "lives off the GPUs travels")
    if got == on(*(d for d in set(device_map.values()) if d != 0)):
        return ("a module on GPU 1 runs on GPU 1 (accelerate moves its inputs there); only the "
                "modules in CPU memory or on disk are brought to the main device, GPU 0")
    return "each module of the map counts once; sizes[name] already includes its children"


@checker("05.2", "Write the body of copied_per_forward(device_map, sizes), then run this cell "
                 "again.")
def check_copied_per_forward(copied_per_forward: Callable[[dict, dict[str, int]], int],
                             model: nn.Module) -> str:
    """Bytes brought to GPU 0 per forward, against the tensors the map places off the GPUs."""
    sizes = module_sizes(model)
    for device_map in _maps(model):
        got = answer(copied_per_forward, dict(device_map), dict(sizes))
        want = copied_reference(model, device_map)
        if got != want:
            hint = copied_hint(device_map, sizes, got)
            raise Wrong(f"For the map {describe(device_map)} you said {got:,} bytes; a forward "
                        f"brings {want:,} bytes to GPU 0", hint)
    return ("Every map tried matches. Generating 100 tokens runs 100 forwards: that many "
            "times these bytes cross PCIe (or come from disk), whatever the model computes.")


def peak_plans(model: nn.Module) -> list[tuple[bool, Plan]]:
    """Exercise 05.3's plans: (with the reserve?, plan) for two GPUs, the CPU and the disk,
    each fill with and without the reserve; every key of their maps is one layer."""
    total = module_sizes(model)[""]
    plans = []
    for gpu0, gpu1, cpu in ((0.45, 0.35, 0.25), (0.4, 0.3, 0.3), (0.5, 0.2, 0.4)):
        budgets = {0: int(gpu0 * total), 1: int(gpu1 * total), "cpu": int(cpu * total),
                   "disk": 10 * total}
        plans += [(reserve, plan_device_map(model, budgets, strategy="sequential",
                                            reserve_largest_layer=reserve))
                  for reserve in (False, True)]
    return plans


def peak_hint(device_map: Mapping[str, Device], sizes: Mapping[str, int], got: int) -> str:
    """From the likely misconception behind a wrong ``gpu0_peak`` to the principle."""
    home = sum(sizes[n] for n, d in device_map.items() if d == 0)
    away = [sizes[n] for n, d in device_map.items() if d in ("cpu", "disk")]
    if got == home:
        return ("an offloaded layer runs on GPU 0: for its turn its weights sit there, beside "
                "the layers that live on GPU 0")
    if got == home + sum(away):
        return ("the offloaded layers are not on GPU 0 all at once: each is dropped after it "
                "runs, so only the largest one sets the peak")
    if got == max(away, default=0):
        return "GPU 0 keeps its own layers for the whole forward: count them too"
    return ("a layer on GPU 1 runs on GPU 1; each key of device_map is one layer, and "
            "sizes[name] is its bytes")


@checker("05.3", "Write the body of gpu0_peak(device_map, sizes), then run this cell again.")
def check_gpu0_peak(gpu0_peak: Callable[[dict, dict[str, int]], int], model: nn.Module) -> str:
    """GPU 0 at its fullest, against ``peak_on_main``; then what the numbers say about why."""
    sizes = module_sizes(model)
    plans = peak_plans(model)
    over: dict[bool, list[tuple[int, int]]] = {False: [], True: []}
    for reserve, plan in plans:
        got = answer(gpu0_peak, dict(plan.device_map), dict(sizes))
        want = peak_on_main(model, plan)[0]
        if got != want:
            raise Wrong(f"For the map {describe(plan.device_map)} you said {got:,} bytes; GPU 0 "
                        f"holds {want:,} at its fullest", peak_hint(plan.device_map, sizes, got))
        if want > plan.budgets[0]:
            over[reserve].append((want, plan.budgets[0]))
    if over[True] or not over[False]:
        raise AssertionError(f"the exercise's plans no longer show the point: {over}")
    peak, budget = max(over[False], key=lambda o: o[0] - o[1])
    plain = sum(not reserve for reserve, _ in plans)
    return (f"Filled without the reserve, {len(over[False])} of {plain} plans overflow "
            f"GPU 0 once an offloaded layer is copied in (worst: {format_bytes(peak)} in a "
            f"budget of {format_bytes(budget)}); with it, none does. The held-back room is "
            "where that layer runs: that is why the fill keeps it free.")
