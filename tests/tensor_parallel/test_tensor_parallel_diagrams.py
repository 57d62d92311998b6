"""Lesson 09's pictures draw what the split and the plan do, and refuse what they cannot draw."""

import pytest

from helpers.core.drawing import rank_colour
from helpers.models.llama import Block
from helpers.tensor_parallel.attention_shards import head_ranges
from helpers.tensor_parallel.diagrams import megatron_block_diagram, sequence_parallel_diagram
from helpers.tensor_parallel.plans import llama_plans
from helpers.tensor_parallel.transformer_block import split_weights

HIDDEN, FFN, HEADS, KV_HEADS = 64, 96, 8, 4


def _block(kv_heads=KV_HEADS):
    return Block(HIDDEN, FFN, HEADS, kv_heads, rope=True)


@pytest.mark.parametrize("tp", [2, 4])
def test_the_block_diagram_gives_each_rank_its_heads_and_its_cuts(tp):
    block = _block()
    d = megatron_block_diagram(block, tp)
    assert d.labels.count("f") == 3 and d.labels.count("g") == 3  # two halves and the key
    for rank in range(tp):
        q, kv = head_ranges(HEADS, KV_HEADS, tp, rank)
        assert {f"q{i}" for i in q} | {f"kv{i}" for i in kv} <= set(d.labels)
        cuts = split_weights(block, rank, tp)
        q_rows, down = cuts["attn.q_proj.weight"], cuts["mlp.down_proj.weight"]
        assert any(f"q rows {q_rows.start}:{q_rows.stop} " in label for label in d.labels)
        assert any(f"down columns {down.start}:{down.stop} of {FFN}" in label
                   for label in d.labels)
        # its two lanes, one square per query and key/value head, its share of the MLP width
        filled = sum(box[4] == rank_colour(rank) for box in d.boxes)
        assert filled == 2 + HEADS // tp + KV_HEADS // tp + 1, (rank, filled)
    assert sum(label.startswith("rank ") for label in d.labels) == 2 * tp
    assert f"on {tp} ranks" in d.title


def test_the_heads_drawn_on_one_rank_are_no_other_ranks():
    d = megatron_block_diagram(_block(), 2)
    heads = [label for label in d.labels if label.startswith("q") and label[1:].isdigit()]
    assert heads == [f"q{i}" for i in range(HEADS)]  # each query head once, in rank order


@pytest.mark.parametrize(("tp", "kv_heads", "named"), [
    (3, KV_HEADS, "tp=3"), (8, 8, "tp=8"), (4, 2, "kv_heads=2"), (1, KV_HEADS, "tp=1"),
])
def test_the_block_diagram_refuses_a_split_it_cannot_draw(tp, kv_heads, named):
    with pytest.raises(ValueError, match=named):
        megatron_block_diagram(_block(kv_heads), tp)


@pytest.mark.parametrize("tp", [2, 4])
def test_the_sequence_diagram_reads_the_plan_and_the_shapes(tp):
    d = sequence_parallel_diagram(llama_plans(True)[1], 4, 64, 256, tp)
    text = "\n".join(d.labels)
    assert d.labels.count("all-gather") == 1 and d.labels.count("reduce-scatter") == 1
    assert f"(4, {64 // tp}, 256)" in text and f"(4, 64, {256 // tp})" in text
    assert "attn_norm, mlp_norm:\nSequenceParallel" in d.labels
    assert "o, down" in d.labels and "q, k, v, gate, up" in d.labels
    for rank in range(tp):  # tokens, whole, columns, partial sums, tokens
        assert sum(box[4] == rank_colour(rank) for box in d.boxes) == 5
    assert sum(label.startswith("rank ") for label in d.labels) == tp


def test_the_sequence_diagram_follows_a_changed_plan():
    plan = dict(llama_plans(True)[1])
    del plan["mlp_norm"]
    assert "attn_norm:\nSequenceParallel" in sequence_parallel_diagram(plan, 2, 8, 16, 2).labels


@pytest.mark.parametrize(("args", "named"), [
    ((llama_plans(False)[1], 4, 64, 256, 2), "not sequence-parallel"),
    ((llama_plans(True)[1], 4, 30, 256, 4), "seq=30"),
    ((llama_plans(True)[1], 4, 64, 250, 4), "hidden=250"),
    ((llama_plans(True)[1], 4, 64, 256, 5), "tp=5"),
])
def test_the_sequence_diagram_refuses_what_it_cannot_draw(args, named):
    with pytest.raises(ValueError, match=named):
        sequence_parallel_diagram(*args)
