"""One rank of the context-parallel run: ``torchrun --nproc-per-node=CP -m
helpers.runs.context_parallel.worker --variant ring --causal``.

Every rank draws the same queries, keys, values and output gradient from ``--seed``
(float64), computes one process's attention and its gradients (the reference), then its
own tokens' share under ``--variant``, forward and backward, counting what it sends and
reading its sockets. Rank 0 gathers every rank's rows, puts them back in sequence order
and compares; then every rank times ``--repeats`` passes (no meter running). Rank 0 prints
its result as one JSON line.
"""

from __future__ import annotations

import json
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.comm.meter import CommMeter
from helpers.comm.wire import WireMeter
from helpers.context_parallel.bounds import attention_bounds
from helpers.context_parallel.gather import allgather_attention, ulysses_attention
from helpers.context_parallel.ring import RingPlan, compute_clock, ring_attention
from helpers.context_parallel.split import positions, shard, unshard
from helpers.context_parallel.traffic import layer_traffic
from helpers.core.checks import Proof
from helpers.runs.context_parallel.config import CPAttentionConfig
from helpers.runs.context_parallel.results import (
    QUANTITIES,
    CPAttentionResult,
    NativeRun,
    RankSide,
)
from helpers.runs.contract import serve
from helpers.torchrun.ranks import Rank

ATTENTION = {"ring": ring_attention, "zigzag": ring_attention,
             "allgather": allgather_attention, "ulysses": ulysses_attention}


def inputs(config: CPAttentionConfig) -> tuple[torch.Tensor, ...]:
    """q, k, v and the output's gradient, the same on every rank."""
    s = config.shape()
    g = torch.Generator().manual_seed(config.seed)

    def draw(heads: int) -> torch.Tensor:
        return torch.randn(s.batch, heads, s.seq, s.head_dim, generator=g, dtype=torch.float64)

    return draw(s.heads), draw(s.kv_heads), draw(s.kv_heads), draw(s.heads)


def reference(q, k, v, dout, causal: bool) -> list[torch.Tensor]:
    """One process's output and the gradients of q, k, v."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), dout)]


def scores_computed(config: CPAttentionConfig, rank: int, cp: int) -> int:
    """The (query, key) scores this rank computes: the ring's pieces, else all it is shown."""
    if config.variant in ("ring", "zigzag"):
        plan = RingPlan(rank, cp, config.seq, config.split, config.causal)
        return sum((qs.stop - qs.start) * (ks.stop - ks.start)
                   for step in range(cp) for qs, ks, _ in plan.pieces(step))
    if config.variant == "allgather":
        return config.seq // cp * config.seq
    return config.seq * config.seq // cp  # whole sequences for a cp-th of the heads


def pass_once(config: CPAttentionConfig, local: list[torch.Tensor], group):
    """One forward and backward of this rank's share; its output and input gradients."""
    q, k, v = (t.detach().clone().requires_grad_() for t in local[:3])
    out = ATTENTION[config.variant](q, k, v, group, config.split, config.causal)
    out.backward(local[3])
    return [out.detach(), q.grad, k.grad, v.grad]


def native_run(config: CPAttentionConfig, full: tuple[torch.Tensor, ...],
               hand: torch.Tensor, rank: Rank) -> NativeRun:
    """``torch.distributed.tensor.experimental.context_parallel`` on this layer's forward.

    It shards the buffers along the sequence in place (zig-zag for a causal mask) and
    swaps ``scaled_dot_product_attention``'s kernels for its ring-shaped loop over key/value
    blocks (by default all-gathered at once); it handles only the flash, efficient and
    cuDNN kernels (CUDA), so on a CPU it fails, and says why.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import _attention, context_parallel

    unshard_native = _attention.context_parallel_unshard  # private module: not re-exported
    mesh = init_device_mesh(rank.device.type, (rank.world_size,), mesh_dim_names=("cp",))
    q, k, v = (t.to(rank.device, torch.float32).clone() for t in full[:3])
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], 1) for t in (k, v))
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=config.causal)
        (whole,) = unshard_native(mesh, [out], [2])
    except Exception as error:  # noqa: BLE001 (recorded for the lesson, not raised)
        frame = traceback.extract_tb(error.__traceback__)[-1]
        where = f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
        return NativeRun(False, error=f"{type(error).__name__}: {str(error).splitlines()[0]}",
                         where=where)
    return NativeRun(True, (whole.double().cpu() - hand).abs().max().item())


def main(config: CPAttentionConfig, rank: Rank) -> CPAttentionResult:
    group = rank.group or dist.group.WORLD
    cp, me = rank.world_size, rank.rank
    full = inputs(config)
    local = [shard(t, me, cp, config.split).to(rank.device) for t in full]
    with WireMeter() as wire:
        with CommMeter(sends=True) as forward:
            q, k, v = (t.clone().requires_grad_() for t in local[:3])
            out = ATTENTION[config.variant](q, k, v, group, config.split, config.causal)
        with CommMeter(sends=True) as backward:
            out.backward(local[3])
    mine = [out.detach(), q.grad, k.grad, v.grad]
    gathered = []
    for tensor in mine:
        parts = [torch.empty_like(tensor) for _ in range(cp)]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        gathered.append(unshard([p.cpu() for p in parts], cp, config.split))
    for _ in range(config.warmup):
        pass_once(config, local, group)
    seconds, computing = [], []
    cuda = rank.device.type == "cuda"
    for _ in range(config.repeats):
        dist.barrier(group=group)
        if cuda:
            torch.cuda.synchronize()
        with compute_clock() as spent:
            start = time.perf_counter()
            pass_once(config, local, group)
            if cuda:
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        computing.append(spent[0])
    side = RankSide(me, positions(me, cp, config.seq, config.split).tolist(),
                    scores_computed(config, me, cp), forward.total_ring, backward.total_ring,
                    forward.total_gloo, backward.total_gloo,
                    wire.sent if wire.available else None, seconds, computing)
    sides: list[dict | None] = [None] * cp
    dist.all_gather_object(sides, side.to_dict(), group=group)
    want = reference(*full, config.causal)
    allowed = attention_bounds(*full, config.causal).values()  # derived, in bounds.py
    proofs = [Proof(name, (got - ref).abs().max().item(), bound)
              for name, got, ref, bound in zip(QUANTITIES, gathered, want, allowed, strict=True)]
    shape = config.shape()
    native = native_run(config, full, gathered[0], rank) if config.native else None
    result = CPAttentionResult(config.variant, config.split, cp, config.causal, proofs,
                               [RankSide.from_dict(s) for s in sides],
                               layer_traffic(config.variant, shape, cp),
                               layer_traffic(config.variant, shape, cp, gloo=True), native)
    if me == 0:
        print(json.dumps({"variant": result.variant, "cp": cp, **result.verdicts,
                          "worst": result.proven.worst.max_diff,
                          "imbalance": round(result.imbalance, 3),
                          "native": native.to_dict() if native else None}), flush=True)
    return result


if __name__ == "__main__":
    serve(CPAttentionConfig, main)
