"""The experts in one call: ``F.grouped_mm`` against the loop over experts, and what torch
2.14 ships for mixtures of experts that this CPU refuses, each called for its exact error.

``F.grouped_mm(a, b, offs=...)`` multiplies the rows of ``a`` sorted by expert, ``offs``
(int32) marking where each expert's rows end, by that expert's matrix of ``b``
``(E, in, out)``: the local experts of an expert-parallel rank in one kernel instead of a
Python loop. On this CPU it runs in float32, bfloat16 and float16, with every row a
multiple of 16 bytes; float64, the course's layer, is refused (:func:`limits`). On DTensors
with the experts ``Shard(0)`` over an expert-parallel mesh (:func:`dtensor_grouped_mm`),
DTensor's rules for it (``grouped_mm_single_dim_strategy`` in torch's
``distributed/tensor/_ops/_matrix_ops.py``) keep the experts apart only when the tokens
come as ``(E, rows, in)``, sharded the same way: already padded per expert and on the
expert's rank, after a dispatch DTensor does not do. For the tokens as rows with offsets,
the layout a dispatch delivers, no rule shards the weights' dim 0: DTensor all-gathers every
expert to every rank, moving the weights, not the tokens.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from helpers.expert_parallel.dispatch import expert_range, permute
from helpers.expert_parallel.moe import MoEFFN, MoEShape
from helpers.expert_parallel.thread_ranks import (
    COLLECTIVE,
    comm_counts,
    on_ranks,
    payload,
    thread_mesh,
)


# -- an outcome, run or refused ------------------------------------------------------------
@dataclass(frozen=True)
class Attempt:
    """One call of something PyTorch ships: what it gave, or the error it raised (its
    type, its first sentence, and the torch source line that raised it)."""

    what: str
    ran: bool
    outcome: str
    where: str = ""

    def line(self) -> str:
        """``what: ran, outcome`` or ``what: refused, Error: message (file:line)``."""
        where = f" ({self.where})" if self.where else ""
        return f"{self.what}: {'ran' if self.ran else 'refused'}, {self.outcome}{where}"


def attempt(what: str, call: Callable[[], str]) -> Attempt:
    """Run ``call`` (returning a one-line summary); an exception is recorded, not raised."""
    try:
        return Attempt(what, True, call())
    except Exception as error:  # noqa: BLE001 (recorded for the lesson, not raised)
        frames = [f for f in traceback.extract_tb(error.__traceback__)
                  if "site-packages/torch/" in f.filename]
        where = ""
        if frames:
            where = f"{frames[-1].filename.split('site-packages/')[-1]}:{frames[-1].lineno}"
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        message = message.split(". This could be because")[0]  # the dispatcher's first sentence
        return Attempt(what, False, f"{type(error).__name__}: {message}", where)


# -- the experts stacked, the tokens routed ------------------------------------------------
def stacked(experts: nn.ModuleDict, name: str) -> torch.Tensor:
    """One projection of every expert stacked, ``(E, out, in)``: ``gate_proj``, ``up_proj``
    or ``down_proj`` (differentiable: gradients reach the experts' own weights)."""
    return torch.stack([getattr(e, name).weight for e in experts.values()])


def make_moe(shape: MoEShape, dtype: torch.dtype, seed: int) -> MoEFFN:
    """The course's MoE layer from ``seed``, leaving the caller's random state alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MoEFFN(shape, dtype)


def routed_tokens(moe: MoEFFN, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens`` random tokens routed by ``moe``'s router and sorted by expert (each once
    per slot), and the rows per expert."""
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, moe.shape.hidden, generator=g, dtype=moe.router.gate.weight.dtype)
    with torch.no_grad():
        moved = permute(x, moe.router(x))
    return moved.tokens, moved.counts


# -- the grouped matmul ---------------------------------------------------------------------
def grouped_swiglu(x: torch.Tensor, counts: torch.Tensor, experts: nn.ModuleDict) -> torch.Tensor:
    """Every expert (SwiGLU) on its rows of ``x`` (sorted by expert, ``counts`` rows each)
    in three ``F.grouped_mm`` calls, with the experts' own weights stacked."""
    offs = counts.cumsum(0).to(torch.int32)  # where each expert's rows end

    def project(a: torch.Tensor, name: str) -> torch.Tensor:
        return F.grouped_mm(a, stacked(experts, name).transpose(-2, -1), offs=offs)

    return project(F.silu(project(x, "gate_proj")) * project(x, "up_proj"), "down_proj")


