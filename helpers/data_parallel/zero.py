"""ZeRO stages 1, 2 and 3, written out: what each rank keeps, and what it sends for it.

Data parallelism (DDP) keeps on every rank the whole model, its whole gradient and the
whole optimizer state, and all-reduces the gradient. ZeRO (Rajbhandari et al. 2020,
arXiv:1910.02054) keeps on rank r only slice r of what it can:

- stage 1 shards the optimizer state. The gradient is reduce-scattered (rank r receives
  slice r of the sum), rank r updates slice r of every weight, and an all-gather brings
  the updated slices to every rank. Reduce-scatter + all-gather = one all-reduce's bytes
  in a ring (NCCL); gloo runs the reduce-scatter as a whole all-reduce, so 1.5 there.
- stage 2 also shards the gradient: each unit's gradient is reduce-scattered as soon as
  the unit's backward has produced it, and the full gradient is freed.
- stage 3 also shards the weights: a unit's weights are all-gathered just before its
  forward, freed after it, all-gathered again before its backward and freed after it.
  Two all-gathers + one reduce-scatter: 1.5 all-reduces' bytes in a ring (on gloo, whose
  reduce-scatter is an all-reduce, 2).

Stage 3 can also gather the weights in a 16-bit ``param_dtype`` (mixed precision, as
FSDP2's ``MixedPrecisionPolicy``): the float32 slices stay what Adam updates, each is cast
before the all-gather, the unit computes in 16 bits, and its gradients are cast back to
float32 before the reduce-scatter.

A *unit* is what is gathered or reduced at once (here: the embedding, each block, the
final norm with the head), as FSDP2 does for each module given to ``fully_shard``. Every
parameter is cut into N equal slices of its flattened elements; a parameter whose size
does not divide by N is refused (FSDP2 pads instead). Weights are freed as FSDP1 did:
their storage is resized to 0 and resized back before the all-gather refills it, so the
tensors autograd saved for the backward see the refilled values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from helpers.comm.collectives import all_gather, reduce_scatter
from helpers.data_parallel.rank_step import adam, optimizer_state, storage_bytes

STAGES = (1, 2, 3)


def validate_stage(stage: object) -> int:
    """``stage`` if it is a ZeRO stage written here, else a ValueError naming them."""
    if stage not in STAGES or isinstance(stage, bool):
        raise ValueError(f"unknown ZeRO stage {stage!r}; valid choices: 1, 2, 3 "
                         "(0 is plain data parallelism: DDP)")
    return int(stage)


def check_divisible(model: nn.Module, world_size: int) -> None:
    """Refuse a parameter whose number of elements does not divide by ``world_size``."""
    for name, p in model.named_parameters():
        if p.numel() % world_size:
            raise ValueError(
                f"parameter {name!r} has {p.numel()} elements, which do not divide by "
                f"{world_size} ranks; valid: a world size dividing every parameter's size "
                "(FSDP2's fully_shard pads such a parameter instead)")


def _slice(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Slice ``rank`` of ``t``'s flattened elements (a view)."""
    k = t.numel() // world_size
    return t.view(-1)[rank * k:(rank + 1) * k]


def _free(p: torch.Tensor) -> None:
    p.untyped_storage().resize_(0)


