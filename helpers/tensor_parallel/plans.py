"""The same split through PyTorch's own API: ``parallelize_module`` on the small Llama.

The plan is the hand split of ``llama`` written as placements on a 1-D ``DeviceMesh``:
q, k, v, gate and up ``ColwiseParallel`` (rows), o and down ``RowwiseParallel``
(columns), the embedding ``RowwiseParallel`` (its rows are the vocabulary), the head
``ColwiseParallel`` with its output left sharded over the vocabulary for
``loss_parallel``. With sequence parallelism the norms are ``SequenceParallel`` (their
input and output sharded along the sequence, dim 1), the attention and the MLP take
their input through ``PrepareModuleInput`` (``Shard(1)`` in, all-gathered to
``Replicate()``), and o, down and the embedding hand back ``Shard(1)`` (a
reduce-scatter). The attention module needs no change: it counts its heads from the
width of its (now local) projections.
"""

from __future__ import annotations

from helpers.models.llama import TinyLM


def llama_plans(sequence_parallel: bool) -> tuple[dict, dict]:
    """(the model's plan for embed, norm and head; each block's plan), by module name."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    between = Shard(1) if sequence_parallel else Replicate()  # the residual stream's layout
    top = {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
           "head": ColwiseParallel(input_layouts=between, output_layouts=Shard(-1),
                                   use_local_output=False)}
    block = {"attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(),
             "attn.v_proj": ColwiseParallel(),
             "attn.o_proj": RowwiseParallel(output_layouts=between),
             "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
             "mlp.down_proj": RowwiseParallel(output_layouts=between)}
    if sequence_parallel:
        top["norm"] = SequenceParallel()
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        block.update({"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),
                      "attn": gather, "mlp": gather})
    return top, block


def parallelize_llama(model: TinyLM, mesh, *, sequence_parallel: bool) -> TinyLM:
    """Shard ``model`` in place over the 1-D ``mesh`` with :func:`llama_plans`."""
    from torch.distributed.tensor.parallel import parallelize_module

    top, block = llama_plans(sequence_parallel)
    parallelize_module(model, mesh, top)
    for each in model.blocks:
        parallelize_module(each, mesh, block)
    return model
