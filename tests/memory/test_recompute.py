"""helpers.memory.recompute: checkpointed blocks, measured against the estimate."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from helpers.memory import SavedTensorMeter, estimate_training_memory
from helpers.memory.recompute import CheckpointedBlock, checkpointed, measure_recompute
from helpers.models.llama import Block, LMConfig, build_lm

CONFIG = LMConfig(vocab=50, hidden=32, blocks=3, ffn=96, heads=2)


def tiny():
    model = build_lm(CONFIG)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, CONFIG.vocab, (2, 8), generator=gen)
    labels = torch.randint(0, CONFIG.vocab, (2, 8), generator=gen)
    return model, ids, labels


def loss_of(model, ids, labels):
    return F.cross_entropy(model(ids).reshape(-1, CONFIG.vocab), labels.reshape(-1))


def test_measured_equals_predicted_without_and_with_recomputation():
    model, ids, labels = tiny()
    result = measure_recompute(model, ids, labels, repeats=1, warmup=0)
    for kind in ("plain", "recompute"):
        assert result.measured[kind].matches(result.predicted[kind]), kind
    (plain, _), (recomputed, _) = result.activations("plain"), result.activations("recompute")
    shape, tokens = model.transformer_shape(), 2 * 8
    block, kept = shape.block_activation_bytes(tokens, 4), shape.block_input_bytes(tokens, 4)
    embed, head = shape.embed_activation_bytes(tokens), shape.head_activation_bytes(tokens, 4)
    assert plain == embed + 3 * block + head
    assert recomputed == embed + 3 * kept + max(head, block - kept) < plain
    assert set(result.times) == {"plain", "recompute", "blocks forward"}
    assert result.predicted_extra_time > 0 and isinstance(result.extra_time, float)
    text = result.table().splitlines()
    assert text[0].split() == ["saved", "for", "backward", "measured", "predicted"]
    assert text[2].startswith("recompute") and text[3].startswith("step (median)")


def test_the_meter_alone_misses_what_the_recomputation_holds():
    model, ids, labels = tiny()
    model.train()
    shape, tokens = model.transformer_shape(), 2 * 8
    with SavedTensorMeter(model) as meter:
        x = model.embed(ids)
        for block in model.blocks:  # plain checkpoint: its hooks hide the recomputation
            x = checkpoint(block, x, use_reentrant=False)
        F.cross_entropy(model.head(model.norm(x)).reshape(-1, 50), labels.reshape(-1)).backward()
    seen = shape.embed_activation_bytes(tokens) + 3 * shape.block_input_bytes(tokens, 4)
    assert meter.peak["cpu"] == seen + shape.head_activation_bytes(tokens, 4)
    predicted = estimate_training_memory(model, batch=2, seq=8, recompute=True, names=["cpu"])
    assert meter.peak["cpu"] < predicted["cpu"].activations


def test_recomputation_gives_the_same_outputs_and_gradients():
    model, ids, labels = tiny()
    loss_of(model, ids, labels).backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with checkpointed(model):
        loss = loss_of(model, ids, labels)
        loss.backward()
    assert torch.equal(loss, loss_of(model, ids, labels))
    for p, g in zip(model.parameters(), plain, strict=True):
        assert (p.grad - g).abs().max() <= 1e-6


def test_the_blocks_are_put_back_even_after_an_error():
    model, ids, _ = tiny()
    originals = list(model.blocks)
    with checkpointed(model):
        assert all(isinstance(b, CheckpointedBlock) for b in model.blocks)
        with pytest.raises(ValueError, match="checkpointed already"):
            with checkpointed(model):
                pass
    assert list(model.blocks) == originals
    with pytest.raises(RuntimeError, match="boom"):
        with checkpointed(model):
            raise RuntimeError("boom")
    assert all(type(b) is Block for b in model.blocks) and list(model.blocks) == originals


def test_measuring_leaves_the_model_as_it_was():
    model, ids, labels = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    measure_recompute(model, ids, labels, repeats=1, warmup=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and not model.training


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no blocks"):
        with checkpointed(torch.nn.Linear(2, 2)):
            pass
    model, ids, labels = tiny()
    result = measure_recompute(model, ids, labels, repeats=1, warmup=0)
    with pytest.raises(ValueError, match="'selective'.*plain, recompute"):
        result.activations("selective")
