"""FSDP2 on the ranks: ``fully_shard`` applied unit by unit, as the hand ZeRO-3 does.

``fully_shard(module, mesh=...)`` replaces each of the module's parameters by a
``DTensor`` sharded on dim 0 over the mesh (``Shard(0)``): rank r keeps rows r of N of
it. Before the module's forward its parameters are all-gathered (one collective for all
of them), and after it they are freed again if ``reshard_after_forward`` (ZeRO-3);
otherwise they stay gathered until the backward has used them (fewer bytes sent, more
held). After the backward, the gradients are reduce-scattered (on gloo, as an all-reduce
of a copy and a slice). ``MixedPrecisionPolicy``
all-gathers the weights in ``param_dtype`` and reduces the gradients in ``reduce_dtype``,
while the sharded float32 weights stay what the optimizer updates.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from helpers.comm.meter import CommMeter
from helpers.data_parallel.rank_step import adam, named_copy
from helpers.memory.measure import default_loss


def fsdp_units(model: nn.Module) -> dict[str, list[nn.Module]]:
    """The units sharded together: the embedding, each block, the final norm with the head."""
    units = {"embed": [model.embed]}
    units |= {f"blocks.{i}": [b] for i, b in enumerate(model.blocks)}
    return units | {"norm+head": [model.norm, model.head]}


def shard(model: nn.Module, mesh, *, reshard_after_forward: bool = True,
          mp_policy=None) -> nn.Module:
    """A copy of ``model`` with every unit, then the whole, given to ``fully_shard``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = mp_policy or MixedPrecisionPolicy()
    sharded = copy.deepcopy(model)
    for modules in fsdp_units(sharded).values():
        fully_shard(modules if len(modules) > 1 else modules[0], mesh=mesh,
                    reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(sharded, mesh=mesh, reshard_after_forward=reshard_after_forward,
                mp_policy=policy)
    return sharded


def fsdp_step(sharded: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float,
              world_size: int, meter: CommMeter | None = None) -> dict:
    """One Adam step of a sharded model: output, what its forward and backward sent (under
    ``meter``), the whole gradients and updated weights."""
    opt = adam(sharded.parameters(), lr)
    counter = meter or CommMeter()
    with counter:
        out = sharded(x)
        default_loss(out.float(), y).backward()
    grads = named_copy((n, p.grad.full_tensor()) for n, p in sharded.named_parameters())
    opt.step()
    whole = [(n, p.full_tensor()) for n, p in sharded.named_parameters()]
    return {"output": out.detach().float().cpu(), "counter": counter, "grads": grads,
            "weights": named_copy(whole), "optimizer": opt}


def describe_parameter(sharded: nn.Module, name: str) -> dict:
    """One parameter as FSDP2 holds it: its type, placements, local and global shapes."""
    p = dict(sharded.named_parameters())[name]
    return {"name": name, "type": type(p).__name__, "placements": [str(s) for s in p.placements],
            "local_shape": list(p.to_local().shape), "global_shape": list(p.shape),
            "dtype": str(p.dtype).replace("torch.", "")}