class HandZero:
    """One rank's ZeRO ``stage`` of ``model``, with an Adam optimizer over its slices.

    ``units`` name the groups of modules gathered or reduced at once, in forward order.
    ``peak`` holds the largest weights, grads and optimizer-state bytes seen on this rank,
    sampled after every allocation the stage makes. ``param_dtype`` (stage 3 only): the
    dtype the weights are gathered and computed in.
    """

    def __init__(self, model: nn.Module, units: dict[str, list[nn.Module]], stage: int,
                 *, lr: float, group=None, param_dtype: torch.dtype | None = None) -> None:
        self.stage = validate_stage(stage)
        if param_dtype is not None and self.stage != 3:
            raise ValueError(f"param_dtype={param_dtype} with stage {stage}; valid: stage 3 "
                             "(stages 1-2 keep the float32 weights whole)")
        self.group = group
        if group is None:
            self.rank, self.n = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.n = group.rank(), group.size()
        check_divisible(model, self.n)
        self.model, self.units = model, units
        self.params = {u: [p for m in ms for p in m.parameters()] for u, ms in units.items()}
        covered = {id(p) for ps in self.params.values() for p in ps}
        if covered != {id(p) for p in model.parameters()}:
            raise ValueError(f"units {list(units)} do not cover every parameter of the model "
                             "exactly once; valid: units that partition its modules")
        self.shard: dict[nn.Parameter, nn.Parameter] = {}
        for p in model.parameters():
            mine = _slice(p.detach(), self.rank, self.n)
            # stages 1-2: slice r of the weight itself (a view); stage 3: a copy, and the
            # full weight's storage is freed until a unit needs it
            self.shard[p] = nn.Parameter(mine.clone() if self.stage == 3 else mine)
            if self.stage == 3:
                if param_dtype is not None:
                    p.data = p.data.to(param_dtype)  # the gathered copy's dtype
                _free(p)
        self.optimizer = adam(self.shard.values(), lr)
        self.peak = {"weights": 0, "grads": 0, "optimizer_state": 0}
        self._done: dict[str, int] = {}
        self._hooks = self._install_hooks()
        self.sample()

    # -- what the rank holds ------------------------------------------------------------
    def held(self) -> dict[str, int]:
        """Bytes of weights, grads and optimizer state this rank holds now."""
        full, shards = list(self.shard), list(self.shard.values())
        return {"weights": storage_bytes([*full, *shards]),
                "grads": storage_bytes([t.grad for t in (*full, *shards)]),
                "optimizer_state": storage_bytes(optimizer_state(self.optimizer))}

    def sample(self) -> None:
        """Raise ``peak`` to what is held now."""
        for kind, nbytes in self.held().items():
            self.peak[kind] = max(self.peak[kind], nbytes)

    # -- the communication ----------------------------------------------------------------
    def gather(self, unit: str) -> None:
        """Stage 3: all-gather a unit's full weights into their (re-allocated) storage."""
        for p in self.params[unit]:
            p.untyped_storage().resize_(p.numel() * p.element_size())
            all_gather(p.data.view(-1), self.shard[p].data.to(p.dtype), group=self.group)
        self.sample()

    def release(self, unit: str) -> None:
        """Stage 3: free a unit's full weights."""
        for p in self.params[unit]:
            _free(p)

    def reduce_scatter(self, params: Sequence[nn.Parameter]) -> None:
        """Slice r of the mean gradient over the ranks, into each shard's ``.grad``."""
        for p in params:
            out = self.shard[p].grad
            if out is None or self.stage == 1:
                out = torch.empty_like(self.shard[p])
            reduce_scatter(out, p.grad.view(-1).to(out.dtype), group=self.group)
            out.div_(self.n)
            if self.stage == 1:  # keep the full gradient; slice r now holds the mean
                _slice(p.grad, self.rank, self.n).copy_(out)
                self.shard[p].grad = _slice(p.grad, self.rank, self.n)
            else:
                p.grad = None

    def _unit_backward_done(self, unit: str) -> None:
        self.sample()  # the unit's full gradient is all here now: the stage's peak
        if self.stage >= 2:
            self.reduce_scatter(self.params[unit])
        if self.stage == 3:
            self.release(unit)

    def _install_hooks(self) -> list:
        handles = []
        for unit, modules in self.units.items():
            first, last = modules[0], modules[-1]
            if self.stage == 3:
                handles += [
                    first.register_forward_pre_hook(lambda m, a, u=unit: self.gather(u)),
                    last.register_forward_hook(lambda m, a, o, u=unit: self.release(u)),
                    last.register_full_backward_pre_hook(lambda m, g, u=unit: self.gather(u)),
                ]
            for p in self.params[unit]:
                handles.append(p.register_post_accumulate_grad_hook(
                    lambda p, u=unit: self._grad_ready(u)))
        return handles

    def _grad_ready(self, unit: str) -> None:
        self._done[unit] = self._done.get(unit, 0) + 1
        if self._done[unit] == len(self.params[unit]):
            self._unit_backward_done(unit)

    # -- one training step -------------------------------------------------------------
    def step(self, inputs: torch.Tensor, labels: torch.Tensor,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Forward, backward, the stage's reduction, Adam on this rank's slices, and (stages
        1-2) the all-gather of the updated slices. Returns the output (this rank's batch)."""
        self.optimizer.zero_grad(set_to_none=self.stage == 1)
        for p in self.model.parameters():
            p.grad = None
        if self.stage >= 2:  # the gradient slices the reduce-scatters write into
            for s in self.shard.values():
                s.grad = torch.zeros_like(s)
        self._done = {}
        self.sample()
        output = self.model(inputs)
        loss_fn(output, labels).backward()
        if self.stage == 1:
            self.sample()  # every full gradient is here: stage 1's peak
            self.reduce_scatter(list(self.shard))
        self.optimizer.step()
        self.sample()
        if self.stage < 3:
            for p, s in self.shard.items():
                all_gather(p.data.view(-1), s.detach().clone(), group=self.group)
        return output.detach()

    def full_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Every updated weight, whole (gathered for stage 3), by name: for the proofs."""
        out = []
        for name, p in self.model.named_parameters():
            whole = torch.empty(p.numel(), dtype=self.shard[p].dtype, device=p.device)
            all_gather(whole, self.shard[p].detach().clone(), group=self.group)
            out.append((name, whole.view(p.shape)))
        return out

    def grad_slices(self) -> list[tuple[str, torch.Tensor]]:
        """This rank's slice of every reduced (mean) gradient, by name."""
        return [(n, self.shard[p].grad.detach().clone()) for n, p in self.model.named_parameters()]

    def remove(self) -> None:
        """Take the hooks off the model."""
        for handle in self._hooks:
            handle.remove()
