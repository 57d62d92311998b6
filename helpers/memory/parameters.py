"""Weights, grads and optimizer state from parameter counts: one device's whole copy, or
one data-parallel rank's share under ZeRO sharding."""

from __future__ import annotations

from helpers.memory.ledger import DeviceMemory
from helpers.memory.optimizers import STATE_COPIES, STEP_BYTES, validate_optimizer

PRECISIONS = ("fp32", "fp64", "mixed")
ELEMENT_BYTES = {"fp32": 4, "fp64": 8, "mixed": 2}  # weights, grads and activations as computed
ZERO_STAGES = (0, 1, 2, 3)


def validate_precision(name: str) -> str:
    """``name`` if known, else a ValueError naming the choices."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; valid choices: {', '.join(PRECISIONS)}")
    return name


def validate_zero(zero: object) -> int:
    """``zero`` if it is a ZeRO stage, else a ValueError naming the choices."""
    if type(zero) is not int or zero not in ZERO_STAGES:
        raise ValueError(f"unknown zero={zero!r}; valid choices: "
                         f"{', '.join(map(str, ZERO_STAGES))} (integers)")
    return zero


def validate_dp(dp: object) -> int:
    """``dp`` if it is a count of data-parallel ranks, else a ValueError."""
    if type(dp) is not int or dp < 1:
        raise ValueError(f"dp={dp!r}; valid: an integer >= 1 (data-parallel ranks)")
    return dp


def validate_recompute(recompute: object) -> bool:
    """``recompute`` if it is a bool, else a ValueError."""
    if not isinstance(recompute, bool):
        raise ValueError(f"recompute={recompute!r}; valid choices: True, False")
    return recompute


def parameter_memory(
    numel: int, tensors: int, *, optimizer: str, precision: str = "fp32", buffers: int = 0
) -> DeviceMemory:
    """Weights, grads and optimizer state for ``numel`` parameters in ``tensors`` tensors.

    ``fp32``: 4 bytes each for weights and grads, plus the optimizer's copies (``fp64``: 8;
    the step counters stay float32).
    ``mixed``: 16-bit weights and grads (2 + 2 bytes) and a float32 master copy (4) that
    the optimizer updates, plus its float32 copies: 16 bytes per parameter with Adam.
    """
    validate_optimizer(optimizer)
    if validate_precision(precision) != "mixed":
        e = ELEMENT_BYTES[precision]
        state = STATE_COPIES[optimizer] * e * numel
        return DeviceMemory(e * numel + buffers, e * numel, state + STEP_BYTES[optimizer] * tensors)
    state = (1 + STATE_COPIES[optimizer]) * 4 * numel + STEP_BYTES[optimizer] * tensors
    return DeviceMemory(2 * numel + buffers, 2 * numel, state)


def sharded_parameter_memory(
    numel: int, tensors: int, *, optimizer: str, precision: str = "fp32", dp: int = 1,
    zero: int = 0, unit: int = 0,
) -> DeviceMemory:
    """:func:`parameter_memory` on one of ``dp`` data-parallel ranks under ZeRO stage ``zero``.

    Stage 1 shards the optimizer state (with ``mixed``, the float32 master copy too),
    stage 2 the gradients as well, stage 3 the weights as well (FSDP's ``fully_shard``).
    A rank keeps ``ceil(numel / dp)`` elements of each sharded kind (the element count
    divided as an integer, rounded up); Adam's step counters stay one per tensor. At its
    peak a rank also holds one ``unit`` (elements; pass the largest unit it gathers) in
    full: from stage 2 the gradient of the unit whose backward just ran, before it is
    reduce-scattered; at stage 3 its weights, gathered for its forward and backward.
    With ``dp`` = 1 there is nothing to shard: ``zero`` changes nothing.
    """
    validate_zero(zero)
    full = parameter_memory(numel, tensors, optimizer=optimizer, precision=precision)
    if validate_dp(dp) == 1 or zero == 0:
        return full
    shard = parameter_memory(-(-numel // dp), tensors, optimizer=optimizer, precision=precision)
    e = ELEMENT_BYTES[precision]
    return DeviceMemory(
        weights=shard.weights + e * unit if zero == 3 else full.weights,
        grads=shard.grads + e * unit if zero >= 2 else full.grads,
        optimizer_state=shard.optimizer_state,
    )
