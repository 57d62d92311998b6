"""What one rank of expert parallelism holds, predicted from shapes and the routing.

Weights, gradients, optimizer state: every rank holds the replicated part whole (the
embedding, attention, norms, head, and each block's router and shared expert) and
``E / ep`` experts of each block; each router's selection bias is a buffer (no gradient,
no optimizer state), counted with the weights. A local expert that no row reached has no
gradient, and so no optimizer state, in this step (with ``ep = dp``; with ``ep < dp`` its
replicas' all-reduce gives it zeros, which this does not count).

Activations (what autograd keeps for backward, each storage once): a block keeps what
the dense estimator says (:mod:`helpers.memory.transformer`) except its gated MLP's four
``ffn``-wide tensors. Unlike a dense layer's, an MoE layer's depend on the routing. On a
rank with ``T`` tokens, ``k`` slots, ``E`` experts, width ``H``, expert width ``F`` and
``e`` bytes an element (indices are int64, 8 bytes):

- router: the probabilities ``T E``; the chosen ones ``T k`` and their sum ``T`` (the
  gates' division); the chosen experts ``T k`` int64 (the gather's index);
- permute: the source token of each copy, ``T k`` int64;
- each local expert with ``n`` rows arrived, ``m`` of them kept by capacity: the gathered
  rows ``m H``, its SwiGLU's four ``m F`` tensors (gate, silu, up, their product), and
  the arrival index, ``n`` int64: capacity keeps a slice of it, and a slice keeps its
  whole storage; then the kept rows' outputs, ``sum m`` of width ``H``, and where they
  go, ``sum m`` int64 (``index_copy`` keeps its source, though only its shape is needed);
- combine: the inverse permutation ``T k`` int64, the results home ``T k H``, the gates
  ``T k``; the auxiliary loss: the global shares ``f``, ``E``;
- the shared expert: four ``T F`` tensors.

The layer's input, the norm's output, is saved by the router (and the shared expert), as
a dense MLP saves it: the dense part counts it. The all-to-alls save nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from helpers.expert_parallel.dispatch import ExpertParallelMoE, expert_range
from helpers.expert_parallel.moe import MoEShape, capacity
from helpers.memory.estimate import estimate_transformer
from helpers.memory.ledger import DeviceMemory
from helpers.memory.parameters import ELEMENT_BYTES, parameter_memory
from helpers.memory.transformer import TransformerShape
from helpers.models.llama import LMConfig

INDEX_BYTES = 8  # int64


@dataclass(frozen=True)
class LayerLoad:
    """What one MoE layer met on one rank in one forward."""

    tokens: int  # this rank's tokens
    arrived: tuple[int, ...]  # rows that arrived for each local expert, from every rank
    kept: tuple[int, ...]  # of them, the rows each kept under capacity


def layer_load(layer: ExpertParallelMoE) -> LayerLoad:
    """The load of ``layer``'s last forward (its ``last_splits``)."""
    splits = layer.last_splits
    if splits is None:
        raise ValueError("the layer has not run; valid: read its load after a forward")
    return LayerLoad(int(splits.counts.sum()) // layer.shape.top_k,
                     tuple(splits.arrived.sum(0).tolist()), tuple(splits.kept.tolist()))


def balanced_load(tokens: int, shape: MoEShape, ep: int) -> LayerLoad:
    """The load of a perfectly even router, the plan before any run: each of ``ep`` ranks
    routes ``tokens``, and every expert receives ``ep x tokens x k / E`` rows."""
    local = len(expert_range(shape.experts, ep, 0))
    rows, left = divmod(ep * tokens * shape.top_k, shape.experts)
    if left:
        raise ValueError(f"{ep * tokens * shape.top_k} rows do not split evenly over "
                         f"{shape.experts} experts; valid: tokens x ep x top_k a multiple of E")
    limit = capacity(ep * tokens, shape)
    return LayerLoad(tokens, (rows,) * local, (rows if limit is None else min(rows, limit),) * local)


def moe_saved_bytes(shape: MoEShape, load: LayerLoad, element_size: int) -> int:
    """Bytes one MoE layer keeps for backward on a rank (see the module's docstring); its
    input, counted by the dense part, excluded."""
    t, k, e, h, f = load.tokens, shape.top_k, element_size, shape.hidden, shape.ffn
    router = t * shape.experts * e + (t * k + t) * e + t * k * INDEX_BYTES
    moved = 2 * t * k * INDEX_BYTES + t * k * h * e + t * k * e + shape.experts * e
    experts = sum(m * (h + 4 * f) * e + n * INDEX_BYTES
                  for n, m in zip(load.arrived, load.kept, strict=True) if n)
    placed = sum(load.kept) * (h * e + INDEX_BYTES)
    shared = 4 * t * f * e if shape.shared else 0
    return router + moved + experts + placed + shared