def looped_swiglu(x: torch.Tensor, counts: torch.Tensor, experts: nn.ModuleDict) -> torch.Tensor:
    """The same, one expert module after another (as the layer runs its local experts)."""
    parts = torch.split(x, counts.tolist())
    return torch.cat([expert(part) for expert, part in zip(experts.values(), parts, strict=True)])


@dataclass(frozen=True)
class GroupedCheck:
    """``F.grouped_mm`` against the loop over experts, forward and backward."""

    dtype: str
    counts: list[int]  # rows per expert
    max_diff: dict[str, float]  # output, the input's and each weight's gradient

    @property
    def equal(self) -> bool:
        return all(d == 0 for d in self.max_diff.values())

    def line(self) -> str:
        diffs = ", ".join(f"{k} {v:.1e}" for k, v in self.max_diff.items())
        return (f"F.grouped_mm, {self.dtype}, rows per expert {self.counts}: max |diff| "
                f"against the loop: {diffs}; equal: {self.equal}")


def grouped_mm_against_loop(shape: MoEShape, tokens: int, dtype: torch.dtype = torch.float32,
                            seed: int = 0) -> GroupedCheck:
    """The layer's experts on ``tokens`` routed tokens, by :func:`grouped_swiglu` and by
    :func:`looped_swiglu`, with one random output gradient sent back through both."""
    moe = make_moe(shape, dtype, seed)
    x, counts = routed_tokens(moe, tokens, seed)
    dout = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 3)).to(dtype)
    got = {}
    for name, run in (("grouped", grouped_swiglu), ("loop", looped_swiglu)):
        moe.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_()
        out = run(xx, counts, moe.experts)
        out.backward(dout)
        got[name] = {"output": out.detach(), "grad input": xx.grad,
                     **{f"grad {p}": torch.stack([getattr(e, p).weight.grad
                                                  for e in moe.experts.values()])
                        for p in ("gate_proj", "up_proj", "down_proj")}}
    diff = {k: (got["grouped"][k].double() - got["loop"][k].double()).abs().max().item()
            for k in got["loop"]}
    return GroupedCheck(str(dtype).removeprefix("torch."), counts.tolist(), diff)


# -- DTensor's grouped matmul on expert-sharded weights ------------------------------------
@dataclass(frozen=True)
class DTensorGroupedMM:
    """``F.grouped_mm`` on DTensors with the experts ``Shard(0)``, in bfloat16: on the
    tokens as rows with offsets (replicated), and on the tokens already padded per expert
    and on the expert's rank, ``(E, rows, in)`` ``Shard(0)``."""

    ep: int
    calls: dict[str, int]  # CommDebugMode, per rank, rows with offsets
    gathered: float  # bytes per rank by the formula for what it saw
    placement: str  # the output's
    equal: bool  # every rank: the output = grouped_mm on one process, all experts
    padded_calls: dict[str, int]  # CommDebugMode, per rank, the padded (E, rows, in) form
    padded_placement: str
    padded_equal: bool  # every rank: its experts' block of one process's output
    float32: Attempt  # rows with offsets, in float32

    def line(self) -> str:
        calls = ", ".join(f"{k} x{v}" for k, v in self.calls.items()) or "none"
        padded = ", ".join(f"{k} x{v}" for k, v in self.padded_calls.items()) or "none"
        return (f"F.grouped_mm on {self.ep} ranks, bfloat16, experts Shard(0):\n"
                f"  tokens as rows + offsets, Replicate(): {calls} ({self.gathered:,.0f} B per "
                f"rank: every expert to every rank), output {self.placement}, equal to one "
                f"process: {self.equal}\n"
                f"  tokens padded per expert, (E, rows, in) Shard(0): {padded}, output "
                f"{self.padded_placement}, equal to one process: {self.padded_equal}")


