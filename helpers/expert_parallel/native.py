"""What PyTorch 2.14 itself offers for expert parallelism, run on gloo ranks here.

- **DTensor** holds the experts' weights stacked, ``(E, out, in)``, sharded ``Shard(0)``
  over an expert-parallel mesh (each rank its experts); ``redistribute`` moves them to
  tensor-parallel experts (``Shard(1)``/``Shard(2)``: every rank a slice of every expert)
  or ``Replicate()``. From one shard dimension to another is an all-to-all; on a CPU mesh
  torch 2.14 all-gathers the whole tensor and keeps its slice instead
  (:func:`fallback_source`: "Gloo does not support alltoall", though gloo runs
  ``all_to_all_single``, the course's dispatch), sending ``ep`` times the all-to-all's bytes
  (:func:`redistribute_experts`). Either way it moves *weights*; expert parallelism moves
  *tokens* and leaves the weights where they are. ``F.grouped_mm`` on DTensors with
  ``Shard(0)`` experts has no rule that keeps them apart: DTensor all-gathers every expert
  to every rank (:func:`dtensor_grouped_mm`).
- **The all-to-all with autograd**: ``torch.distributed._functional_collectives.
  all_to_all_single_autograd``, whose backward is the same all-to-all reversed, as the
  course's :func:`~helpers.expert_parallel.dispatch.dispatch` (:func:`autograd_all_to_all`).
- The experts in one ``F.grouped_mm`` call (on DTensors with ``Shard(0)`` experts, DTensor
  all-gathers every expert to every rank unless the tokens already sit on their experts'
  ranks), and what refuses this CPU (NCCL's EP token switch, the symmetric-memory
  all-to-alls): :mod:`helpers.expert_parallel.grouped_mm`.

Every check runs on ``ep`` gloo ranks that are threads of this process, DTensor's mesh
included (:mod:`helpers.expert_parallel.thread_ranks`); threads share PyTorch's default
random generator, so every tensor is drawn before they start. ``CommDebugMode``
(PyTorch's) names the collectives each rank issued; the course's ``CommMeter`` counts the
hand collectives' bytes at the dispatcher, where the functional collectives of DTensor and
``all_to_all_single_autograd`` do not pass (they reach gloo from C++): their bytes are the
formula for the collective ``CommDebugMode`` saw, held against what the sockets sent.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from helpers.comm.collectives import all_gather, ring_bytes
from helpers.comm.meter import ALL_TO_ALL, CommMeter
from helpers.expert_parallel.dispatch import dispatch, expert_range
from helpers.expert_parallel.grouped_mm import make_moe, routed_tokens, stacked
from helpers.expert_parallel.moe import MoEShape
from helpers.expert_parallel.thread_ranks import (
    COLLECTIVE,
    WireCheck,
    comm_counts,
    counted_sockets,
    headers,
    on_ranks,
    payload,
    sockets_now,
    thread_mesh,
    wire_check,
)
from helpers.expert_parallel.traffic import routing_matrix

TARGETS = ("Shard(1)", "Shard(2)", "Replicate()")  # where the experts' weights can go


# -- the experts' weights, stacked and redistributed -----------------------------------------
def hand_reshard(local: torch.Tensor, target: str, group: dist.ProcessGroup) -> torch.Tensor:
    """This rank's ``Shard(0)`` block ``(E/n, out, in)`` moved to ``target`` by hand:
    ``Shard(d)``, one all-to-all (block ``j`` of dim ``d`` to rank ``j``; what arrives from
    rank ``s`` are its experts' slices); ``Replicate()``, one all-gather."""
    n = group.size()
    if target == "Replicate()":
        out = local.new_empty((n * local.shape[0], *local.shape[1:]))
        all_gather(out, local.contiguous(), group=group)
        return out
    blocks = local.chunk(n, dim=int(target[6]))
    send = torch.stack([b.contiguous() for b in blocks])  # (n, E/n, ...): block j to rank j
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send, group=group)
    return got.flatten(0, 1)  # source rank after source rank: expert order


