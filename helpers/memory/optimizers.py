"""The optimizers a ledger knows, and the state each keeps per parameter."""

from __future__ import annotations

from collections.abc import Iterable

import torch

OPTIMIZERS = ("sgd", "sgd_momentum", "adam")

# Extra tensors of the parameter's size and dtype that each optimizer keeps.
STATE_COPIES = {"sgd": 0, "sgd_momentum": 1, "adam": 2}
# Adam also keeps a step counter per parameter tensor: a float32 scalar (on the CPU).
STEP_BYTES = {"sgd": 0, "sgd_momentum": 0, "adam": 4}


def validate_optimizer(name: str) -> str:
    """``name`` if it is a known optimizer, else a ValueError naming the choices."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; valid choices: {', '.join(OPTIMIZERS)}")
    return name


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter], lr: float):
    """``torch.optim`` optimizer for a ledger name (SGD momentum 0.9; Adam's defaults)."""
    validate_optimizer(name)
    params = list(params)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, foreach=False)
    return torch.optim.SGD(params, lr=lr, momentum=0.9 if name == "sgd_momentum" else 0.0)


def state_bytes(name: str, numel: int, element_size: int, tensors: int) -> int:
    """Optimizer state for ``tensors`` parameter tensors of ``numel`` elements in all."""
    validate_optimizer(name)
    return STATE_COPIES[name] * numel * element_size + STEP_BYTES[name] * tensors
