"""What one rank of the 3-D run should hold, predicted from the shapes and the plans.

Each weight of a stage is split by the tensor-parallel plan (lesson 09's ``llama_plans``:
a column-parallel linear by its rows, a row-parallel one by its columns, the embedding
by the vocabulary, the norms whole), then ``fully_shard`` cuts what is left along its
first dimension over ``dp x cp`` (a chunk of ``ceil(rows / (dp x cp))`` rows). AdamW keeps two
tensors per weight (``exp_avg``, ``exp_avg_sq``) and a float32 step counter. The
activations are the estimator's (``helpers.memory``), for the micro-batches in flight and
``seq / cp`` tokens of each sequence.

One gradient is not shaped like its weight: PyTorch's vocabulary-parallel embedding
(``RowwiseParallel`` on ``nn.Embedding``) hands back its gradient whole (``Replicate``),
not in slices, so each tensor-parallel rank holds the full ``vocab x hidden`` gradient
before the optimizer step.

The MoE model (``helpers.composed.experts``): a rank holds ``E / ep`` experts of each block
of its stage whole (neither split over tp nor sharded by ``fully_shard``), and the router
like any whole weight (sharded over dp). Its experts' gradients and AdamW state depend on
the routing (an expert no token reached has none), and so do the MoE layer's activations
(lesson 11's ``moe_saved_bytes``) and the all-to-all's bytes (``ep_traffic``): those
predictions take the rank's routing, a :class:`~helpers.composed.experts.RankRouting`.
"""

from __future__ import annotations

import math

from helpers.comm.collectives import ring_bytes
from helpers.composed.experts import RankRouting, local_experts, model_structure
from helpers.composed.layout import CP_VARIANT, StageModule
from helpers.context_parallel.traffic import AttentionShape, layer_traffic
from helpers.expert_parallel.memory import moe_saved_bytes
from helpers.expert_parallel.traffic import ep_traffic, routing_matrix
from helpers.memory.estimate import estimate_transformer
from helpers.memory.ledger import DeviceMemory
from helpers.memory.transformer import TransformerShape

STEP_BYTES = 4  # AdamW's step counter, a float32 scalar per weight