def expected_shard(full: torch.Tensor, target: str, rank: int, n: int) -> torch.Tensor:
    """What rank ``rank`` must hold of ``full`` under ``target``."""
    if target == "Replicate()":
        return full
    return full.chunk(n, dim=int(target[6]))[rank]


@dataclass(frozen=True)
class Redistribution:
    """One stacked expert weight moved from ``Shard(0)`` to ``target`` on ``ep`` ranks, by
    DTensor and by hand, counted and compared (bytes are per rank unless said)."""

    target: str
    ep: int
    shape: tuple[int, ...]  # the whole stacked weight, (E, out, in)
    local_bytes: int  # one rank's Shard(0) block
    dtensor_calls: dict[str, int]  # CommDebugMode, per rank (the same on every rank)
    dtensor_sent: float  # the formula for what CommDebugMode saw
    dtensor_wire: WireCheck  # all ranks
    hand_collective: str
    hand_calls: dict[str, int]  # CommMeter, per rank
    hand_sent: float  # CommMeter, by the formula at the dispatcher
    hand_predicted: float  # the minimum for this movement: what the hand collective sends
    hand_wire: WireCheck
    equal: bool  # every rank: DTensor's block = the hand block = the slice of the weight

    @property
    def ratio(self) -> float:
        """DTensor's bytes over the hand collective's."""
        return self.dtensor_sent / self.hand_sent if self.hand_sent else float("nan")

    @property
    def counted_as_predicted(self) -> bool:
        """The meter's bytes for the hand collective equal the formula's."""
        return self.hand_sent == self.hand_predicted

    def line(self) -> str:
        calls = ", ".join(f"{k} x{v}" for k, v in self.dtensor_calls.items()) or "none"
        return (f"Shard(0) -> {self.target:<12} DTensor: {calls}, {self.dtensor_sent:,.0f} B; "
                f"by hand: {self.hand_collective}, {self.hand_sent:,.0f} B "
                f"(x{self.ratio:.1f}); equal: {self.equal}")


