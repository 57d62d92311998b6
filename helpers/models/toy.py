"""Lesson 01: the toy model cut in two, one layer per device."""

from __future__ import annotations

import torch
from torch import nn

# Lesson 01's proof: float32, the same kernels in the same order, so the same bits are
# expected; 1e-6 absolute is many ulps at these magnitudes and still catches a wrong split.
SPLIT_TOLERANCE = 1e-6


class ToyModel(nn.Module):
    """``net1`` (in -> hidden) on ``dev0``, ReLU, ``net2`` (hidden -> out) on ``dev1``.

    The only change from a one-device model is where each layer lives and the
    ``.to(...)`` that carries the activation from one device to the next.
    """

    def __init__(
        self,
        dev0: torch.device | str,
        dev1: torch.device | str,
        in_features: int = 10000,
        hidden: int = 10,
        out_features: int = 5,
    ) -> None:
        super().__init__()
        self.dev0, self.dev1 = torch.device(dev0), torch.device(dev1)
        self.net1 = nn.Linear(in_features, hidden).to(self.dev0)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(hidden, out_features).to(self.dev1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.net1(x.to(self.dev0)))
        return self.net2(x.to(self.dev1))  # the activation crosses devices here

    def layer_chain(self) -> tuple[list[nn.Module], list[int]]:
        """The layers in forward order, cut before layer 2: net1 and the ReLU | net2.

        (``helpers.memory``'s ``LayerChain`` protocol: what its estimator reads.)
        """
        return [self.net1, self.relu, self.net2], [2]


def copy_to_one_device(model: ToyModel, device: torch.device | str) -> ToyModel:
    """A single-device ToyModel with exactly ``model``'s weights."""
    single = ToyModel(
        device, device, model.net1.in_features, model.net1.out_features, model.net2.out_features
    )
    single.load_state_dict({k: v.to(device) for k, v in model.state_dict().items()})
    return single


def parameter_table(model: nn.Module) -> str:
    """Index, name, device and dtype of every parameter, as the source prints them."""
    rows = [f"{'#':>2}  {'parameter':<14} {'shape':<14} {'device':<8} dtype"]
    for i, (name, p) in enumerate(model.named_parameters()):
        rows.append(f"{i:>2}  {name:<14} {str(tuple(p.shape)):<14} {str(p.device):<8} {p.dtype}")
    return "\n".join(rows)