def dtensor_grouped_mm(ep: int, shape: MoEShape, tokens: int, seed: int = 0) -> DTensorGroupedMM:
    """The layer's ``gate_proj`` of every expert as a ``Shard(0)`` DTensor, times the
    tokens its router sent each expert: what DTensor sends, and whether it computes what
    one process does."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode

    moe = make_moe(shape, torch.float32, seed)
    expert_range(shape.experts, ep, 0)
    x, counts = routed_tokens(moe, tokens, seed)
    offs = counts.cumsum(0).to(torch.int32)
    with torch.no_grad():
        # (E, in, out), contiguous as DTensor's all-gather leaves it: on this CPU a
        # bfloat16 grouped_mm rounds differently with the other memory layout
        weight = stacked(moe.experts, "gate_proj").transpose(-2, -1).bfloat16().contiguous()
    x16 = x.bfloat16()
    padded = torch.zeros(shape.experts, int(counts.max()), shape.hidden, dtype=torch.bfloat16)
    for e, rows in enumerate(torch.split(x16, counts.tolist())):
        padded[e, :len(rows)] = rows  # each expert's rows, then zeros
    want, want_padded = F.grouped_mm(x16, weight, offs=offs), F.grouped_mm(padded, weight)

    def work(rank: int, group: dist.ProcessGroup) -> tuple:
        with thread_mesh(group, rank) as mesh:
            def dt(t: torch.Tensor, sharded: bool) -> DTensor:
                local = t.chunk(ep)[rank] if sharded else t
                return DTensor.from_local(local, mesh, [Shard(0) if sharded else Replicate()],
                                          run_check=False)

            with CommDebugMode() as seen:
                out = F.grouped_mm(dt(x16, False), dt(weight, True), offs=dt(offs, False))
            with CommDebugMode() as seen_padded:
                out_padded = F.grouped_mm(dt(padded, True), dt(weight, True))
            refused = attempt("rows + offsets in float32", lambda: str(F.grouped_mm(
                dt(x, False), dt(weight.float(), True), offs=dt(offs, False))))
            whole = out.full_tensor()  # uncounted: DTensor may leave the output sharded
        return (comm_counts(seen), str(out.placements[0]), torch.equal(whole, want),
                comm_counts(seen_padded), str(out_padded.placements[0]),
                torch.equal(out_padded.to_local(), want_padded.chunk(ep)[rank]), refused)

    results = on_ranks(ep, work)
    seen, placement, _, seen_padded, placement_padded, _, refused = results[0]
    local = weight.numel() * weight.element_size() // ep
    return DTensorGroupedMM(ep, seen, sum(payload(COLLECTIVE[op], ep, local) * n
                                          for op, n in seen.items()),
                            placement, all(r[2] for r in results), seen_padded,
                            placement_padded, all(r[5] for r in results), refused)


# -- what does not run here ---------------------------------------------------------------
def limits() -> list[Attempt]:
    """What torch 2.14 ships for MoE that this CPU refuses, each called for its error."""
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(8, 16, generator=g), torch.randn(2, 16, 8, generator=g)
    narrow_a, narrow_w = torch.randn(8, 6, generator=g), torch.randn(2, 6, 8, generator=g)
    offs = torch.tensor([3, 8], dtype=torch.int32)
    return [
        attempt("F.grouped_mm, float32, rows of 64 B", lambda: str(
            F.grouped_mm(a, w, offs=offs).shape)),
        attempt("F.grouped_mm, float64 (the course's layer)", lambda: str(
            F.grouped_mm(a.double(), w.double(), offs=offs).shape)),
        attempt("F.grouped_mm, float32, rows of 24 B", lambda: str(
            F.grouped_mm(narrow_a, narrow_w, offs=offs).shape)),
        attempt("F.grouped_mm, int64 offsets", lambda: str(
            F.grouped_mm(a, w, offs=offs.long()).shape)),
        attempt("torch.distributed._token_switch.TokenSwitchNCCL (NCCL EP)", _token_switch),
        attempt("torch.ops.symm_mem.all_to_all_vdev_2d (NVSHMEM), CPU tensors", _vdev_2d),
        attempt("torch.distributed._symmetric_memory.all_to_all_nd, CPU tensors", _nd),
    ]


def _token_switch() -> str:
    from torch.distributed._token_switch import TokenSwitchNCCL

    # its first step imports the NCCL EP extension, before it looks at the group (None here)
    TokenSwitchNCCL(None, num_experts=4, max_dispatch_tokens_per_rank=64,
                    max_recv_tokens_per_rank=128, max_token_bytes=512)
    return "built"


def _vdev_2d() -> str:
    x = torch.zeros(4, 8)
    torch.ops.symm_mem.all_to_all_vdev_2d(x, torch.zeros_like(x), torch.zeros(4, dtype=torch.int64),
                                          torch.zeros(2, 4, dtype=torch.int64), "0")
    return "ran"


def _nd() -> str:
    from torch.distributed import _symmetric_memory

    x = torch.zeros(4, 8)
    _symmetric_memory.all_to_all_nd(x, torch.zeros_like(x), 1, 0, group="0")
    return "ran"


def vdev_2d_schema() -> str:
    """The operator's signature, as this torch registers it."""
    return str(torch.ops.symm_mem.all_to_all_vdev_2d.default._schema)