def redistribute_experts(ep: int, shape: MoEShape, target: str, seed: int = 0,
                         projection: str = "gate_proj") -> Redistribution:
    """The layer's stacked ``projection`` weights, ``Shard(0)`` over ``ep`` ranks, moved to
    ``target`` by ``DTensor.redistribute`` and by :func:`hand_reshard`."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode

    if target not in TARGETS:
        raise ValueError(f"target={target!r}; valid: {', '.join(TARGETS)}")
    with torch.no_grad():
        full = stacked(make_moe(shape, torch.float32, seed).experts, projection)
    expert_range(shape.experts, ep, 0)  # refuses experts that ep does not divide
    if target != "Replicate()" and full.shape[int(target[6])] % ep:
        dim = int(target[6])
        raise ValueError(f"{target} of {projection}: its dim {dim} has {full.shape[dim]} rows, "
                         f"not divisible by ep={ep}; valid: Replicate(), or sizes ep divides")
    placement = Replicate() if target == "Replicate()" else Shard(int(target[6]))
    barrier, existing = threading.Barrier(ep, timeout=60), sockets_now()

    def work(rank: int, group: dist.ProcessGroup) -> tuple:
        local = full.chunk(ep)[rank].contiguous()
        with thread_mesh(group, rank) as mesh:
            weight = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
            weight.redistribute(mesh, [placement])  # once uncounted: the group's sockets
            hand_reshard(local, target, group)  # finish connecting, DTensor caches its plan
            with counted_sockets(rank, barrier, existing) as sockets, CommDebugMode() as seen:
                moved = weight.redistribute(mesh, [placement]).to_local()
            with counted_sockets(rank, barrier, existing) as hand_sockets, CommMeter() as meter:
                hand = hand_reshard(local, target, group)
        want = expected_shard(full, target, rank, ep)
        return (comm_counts(seen), dict(meter.per_collective.calls),
                meter.total_ring, torch.equal(moved, want) and torch.equal(hand, want),
                sockets, hand_sockets)

    results = on_ranks(ep, work)
    seen, calls, hand_sent, _, sockets, hand_sockets = results[0]
    if any(r[0] != seen or r[2] != hand_sent for r in results):
        raise RuntimeError(f"the ranks disagree on what they sent: {[r[:3] for r in results]}")
    local = full.numel() * full.element_size() // ep
    sent = sum(payload(COLLECTIVE[op], ep, local) * n for op, n in seen.items())
    allowed = sum(headers(COLLECTIVE[op], ep, ep * local) * n for op, n in seen.items())
    collective = "all_gather" if target == "Replicate()" else ALL_TO_ALL
    predicted = (ring_bytes("all_gather", ep, ep * local) if collective == "all_gather"
                 else local * (ep - 1) / ep)
    return Redistribution(target, ep, tuple(full.shape), local, seen, sent,
                          wire_check(sockets, ep * sent, allowed), collective, calls, hand_sent,
                          predicted, wire_check(hand_sockets, ep * payload(collective, ep, local),
                                           headers(collective, ep, ep * local)),
                          all(r[3] for r in results))


def redistribution_table(moves: list[Redistribution]) -> str:
    """One line per redistribution, the sockets beside each, under a header."""
    if not moves:
        return "(no redistribution)"
    first = moves[0]
    lines = [f"a stacked expert weight {list(first.shape)} float32 on {first.ep} gloo ranks: "
             f"{first.local_bytes:,} B per rank under Shard(0); bytes sent per rank"]
    for move in moves:
        lines += [move.line(),
                  f"    DTensor, all ranks' {move.dtensor_wire.line()}",
                  f"    by hand, all ranks' {move.hand_wire.line()}"]
    return "\n".join(lines)


@dataclass(frozen=True)
class Movement:
    """Bytes one rank sends to move the layer's experts (all three projections) from
    expert-parallel to tensor-parallel, beside what it sends to move tokens instead."""

    ep: int
    weights_all_to_all: float  # by hand: one all-to-all per projection
    weights_dtensor_cpu: float  # DTensor on a CPU mesh: one all-gather per projection
    tokens: float  # the caller's: e.g. what the layer's dispatch sent

    def line(self) -> str:
        return (f"per rank on {self.ep} ranks: the experts to tensor-parallel "
                f"{self.weights_all_to_all:,.0f} B by all-to-all ({self.weights_dtensor_cpu:,.0f}"
                f" B as DTensor does it on CPU); the tokens to the experts {self.tokens:,.0f} B")


def movement(shape: MoEShape, ep: int, tokens: float, element_bytes: int = 8) -> Movement:
    """:class:`Movement` for the layer ``shape`` on ``ep`` ranks, weights of
    ``element_bytes`` (the course's layer: float64), ``tokens`` bytes of tokens."""
    expert_range(shape.experts, ep, 0)
    local = 3 * (shape.experts // ep) * shape.ffn * shape.hidden * element_bytes
    return Movement(ep, payload(ALL_TO_ALL, ep, local), payload("all_gather", ep, local),
                    float(tokens))


# -- the all-to-all with autograd ----------------------------------------------------------
@dataclass(frozen=True)
class AutogradAllToAll:
    """The course's autograd all-to-all (:func:`~helpers.expert_parallel.dispatch.dispatch`)
    against PyTorch's ``all_to_all_single_autograd``, forward and backward, on the splits a
    router chose."""

    ep: int
    routing: list[list[int]]  # rows rank s sends rank d
    forward_equal: bool  # every rank: both = what the definition says arrives
    backward_equal: bool  # every rank: both input gradients = the definition's
    hand_calls: dict[str, int]  # CommDebugMode, forward + backward, rank 0
    native_calls: dict[str, int]
    hand_meter: float  # CommMeter's bytes, forward + backward, rank 0
    native_meter: float
    predicted: float  # bytes rank 0 sends, forward + backward (blocks to the others)

    def line(self) -> str:
        def calls(c: dict[str, int]) -> str:
            return ", ".join(f"{k} x{v}" for k, v in c.items())
        return (f"on {self.ep} ranks, rows sent {self.routing}: forward equal "
                f"{self.forward_equal}, backward equal {self.backward_equal}\n"
                f"  course's dispatch:          {calls(self.hand_calls)}; CommMeter "
                f"{self.hand_meter:,.0f} B (formula {self.predicted:,.0f})\n"
                f"  all_to_all_single_autograd: {calls(self.native_calls)}; CommMeter "
                f"{self.native_meter:,.0f} B (a functional collective: not at its door)")


def autograd_all_to_all(ep: int, shape: MoEShape, tokens: int, seed: int = 0) -> AutogradAllToAll:
    """Each rank's ``tokens`` routed by the course's router, dispatched by both all-to-alls
    in float64, then a random gradient sent back through each."""
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.tensor.debug import CommDebugMode

    moe = make_moe(shape, torch.float64, seed)
    expert_range(shape.experts, ep, 0)
    rows, counts = zip(*(routed_tokens(moe, tokens, seed + 10 * r) for r in range(ep)),
                       strict=True)
    matrix = routing_matrix(torch.stack(counts)).tolist()
    g = torch.Generator().manual_seed(seed + 2)
    received = [sum(matrix[s][d] for s in range(ep)) for d in range(ep)]
    grads = [torch.randn(n, shape.hidden, generator=g, dtype=torch.float64) for n in received]

    def blocks(t: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        return list(torch.split(t, sizes))

    # the definitions: rank d receives block d of every rank, in rank order; the gradient
    # of rank s's block d is rank d's gradient rows for what came from s
    arrive = [torch.cat([blocks(rows[s], matrix[s])[d] for s in range(ep)]) for d in range(ep)]
    back_rows = [torch.cat([blocks(grads[d], [matrix[q][d] for q in range(ep)])[s]
                            for d in range(ep)]) for s in range(ep)]

    def work(rank: int, group: dist.ProcessGroup) -> tuple:
        send, recv = matrix[rank], [matrix[s][rank] for s in range(ep)]
        out = []
        with thread_mesh(group, rank):  # names the group for the functional collective
            for native in (False, True):
                x = rows[rank].clone().requires_grad_()
                with CommDebugMode() as seen, CommMeter() as meter:
                    if native:
                        y = funcol.all_to_all_single_autograd(x, recv, send, group)
                        y = funcol.wait_tensor(y)
                    else:
                        y = dispatch(x, send, recv, group)
                    y.backward(grads[rank])
                out.append((torch.equal(y, arrive[rank]), torch.equal(x.grad, back_rows[rank]),
                            comm_counts(seen), meter.total_ring))
        return out

    results = on_ranks(ep, work)
    (_, _, hand_calls, hand_meter), (_, _, native_calls, native_meter) = results[0]
    out = sum(matrix[0][1:])  # rows rank 0 sends forward: all but its own block
    back = sum(matrix[s][0] for s in range(1, ep))  # backward: the gradient of what arrived
    return AutogradAllToAll(ep, matrix, all(r[k][0] for r in results for k in (0, 1)),
                            all(r[k][1] for r in results for k in (0, 1)), hand_calls,
                            native_calls, hand_meter, native_meter,
                            float((out + back) * shape.hidden * 8))


def fallback_source() -> str:
    """The lines of torch 2.14's ``shard_dim_alltoall`` that turn DTensor's all-to-all into
    an all-gather on a CPU mesh (from this install's source)."""
    from torch.distributed.tensor import _collective_utils

    lines, first = inspect.getsourcelines(_collective_utils.shard_dim_alltoall)
    end = next(i for i, line in enumerate(lines) if "return out.contiguous()" in line)
    where = f"{inspect.getsourcefile(_collective_utils).split('site-packages/')[-1]}:{first}"
    return f"# {where}\n" + "".join(lines[:end + 1])
