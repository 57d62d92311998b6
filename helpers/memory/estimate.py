"""Predict a training step's memory ledger from shapes alone.

Weights, grads and optimizer state follow from parameter counts and dtypes; the
activations from the rules in :mod:`layer_rules` (chains of layers) or the formula in
:mod:`transformer` (Llama shapes of any size). The estimator knows no lesson: a model
says what it is through a small protocol, :class:`LayerChain` (``layer_chain()``) or
:class:`HasTransformerShape` (``transformer_shape()``), implemented where it is defined.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from torch import nn

from helpers.memory.layer_rules import activation_bytes
from helpers.memory.ledger import Ledger
from helpers.memory.moe import MoETransformerShape, validate_ep
from helpers.memory.optimizers import validate_optimizer
from helpers.memory.parameters import (
    ELEMENT_BYTES,
    parameter_memory,
    sharded_parameter_memory,
    validate_dp,
    validate_precision,
    validate_recompute,
    validate_zero,
)
from helpers.memory.transformer import TransformerShape


@runtime_checkable
class LayerChain(Protocol):
    """A model that runs as a chain of layers, one after another, and can say so."""

    def layer_chain(self) -> tuple[list[nn.Module], list[int]]:
        """(its layers in forward order, its split points: a new part starts before each)."""
        ...


@runtime_checkable
class HasTransformerShape(Protocol):
    """A Llama-shaped model that can give its sizes."""

    def transformer_shape(self) -> TransformerShape:
        """Its sizes, for :func:`estimate_transformer`."""
        ...


def _unique(modules: Sequence[nn.Module]) -> tuple[list, list]:
    params = {id(p): p for m in modules for p in m.parameters()}
    buffers = {id(b): b for m in modules for b in m.buffers()}
    return list(params.values()), list(buffers.values())


def estimate_layers(
    layers: Sequence[nn.Module],
    sample_shape: Sequence[int],
    *,
    batch: int,
    split_points: Sequence[int] = (),
    names: Sequence[str] | None = None,
    optimizer: str = "sgd",
    loss: str = "mse",
) -> Ledger:
    """The ledger of a layer list cut before ``split_points`` (float32), one row per part.

    ``layers`` are modules (their parameters are only counted: the meta device will do);
    ``sample_shape`` is one input's shape without the batch; ``loss`` is ``"mse"`` or
    ``"cross_entropy"``.
    """
    validate_optimizer(optimizer)
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch={batch!r}; valid: an integer >= 1")
    bounds = [0, *split_points, len(layers)]
    names = list(names) if names else [f"part {k}" for k in range(len(bounds) - 1)]
    if len(names) != len(bounds) - 1:
        raise ValueError(f"{len(names)} names for {len(bounds) - 1} parts; valid: one per part")
    acts = activation_bytes(layers, (batch, *sample_shape), split_points, loss=loss)
    rows = {}
    for name, (a, b), act in zip(names, zip(bounds, bounds[1:], strict=False), acts, strict=True):
        params, buffers = _unique(layers[a:b])
        row = parameter_memory(
            sum(p.numel() for p in params),
            len(params),
            optimizer=optimizer,
            buffers=sum(t.numel() * t.element_size() for t in buffers),
        )
        row.activations = act
        rows[name] = row
    return Ledger(rows, note=f"estimated from shapes, optimizer {optimizer}")


def _note(precision: str, optimizer: str, tp: int, dp: int, zero: int, recompute: bool,
          batch: int, seq: int, sp: bool = False, cp: int = 1, ep: int = 1) -> str:
    extras = [f"dp={dp}, ZeRO-{zero}" if dp > 1 or zero else "",
              "recompute" if recompute else "", "sequence parallel" if sp else "",
              f"cp={cp}" if cp > 1 else "", f"ep={ep}" if ep > 1 else ""]
    return ", ".join(["estimated", f"{precision} {optimizer}", f"tp={tp}",
                      *filter(None, extras), f"batch {batch}x{seq}"])


def estimate_transformer(
    shape: TransformerShape,
    *,
    batch: int,
    seq: int,
    optimizer: str = "adam",
    precision: str = "fp32",
    stages: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
    tp: int = 1,
    in_flight: Sequence[int] | None = None,
    dp: int = 1,
    zero: int = 0,
    recompute: bool = False,
    sequence_parallel: bool = False,
    cp: int = 1,
    ep: int = 1,
) -> Ledger:
    """A Llama-shaped model's ledger per device (a mixture of experts too).

    ``stages`` gives the number of blocks on each pipeline stage (default: all on one;
    the first stage also holds the embedding, the last the final norm and head);
    ``tp`` splits every stage over that many tensor-parallel ranks (the embedding and
    head too, by vocabulary); ``in_flight`` is how many micro-batches of ``batch``
    sequences each stage keeps activations for at its peak (default 1 each).

    ``dp`` data-parallel ranks each run ``batch`` sequences (activations do not change)
    and shard the rest under ZeRO stage ``zero`` (see :func:`sharded_parameter_memory`;
    the units gathered one at a time are the embedding, each block, and the final norm
    with the head). ``recompute`` runs each block under ``torch.utils.checkpoint``: a
    block keeps only its input until its backward, which first reruns its forward. The
    peak is the larger of the forward's end (the inputs, embedding and head) and the
    last block's recomputed backward (the head freed, that block's activations back).
    ``sequence_parallel`` splits the tensors around the norms along the sequence too
    (:meth:`TransformerShape.block_activation_bytes` says which). ``cp`` context-parallel
    ranks each hold ``seq / cp`` tokens of every sequence and every weight: ring attention
    keeps what one device keeps for that many tokens (the all-gathered and Ulysses variants
    keep more, the gathered keys and values).

    A :class:`~helpers.memory.moe.MoETransformerShape` splits its routed experts over
    ``ep`` of the ``dp`` ranks (``ep`` divides ``dp`` and the experts); its assumptions
    (a balanced router, ZeRO over ``dp / ep`` for the experts) are :mod:`helpers.memory.moe`'s.
    """
    validate_precision(precision)
    if not isinstance(cp, int) or cp < 1 or seq % cp:
        raise ValueError(f"cp={cp!r}; valid: an integer >= 1 that divides seq={seq}")
    validate_recompute(recompute)
    validate_dp(dp)
    validate_zero(zero)
    validate_ep(ep, dp, shape)
    moe = isinstance(shape, MoETransformerShape)
    stages = list(stages or [shape.blocks])
    if sum(stages) != shape.blocks or min(stages) < 1:
        raise ValueError(f"stages {stages} must be >= 1 each and add up to {shape.blocks} blocks")
    in_flight = list(in_flight or [1] * len(stages))
    if len(in_flight) != len(stages):
        raise ValueError(f"in_flight {in_flight}: valid: one count per stage ({len(stages)})")
    e = ELEMENT_BYTES[precision]
    rows = {}
    names = list(names or [f"stage {k}" for k in range(len(stages))])
    for k, blocks in enumerate(stages):
        first, last = k == 0, k == len(stages) - 1
        acts = {"tokens": batch * seq // cp, "element_size": e, "tp": tp,
                "recompute": recompute, "seq_parallel": sequence_parallel}
        if moe:
            start = sum(stages[:k])
            row = shape.stage_memory(start, blocks, first, last, optimizer=optimizer,
                                     precision=precision, tp=tp, dp=dp, ep=ep, zero=zero)
            kept, extra = shape.moe_stage_activation_bytes(start, blocks, first, last, **acts)
        else:
            numel, tensors, unit = shape.stage_parameters(blocks, first, last)
            row = sharded_parameter_memory(numel // tp, tensors, optimizer=optimizer,
                                           precision=precision, dp=dp, zero=zero,
                                           unit=unit // tp)
            kept, extra = shape.stage_activation_bytes(blocks, first, last, **acts)
        row.activations = kept * in_flight[k] + extra
        rows[names[k]] = row
    return Ledger(rows, note=_note(precision, optimizer, tp, dp, zero, recompute, batch, seq,
                                   sequence_parallel, cp, ep))


def layers_of(model: object) -> tuple[list[nn.Module], list[int]]:
    """(layers in forward order, split points) of a chain of layers.

    A :class:`LayerChain` gives both; an ``nn.Sequential`` or a list of modules or of
    (name, module) pairs (``resnet_layers(model)``, for instance) is one part.
    """
    if isinstance(model, LayerChain):
        layers, points = model.layer_chain()
        return list(layers), list(points)
    if isinstance(model, nn.Sequential):
        return list(model), []
    if isinstance(model, (list, tuple)) and model:
        return [m[1] if isinstance(m, tuple) else m for m in model], []
    raise ValueError(
        f"cannot estimate a {type(model).__name__}: the estimator reads no model it is not "
        "told how to read; valid: a model with a layer_chain() method (the LayerChain "
        "protocol of helpers.memory), an nn.Sequential, or the list of its layers in forward "
        "order; for a transformer, a TransformerShape or a model with transformer_shape()"
    )


def estimate_training_memory(
    model: object,
    *,
    batch: int,
    sample_shape: Sequence[int] | None = None,
    seq: int | None = None,
    optimizer: str = "sgd",
    precision: str = "fp32",
    loss: str = "mse",
    names: Sequence[str] | None = None,
    **transformer: object,
) -> Ledger:
    """The ledger :func:`measure_training_memory` would measure, predicted from shapes.

    Llama shapes (a ``TransformerShape``, or a :class:`HasTransformerShape` model) need
    ``seq`` and take :func:`estimate_transformer`'s options (``stages``, ``tp``,
    ``in_flight``, ``dp``, ``zero``, ``recompute``, ``sequence_parallel``, ``cp``, ``ep``);
    chains of layers (see :func:`layers_of`) need ``sample_shape`` (one
    input without the batch) and ``loss`` (``"mse"`` or ``"cross_entropy"``).
    """
    if isinstance(model, (TransformerShape, HasTransformerShape)):
        if seq is None:
            raise ValueError("a transformer estimate needs seq= (tokens per sequence)")
        shape = model if isinstance(model, TransformerShape) else model.transformer_shape()
        return estimate_transformer(
            shape,
            batch=batch,
            seq=seq,
            optimizer=optimizer,
            precision=precision,
            names=names,
            **transformer,
        )
    if validate_precision(precision) != "fp32" or transformer:
        raise ValueError(
            f"precision={precision!r} and {sorted(transformer)} apply to "
            "transformer shapes only; valid for a chain of layers: fp32, no options"
        )
    if sample_shape is None:
        raise ValueError("a chain of layers needs sample_shape= (one input, without the batch)")
    layers, points = layers_of(model)
    return estimate_layers(
        layers,
        sample_shape,
        batch=batch,
        split_points=points,
        names=names,
        optimizer=optimizer,
        loss=loss,
    )