def tp_dim(name: str) -> int | None:
    """The dimension the tensor-parallel plan splits parameter ``name`` along (None: whole)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from helpers.tensor_parallel.plans import llama_plans

    top, block = llama_plans(sequence_parallel=True)
    parts = name.split(".")
    module = ".".join(parts[2:-1]) if parts[0] == "blocks" else ".".join(parts[:-1])
    style = (block if parts[0] == "blocks" else top).get(module)
    if isinstance(style, ColwiseParallel) or (module == "embed" and style is not None):
        return 0
    return 1 if isinstance(style, RowwiseParallel) else None


def moe_kind(name: str) -> str:
    """"expert" (held by one rank of the ep group, whole), "router" (held by every rank,
    whole over tp; a shared expert too) or "dense" (every other weight)."""
    if ".mlp.experts." in name:
        return "expert"
    return "router" if ".mlp.router." in name or ".mlp.shared." in name else "dense"


def _local_numel(shape: list[int], split: int | None, tp: int, dp: int) -> int:
    shape = list(shape)
    if split is not None:
        shape[split] //= tp
    shape[0] = -(-shape[0] // dp)  # fully_shard's chunk of the first dimension
    return math.prod(shape)


def _pieces(config, stage: int) -> list[tuple[str, int, int]]:
    """(name, elements this rank holds, elements of its tensor-parallel piece) of each
    weight of ``stage``: split by the tensor-parallel plan, then by ``fully_shard`` over dp.
    Of an MoE model's experts, a rank's ``E / ep`` (the first ones: every rank holds as
    many), not sharded."""
    layout, moe = config.layout, config.moe
    module = StageModule(model_structure(config.model, moe), stage, layout.pp)
    mine = range(local_experts(moe, layout.dp)) if moe is not None else range(0)
    out = []
    for name, p in module.named_parameters():
        expert = moe_kind(name) == "expert"
        if expert and int(name.split(".")[4]) not in mine:
            continue
        split = tp_dim(name) if layout.tp > 1 else None
        out.append((name, _local_numel(p.shape, split, layout.tp, 1 if expert else layout.shards),
                    _local_numel(p.shape, split, layout.tp, 1)))
    return out


def _moe_activations(config, stage: int, routing: RankRouting, rows: int) -> int:
    """What the MoE layers change in a stage's activations at its peak: each micro-batch's
    dense MLPs out (their four ffn-wide tensors, and under sequence parallelism the
    all-gathered input, for which the MoE layer keeps this rank's slice), each MoE layer's
    saved bytes in (``moe_saved_bytes``, without the auxiliary loss's shares, which are
    dropped), over the micro-batches 1F1B keeps in flight (the window that keeps most)."""
    layout, lm, moe = config.layout, config.model, config.moe
    e, t, h = config.torch_dtype.itemsize, layout.tp, lm.hidden
    tokens, blocks = rows * config.seq, lm.blocks // layout.pp
    dense = blocks * tokens * e * (4 * lm.ffn // t + h - h // t)
    each = [sum(moe_saved_bytes(moe, layer[j], e) - moe.experts * e for layer in routing.loads)
            for j in range(len(routing.loads[0]))]
    window = min(config.microbatches, layout.pp - stage) if layout.pp > 1 else 1
    held = max(sum(each[j:j + window]) for j in range(len(each) - window + 1))
    return held - window * dense


def _need_routing(config, routing: RankRouting | None) -> None:
    if config.moe is not None and routing is None:
        raise ValueError("an MoE model's prediction without its routing; valid: routing=the "
                         "rank's RankRouting (helpers.composed.experts)")


def predicted_memory(config, stage: int, routing: RankRouting | None = None) -> DeviceMemory:
    """A rank of ``stage``'s ledger: its pieces of the weights, gradients and AdamW state,
    and the activations of 1F1B's micro-batches in flight on its stage (the peak). An MoE
    model's needs the rank's ``routing``."""
    _need_routing(config, routing)
    layout, m = config.layout, config.microbatches
    e = config.torch_dtype.itemsize
    pieces = _pieces(config, stage)
    experts = [held for name, held, _ in pieces if moe_kind(name) == "expert"]
    weights = e * sum(held for _, held, _ in pieces)
    # the embedding's gradient comes back whole (see above) until fully_shard cuts it
    whole = layout.tp > 1 and layout.shards == 1
    grads = e * sum(held * (layout.tp if whole and name == "embed.weight" else 1)
                    for name, held, _ in pieces if moe_kind(name) != "expert")
    state, tensors = weights, len(pieces)
    if experts:  # only the experts a token reached have a gradient; AdamW's state, ever
        expert = 3 * config.moe.hidden * config.moe.ffn
        grads += e * expert * routing.trained
        state += e * expert * (routing.kept - len(experts) // 3)
        tensors += 3 * routing.kept - len(experts)
    rows = config.batch // layout.dp // (m if layout.pp > 1 else 1)
    in_flight = [min(m, layout.pp - k) if layout.pp > 1 else 1 for k in range(layout.pp)]
    precision = {4: "fp32", 8: "fp64"}[e]
    ledger = estimate_transformer(
        TransformerShape.of(config.model), batch=rows, seq=config.seq, precision=precision,
        stages=[config.model.blocks // layout.pp] * layout.pp, tp=layout.tp,
        in_flight=in_flight, sequence_parallel=layout.tp > 1, cp=layout.cp)
    activations = list(ledger.rows.values())[stage].activations
    if config.moe is not None:
        activations += _moe_activations(config, stage, routing, rows)
    return DeviceMemory(weights=weights, grads=grads,
                        optimizer_state=2 * state + STEP_BYTES * tensors,
                        activations=activations)


def predicted_sent(config, stage: int, algorithm: str = "ring",
                   routing: RankRouting | None = None) -> dict[str, float]:
    """Bytes a rank of ``stage`` sends in a step, per mesh dimension, from the shapes, by
    the ring formula (``algorithm="ring"``: what NCCL's ring sends) or by gloo's algorithms
    (``"gloo"``: this run's backend, whose reduce-scatter is an all-reduce: twice the ring's).

    ``S`` is the residual stream of the rank's tokens (``batch / dp x seq / cp x hidden``
    elements) and ``r(n) = (n - 1) / n`` a ring's share (lesson 06):

    - ``tp``: sequence parallelism all-gathers S before attention and the MLP and
      reduce-scatters it after them, and the backward does the mirror: 8 r(tp) S per
      block, half of it reduce-scatters; the embedding (a reduce-scatter, and its
      backward's all-gather) and the head (an all-gather, and its backward's
      reduce-scatter) 2 r(tp) S each; ``loss_parallel`` all-reduces three numbers per
      token; and the weights every tensor-parallel rank holds whole (the norms) get their
      gradients summed over the ranks: an all-reduce of their bytes. Without
      ``fully_shard`` (which sums them once, in the backward) these gradients reach AdamW
      as ``Partial`` DTensors, and DTensor sums one each time an operation needs its
      value: three times (``exp_avg``'s update uses the gradient once, ``exp_avg_sq``'s
      twice, as ``grad * grad``).
    - ``dp``, ``fully_shard``'s ranks (dp x cp with context parallelism, ``d`` ranks in
      all; counted under ``cp`` when dp = 1, whose ranks it then spans): it all-gathers the
      stage's weights (its tensor-parallel pieces, P bytes) for the forward and again for
      the backward (once only under a pipeline: they stay gathered between
      micro-batches), and reduce-scatters their gradients.
    - ``cp``: each block's ring attention (lesson 10's ``layer_traffic``), on its
      tensor-parallel rank's heads, for every micro-batch.
    - ``pp``: each micro-batch's activations go to the next stage and their gradients
      come back; under tensor or context parallelism each rank sends its slice of the
      sequence.

    The MoE model (it needs the rank's ``routing``): its layers take the rank's slice of
    the sequence, so a block's tp traffic is its attention's alone, 4 r(tp) S; the
    experts' and routers' gradients (and a flag per expert tensor) are all-reduced over
    tp once (``experts.reduce_moe_gradients``); over dp, ``fully_shard`` moves every
    weight but the experts, and each MoE forward adds lesson 11's all-to-alls and the
    all-reduce of the counts, from its routing matrix (``ep_traffic``; the same bytes by
    either algorithm), the mean over the timed steps.
    """
    if algorithm not in ("ring", "gloo"):
        raise ValueError(f"algorithm={algorithm!r}; valid choices: ring, gloo")
    _need_routing(config, routing)
    scatter = 2 if algorithm == "gloo" else 1  # a reduce-scatter's bytes, in ring shares
    layout, m, e = config.layout, config.microbatches, config.torch_dtype.itemsize
    t, d, p, c = layout.tp, layout.shards, layout.pp, layout.cp
    first, last = stage == 0, stage == p - 1
    tokens = config.batch // layout.dp * config.seq // c
    stream = tokens * config.model.hidden * e
    sent: dict[str, float] = {}
    pieces = _pieces(config, stage)
    moe = config.moe
    if t > 1:
        r = (t - 1) / t
        blocks = config.model.blocks // p
        # summed over tp whole, before fully_shard cuts them
        whole = e * sum(piece for name, _, piece in pieces
                        if tp_dim(name) is None and moe_kind(name) == "dense")
        gathers = (4 if moe is None else 2) * blocks + first + last  # as many reduce-scatters
        sent["tp"] = (r * stream * gathers * (1 + scatter)
                      + 2 * r * (3 * tokens * e * last + whole * (1 if d > 1 else 3)))
        if moe is not None:  # the MoE gradients, one flag per expert tensor, all-reduced
            flat = sum(held + (moe_kind(name) == "expert") for name, held, _ in pieces
                       if moe_kind(name) != "dense")
            sent["tp"] += ring_bytes("all_reduce", t, flat * e)
    if d > 1:
        gathered = e * d * sum(held for name, held, _ in pieces  # padded to d chunks
                               if moe_kind(name) != "expert")
        sent[layout.fsdp_group] = (d - 1) / d * gathered * ((2 if p == 1 else 1) + scatter)
        if moe is not None and routing.matrices:  # none without a timed step
            moved = [ep_traffic(routing_matrix(counts), routing.ep_rank, config.model.hidden,
                                e, moe.experts) for step in routing.matrices for counts in step]
            steps = len(routing.matrices)  # the mean over them, summed as the meter sums
            sent["dp"] = (sent["dp"] * steps + sum(x.all_to_all + x.totals for x in moved)) / steps
    if c > 1:
        lm, blocks = config.model, config.model.blocks // p
        shape = AttentionShape(batch=config.batch // layout.dp // (m if p > 1 else 1),
                               seq=config.seq, heads=lm.heads // t, kv_heads=lm.kv // t,
                               head_dim=lm.hidden // lm.heads, element_bytes=e)
        per_layer = layer_traffic(CP_VARIANT, shape, c, gloo=algorithm == "gloo").step
        sent["cp"] = sent.get("cp", 0) + per_layer * blocks * (m if p > 1 else 1)
    if p > 1:
        slice_ = tokens // m * config.model.hidden * e / t
        sent["pp"] = m * slice_ * ((not last) + (not first))
    return sent
