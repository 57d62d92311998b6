"""Lesson 05: what ``device_map="auto"`` does before it fills: balance the GPUs.

transformers' ``from_pretrained(device_map=...)`` knows four strategies. ``"sequential"``
fills GPU 0, then GPU 1, ... under ``max_memory`` as given. ``"auto"``, ``"balanced"`` and
``"balanced_low_0"`` first call ``accelerate.utils.get_balanced_memory``, which lowers the
budget of every GPU but the last to about an even share of the model, and only then fill
(``accelerate.infer_auto_device_map``). :func:`balanced_budgets` is that function by hand,
step for step, so that it gives accelerate's numbers to the byte.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from helpers.placement.sizing import Device, module_sizes, parse_budgets

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def validate_strategy(strategy: object) -> str:
    """``strategy`` if it is one of transformers' ``device_map`` strategies, else ValueError."""
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        valid = ", ".join(repr(s) for s in STRATEGIES)
        raise ValueError(f"strategy = {strategy!r} is not a device_map strategy; valid: {valid}")
    return strategy


def weight_holders(model: nn.Module) -> list[str]:
    """Names of the modules that hold weights, in the order accelerate meets them.

    accelerate sizes the model from its tensors, parameters first, then buffers: a module
    appears with its first tensor, and a module without tensors does not appear at all.
    """
    found: dict[str, None] = {}
    for tensor, _ in [*model.named_parameters(), *model.named_buffers()]:
        parts = tensor.split(".")
        for i in range(1, len(parts)):  # the modules around the tensor, outermost first
            found.setdefault(".".join(parts[:i]))
    return list(found)


def block_size(model: nn.Module, sizes: Mapping[str, int], no_split: Iterable[str]) -> int:
    """Bytes of an unsplittable block: the largest of the *first* module met of each class."""
    first: dict[str, int] = {}
    for name in weight_holders(model):
        kind = type(model.get_submodule(name)).__name__
        if kind in no_split:
            first.setdefault(kind, sizes[name])
    return max(first.values(), default=0)


def mean_final_size(model: nn.Module, sizes: Mapping[str, int]) -> int:
    """Mean bytes of the final modules: those holding weights with no such module inside."""
    holders = weight_holders(model)
    parents = {name.rsplit(".", 1)[0] for name in holders if "." in name}
    final = [name for name in holders if name not in parents]
    return int(sum(sizes[name] for name in final) / max(len(final), 1))


def balanced_budgets(
    model: nn.Module,
    max_memory: Mapping[Device, int | str],
    *,
    low_zero: bool = False,
    no_split: Iterable[str] | None = None,
    dtype: torch.dtype | None = None,
) -> dict[Device, int]:
    """``max_memory`` with the GPU budgets balanced, as ``get_balanced_memory`` computes them.

    ``low_zero`` (``device_map="balanced_low_0"``): keep GPU 0 as empty as the other GPUs
    allow, for the work ``generate`` does there. The CPU and disk budgets are left as given.
    """
    budgets = parse_budgets(max_memory)
    gpus = [d for d in budgets if isinstance(d, int) and budgets[d] > 0]
    if len(gpus) < 2:
        return budgets  # one GPU (or none): nothing to balance
    if low_zero and gpus != list(range(len(gpus))):
        raise ValueError(
            f"balanced_low_0 with GPUs {gpus}: accelerate counts the GPUs as 0, 1, ..., n-1; "
            f"valid: budgets above 0 for GPUs {list(range(len(gpus)))}"
        )
    if no_split is None:
        no_split = getattr(model, "_no_split_modules", None) or []
    sizes = module_sizes(model, dtype)
    total = sizes[""]

    # 1. An even share of the model per GPU (with low_zero, GPU 0 takes no share).
    share = total // (len(gpus) - 1 if low_zero else len(gpus))
    # 2. Plus slack, as a GPU holds whole blocks only: 1.25 x the larger of an unsplittable
    #    block and a mean final module (a Linear, a norm, ...).
    slack = int(1.25 * max(block_size(model, sizes, set(no_split)), mean_final_size(model, sizes)))
    # 3. That caps every GPU but the last, which keeps its budget in case the slack is short.
    for gpu in gpus[:-1]:
        if not (low_zero and gpu == 0):
            budgets[gpu] = min(share + slack, budgets[gpu])
    # 4. balanced_low_0: GPU 0 gets only what the other GPUs cannot hold.
    if low_zero:
        rest = sum(budgets[gpu] for gpu in gpus[1:])
        budgets[0] = min(max(0, total - rest), budgets[0])
    return budgets