def _dense(lm: LMConfig) -> TransformerShape:
    return TransformerShape.of(lm)


def parameter_counts(lm: LMConfig, shape: MoEShape, ep: int,
                     loads: list[LayerLoad] | None = None) -> dict[str, int]:
    """Elements and tensors one rank holds: ``"numel"``/``"tensors"`` of all its weights,
    ``"trained"``/``"trained_tensors"`` of those with a gradient this step (a local expert
    no row reached has none; without ``loads``, every expert is taken to get rows), and
    ``"buffers"`` (the routers' biases)."""
    dense = _dense(lm)
    h, f = lm.hidden, shape.ffn
    block, block_tensors = dense.block_parameters()
    block, block_tensors = block - 3 * h * lm.ffn, block_tensors - 3  # no dense MLP
    router, shared = h * shape.experts, 3 * h * f if shape.shared else 0
    per_block = block + router + shared
    tensors = block_tensors + 1 + 3 * shape.shared
    rest = dense.embed_parameters()[0] + dense.head_parameters()[0]
    rest_tensors = dense.embed_parameters()[1] + dense.head_parameters()[1]
    local = len(expert_range(shape.experts, ep, 0))
    if loads is not None and len(loads) != lm.blocks:
        raise ValueError(f"{len(loads)} loads for {lm.blocks} blocks; valid: one per block")
    reached = lm.blocks * local if loads is None else sum(
        1 for load in loads for n in load.arrived if n)  # local experts that got rows
    return {"numel": rest + lm.blocks * (per_block + local * 3 * h * f),
            "tensors": rest_tensors + lm.blocks * (tensors + 3 * local),
            "trained": rest + lm.blocks * per_block + reached * 3 * h * f,
            "trained_tensors": rest_tensors + lm.blocks * tensors + 3 * reached,
            "buffers": lm.blocks * shape.experts}


def ep_rank_memory(lm: LMConfig, shape: MoEShape, *, ep: int, batch: int, seq: int,
                   loads: list[LayerLoad] | None = None, optimizer: str = "adam",
                   precision: str = "fp32") -> DeviceMemory:
    """One rank's ledger row: ``batch`` sequences of ``seq`` tokens on it, each block's
    experts split ``ep`` ways, ``loads`` what each block's MoE layer met (default: a
    perfectly even router, :func:`balanced_load`). fp32 or fp64: under mixed precision
    the router's softmax would run in float32, which this does not model."""
    if precision not in ("fp32", "fp64"):
        raise ValueError(f"precision={precision!r}; valid: 'fp32', 'fp64' (the MoE layer's "
                         "activations are not modelled in mixed precision)")
    e = ELEMENT_BYTES[precision]
    tokens = batch * seq
    loads = loads if loads is not None else [balanced_load(tokens, shape, ep)] * lm.blocks
    if any(load.tokens != tokens for load in loads):
        raise ValueError(f"loads of {[x.tokens for x in loads]} tokens; valid: {tokens} each")
    counts = parameter_counts(lm, shape, ep, loads)
    trained = parameter_memory(counts["trained"], counts["trained_tensors"],
                               optimizer=optimizer, precision=precision)
    dense = estimate_transformer(_dense(lm), batch=batch, seq=seq, optimizer=optimizer,
                                 precision=precision).sum().activations
    mlp = lm.blocks * tokens * 4 * lm.ffn * e  # the dense MLPs' four ffn-wide tensors
    return DeviceMemory(weights=(counts["numel"] + counts["buffers"]) * e, grads=trained.grads,
                        optimizer_state=trained.optimizer_state,
                        activations=dense - mlp + sum(moe_saved_bytes(shape, x, e) for x in loads))


def held(model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
         activations: int = 0) -> DeviceMemory:
    """What a rank holds now, measured: its parameters and buffers, its gradients, its
    optimizer's state tensors (and ``activations``, measured by the caller)."""
    params = list(model.parameters())
    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    state = 0 if optimizer is None else sum(
        size(v) for p in params for v in optimizer.state.get(p, {}).values()
        if isinstance(v, torch.Tensor))
    return DeviceMemory(weights=sum(size(t) for t in (*params, *model.buffers())),
                        grads=sum(size(p.grad) for p in params if p.grad is not None),
                        optimizer_state=state, activations=activations)
