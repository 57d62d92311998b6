"""The layout search: what it chooses fits, nothing smaller that fits is skipped, its rule's
order holds, bad input is refused, and the published layouts are read consistently; for
mixtures of experts too, beside DeepSeek-V3's and Megatron-LM's Mixtral layouts."""

from __future__ import annotations

import itertools

import pytest

from helpers.composed.layout_search import (
    CARD,
    Candidate,
    describe,
    format_search,
    rule_key,
    search_chart,
    search_key,
    search_layouts,
    valid_tp,
)
from helpers.composed.published_layouts import (
    PUBLISHED,
    PUBLISHED_MOE,
    PublishedLayout,
    cite,
    compare_moe,
    format_moe,
    format_published,
)
from helpers.memory import (
    DEEPSEEK_V3_SHAPE,
    LLAMA_7B_SHAPE,
    LLAMA_70B_SHAPE,
    MIXTRAL_8X7B_SHAPE,
)
from helpers.memory.fits import ClusterLayout, per_gpu
from helpers.memory.ledger import DeviceMemory

SHAPES = {"Llama-7B": LLAMA_7B_SHAPE, "Llama-70B": LLAMA_70B_SHAPE}
GRID = [(m, n) for m in SHAPES for n in (8, 64, 512)]
BATCH = 1024


def brute_force(shape, gpus, recompute=(False, True), card=CARD):
    """Every (tp, pp, zero, recompute) that fits, sized one by one with per_gpu (no search)."""
    found = []
    for tp, pp in itertools.product((1, 2, 4, 8), range(1, gpus + 1)):
        if gpus % (tp * pp) or pp > shape.blocks:
            continue
        dp = gpus // (tp * pp)
        m = BATCH // dp
        if BATCH % dp or m < pp:
            continue
        for zero, r in itertools.product(range(4) if dp > 1 else (0,), recompute):
            layout = ClusterLayout("", tp=tp, pp=pp, dp=dp, zero=zero, recompute=r)
            total = per_gpu(shape, layout, seq=4096, microbatches=m, sequence_parallel=tp > 1).total
            if total <= card:
                found.append((tp, pp, zero, r, total))
    return found


@pytest.mark.parametrize("model, gpus", GRID)
def test_the_chosen_layout_fits_and_no_smaller_model_parallel_degree_is_skipped(model, gpus):
    shape = SHAPES[model]
    chosen = search_layouts(shape, gpus, model=model).chosen
    fits = brute_force(shape, gpus)
    if not fits:
        assert chosen is None and model == "Llama-70B" and gpus == 8
        return
    layout = ClusterLayout("", tp=chosen.tp, pp=chosen.pp, dp=chosen.dp, zero=chosen.zero,
                    recompute=chosen.recompute)
    again = per_gpu(shape, layout, seq=4096, microbatches=chosen.microbatches,
                    sequence_parallel=chosen.tp > 1)
    assert again == chosen.memory and again.total <= CARD
    assert chosen.tp * chosen.pp * chosen.dp == gpus
    fewest = min(tp * pp for tp, pp, *_ in fits)
    assert chosen.model_parallel == fewest
    same = [f for f in fits if f[0] * f[1] == fewest]
    assert chosen.pp == min(f[1] for f in same)  # TP before PP
    best = [f for f in same if f[1] == chosen.pp]
    assert chosen.recompute == all(f[3] for f in best)  # no recomputation if it fits without
    assert chosen.zero == min(f[2] for f in best if f[3] == chosen.recompute)


def test_the_lessons_answers():
    """What lesson 13's prose says: Llama-7B needs no model parallelism (ZeRO-1), Llama-70B
    fits nowhere on 8 GPUs and only with recomputation on 64 without model parallelism."""
    found = {(m, n): search_layouts(SHAPES[m], n, model=m).chosen for m, n in GRID}
    assert all(describe(found["Llama-7B", n]) == f"ZeRO-1 {n}" for n in (8, 64, 512))
    assert found["Llama-70B", 8] is None
    assert describe(found["Llama-70B", 64]) == "FSDP 64 + recompute"
    assert describe(found["Llama-70B", 512]) == "FSDP 512 + recompute"
    without = search_layouts(LLAMA_70B_SHAPE, 64, recompute=(False,)).chosen
    assert (without.tp, without.pp) == (2, 1)
    # without ZeRO-3 (data parallelism closer to Narayanan et al.'s) Llama-70B needs TP
    plain = {n: search_layouts(LLAMA_70B_SHAPE, n, zero=(0, 1, 2)).chosen for n in (64, 512)}
    assert describe(plain[64]) == "TP 4 x ZeRO-1 16 + recompute"
    assert describe(plain[512]) == "TP 2 x ZeRO-2 256 + recompute"


def test_tensor_parallelism_comes_before_pipeline_stages_at_equal_degree():
    # a card between PP 2 x FSDP 32 and FSDP 64 (both without recomputation): tp x pp = 2
    # is the fewest that fits, and both TP 2 and PP 2 do; the rule takes TP 2
    card = int(130.8 * 2**30)
    fits = brute_force(LLAMA_70B_SHAPE, 64, recompute=(False,), card=card)
    assert {(tp, pp) for tp, pp, *_ in fits if tp * pp == 2} == {(2, 1), (1, 2)}
    chosen = search_layouts(LLAMA_70B_SHAPE, 64, recompute=(False,), gpu_bytes=card).chosen
    assert (chosen.tp, chosen.pp) == (2, 1)


def _candidate(tp=1, pp=1, dp=1, zero=0, recompute=False, m=8):
    layout = ClusterLayout("", tp=tp, pp=pp, dp=dp, zero=zero, recompute=recompute)
    return Candidate(layout, m, DeviceMemory())


def test_the_bubble_is_1f1bs():
    assert _candidate(pp=4, m=8).bubble == pytest.approx(3 / 11)
    assert _candidate(pp=16, m=16).bubble == pytest.approx(15 / 31)
    assert _candidate(pp=1, m=8).bubble == 0
    for c in search_layouts(LLAMA_70B_SHAPE, 64).tried:
        assert c.bubble == pytest.approx((c.pp - 1) / (c.microbatches + c.pp - 1))
        assert c.microbatches == BATCH // c.dp
        assert c.microbatches >= c.pp  # 1F1B needs a micro-batch per stage (Schedule1F1B)


def test_the_rules_order():
    ranked = sorted([_candidate(tp=8, pp=2), _candidate(pp=2, recompute=True),
                     _candidate(tp=2, zero=3, dp=2), _candidate(tp=2, zero=1, dp=2),
                     _candidate(tp=2, recompute=True, dp=2), _candidate(pp=2)], key=rule_key)
    assert [(c.tp, c.pp, c.recompute, c.zero) for c in ranked] == [
        (2, 1, False, 1), (2, 1, False, 3), (2, 1, True, 0), (1, 2, False, 0),
        (1, 2, True, 0), (8, 2, False, 0)]


@pytest.mark.parametrize("kwargs, words", [
    ({"tp": (3,)}, "tp=3; valid for this model on 64 GPUs: [1, 2, 4, 8]"),
    ({"tp": (16,)}, "tp=16; valid"),
    ({"gpus": 0}, "gpus=0; valid: an integer >= 1"),
    ({"seq": 4096.0}, "seq=4096.0; valid: an integer >= 1"),
    ({"micro_batch": 3}, "valid micro_batch: [1, 2, 4, 8"),
    ({"zero": (4,)}, "zero=4; valid choices: 0, 1, 2, 3"),
    ({"recompute": ("yes",)}, "recompute='yes'; valid choices: True, False"),
    ({"global_batch": 3, "tp": (1,)}, "no layout of 64 GPUs runs a global batch of 3"),
])
def test_bad_input_is_refused_with_the_valid_choices(kwargs, words):
    kwargs = {"gpus": 64, **kwargs}
    with pytest.raises(ValueError) as error:
        search_layouts(LLAMA_70B_SHAPE, kwargs.pop("gpus"), **kwargs)
    assert words in str(error.value)


def test_valid_tp_divides_the_heads_kv_heads_and_mlp():
    assert valid_tp(LLAMA_70B_SHAPE) == [1, 2, 4, 8]
    assert valid_tp(LLAMA_7B_SHAPE) == [1, 2, 4, 8]  # 32 heads, but 8 GPUs per node
    assert valid_tp(LLAMA_7B_SHAPE, per_node=4) == [1, 2, 4]
    from helpers.memory import TransformerShape

    assert valid_tp(TransformerShape(hidden=96, blocks=2, heads=6, ffn=96, vocab=10)) == [1, 2]
    with pytest.raises(ValueError, match="shape='70B'; valid: a TransformerShape"):
        search_layouts("70B", 64)


def test_sequence_parallelism_splits_activations_only_with_tp():
    tp8, tp1 = ClusterLayout("", tp=8), ClusterLayout("")
    assert (per_gpu(LLAMA_70B_SHAPE, tp8, seq=4096, sequence_parallel=True).activations
            < per_gpu(LLAMA_70B_SHAPE, tp8, seq=4096).activations)
    assert (per_gpu(LLAMA_70B_SHAPE, tp1, seq=4096, sequence_parallel=True)
            == per_gpu(LLAMA_70B_SHAPE, tp1, seq=4096))


def test_the_table_and_the_chart(tmp_path):
    searches = [search_layouts(SHAPES[m], n, model=m) for m, n in GRID]
    text = format_search(searches)
    assert len(text.splitlines()) == 1 + len(GRID)
    assert "none; closest TP 8 + recompute" in text and "FSDP 64 + recompute" in text
    assert max(map(len, text.splitlines())) <= 100  # fits a notebook's output area
    path = search_chart(searches, tmp_path / "search.png", title="t")
    assert path.read_bytes().startswith(b"\x89PNG")
    assert int.from_bytes(path.read_bytes()[16:20], "big") <= 950  # JupyterLab's output width
    with pytest.raises(ValueError, match="valid: a non-empty list"):
        search_chart([], tmp_path / "none.png")


def test_published_layouts_are_consistent_and_pinned():
    for row in PUBLISHED:
        assert row.tp * row.cp * row.pp * row.dp == row.gpus
        assert row.url.startswith(("https://github.com/pytorch/torchtitan/blob/",
                                   "https://arxiv.org/abs/"))
        if "github.com" in row.url:
            assert len(row.url.split("/blob/")[1].split("/")[0]) == 40  # a commit, not a branch
    paper = [r for r in PUBLISHED if "2407.21783" in r.url]
    assert all(r.global_batch * r.seq == 2**24 for r in paper)  # Table 4's "16M" tokens
    text = format_published()
    assert all(cite(r.url) in text for r in PUBLISHED) and max(map(len, text.splitlines())) <= 100
    assert cite(PUBLISHED[0].url) == "pytorch/torchtitan@157a12c docs/performance.md"
    with pytest.raises(ValueError, match="not the 64 GPUs it states"):
        PublishedLayout("x", "u", "m", "h", 64, tp=8, pp=2, dp=2, sharding="FSDP", recompute="")
    with pytest.raises(ValueError, match="per_dp \\* dp == global_batch"):
        PublishedLayout("x", "u", "m", "h", 8, tp=1, pp=1, dp=8, sharding="FSDP",
                        recompute="", per_dp=2, global_batch=15)


def test_published_llama2_70b_layouts_fit_by_the_estimate():
    same = [r for r in PUBLISHED if r.course_shape == "LLAMA_70B_SHAPE"]
    assert len(same) == 2
    for r in same:
        layout = ClusterLayout("", tp=r.tp, pp=r.pp, dp=r.dp, zero=3, recompute=r.recompute == "full")
        total = per_gpu(LLAMA_70B_SHAPE, layout, seq=r.seq, micro_batch=r.per_dp,
                        microbatches=1, sequence_parallel=r.tp > 1).total
        assert total <= CARD, (r.source, total / 2**30)


def test_the_search_of_a_mixture_of_experts_takes_the_smallest_ep_that_fits():
    """Mixtral 8x7B on 64 GPUs, 256 sequences per step (Megatron-LM's reference): every
    fitting layout checked one by one; the rule's choice, then the smallest ep."""
    search = search_layouts(MIXTRAL_8X7B_SHAPE, 64, global_batch=256)
    fits = []
    for tp, pp, zero, r, ep in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16, 32), range(4),
                                                 (False, True), (1, 2, 4, 8)):
        dp = 64 // (tp * pp)
        if 64 % (tp * pp) or 256 % dp or 256 // dp < pp or dp % ep or (dp == 1 and zero):
            continue
        layout = ClusterLayout("", tp=tp, pp=pp, dp=dp, zero=zero, recompute=r, ep=ep)
        if per_gpu(MIXTRAL_8X7B_SHAPE, layout, seq=4096, microbatches=256 // dp,
                   sequence_parallel=tp > 1).total <= CARD:
            fits.append((tp * pp, pp, r, zero, ep))
    assert len(fits) == len(search.fitting)
    chosen = search.chosen
    assert (chosen.model_parallel, chosen.pp, chosen.recompute, chosen.zero,
            chosen.layout.ep) == min(fits)
    assert describe(chosen) == "ZeRO-1 64 (EP 8)"
    assert [search_key(c) for c in search.fitting] == sorted(map(search_key, search.fitting))
    assert all(search_key(c) == (*rule_key(c), 1) for c in search_layouts(LLAMA_7B_SHAPE, 8).tried)


def test_the_moe_comparisons_against_the_published_layouts():
    """DeepSeek-V3: 15360 sequences do not split over 2048 data-parallel ranks, so the rule
    needs tp x pp = 2 and takes TP 2 (PP 2 without TP); its published layout fits only with
    every block recomputed. Megatron-LM's Mixtral layout fits as it is, with a pipeline the
    rule does not need."""
    deepseek, mixtral = (compare_moe(p) for p in PUBLISHED_MOE)
    assert describe(deepseek.search.chosen) == "TP 2 x ZeRO-1 1024 (EP 32) + recompute"
    assert describe(deepseek.no_tp.chosen) == "PP 2 x ZeRO-1 1024 (EP 64) + recompute"
    assert not any(c.model_parallel == 1 for c in deepseek.search.tried)
    assert [c.memory.total <= CARD for c in deepseek.sized] == [False, True]
    assert [describe(c) for c in deepseek.sized] == ["PP 16 x ZeRO-1 128 (EP 64)",
                                                     "PP 16 x ZeRO-1 128 (EP 64) + recompute"]
    assert mixtral.no_tp is None and describe(mixtral.search.chosen) == "ZeRO-1 64 (EP 8)"
    assert all(c.memory.total <= CARD for c in mixtral.sized)
    assert mixtral.sized[0].microbatches == 16 and mixtral.sized[0].layout.ep == 8
    text = format_moe([deepseek, mixtral])
    assert max(map(len, text.splitlines())) <= 100
    assert "514 of 1384 layouts fit" in text and "183.09 GiB  no" in text
    with pytest.raises(ValueError, match="course_shape='LLAMA_70B_SHAPE'; valid: one of"):
        compare_moe(PUBLISHED[0])


def test_published_moe_layouts_are_consistent_and_pinned():
    for row in PUBLISHED_MOE:
        assert row.tp * row.cp * row.pp * row.dp == row.gpus and row.dp % row.ep == 0
        assert row.per_dp * row.dp == row.global_batch
        assert row.url.startswith(("https://github.com/", "https://arxiv.org/abs/"))
        if "github.com" in row.url:
            assert len(row.url.split("/blob/")[1].split("/")[0]) == 40
    assert [r.layout() for r in PUBLISHED_MOE] == ["PP 16 x ZeRO-1 128 (EP 64)",
                                                   "PP 4 x ZeRO-1 16 (EP 8)"]
    assert "not published" in PUBLISHED_MOE[1].note  # Mixtral's own layout
    text = format_published(PUBLISHED_MOE)
    assert "180K H800 GPU hours per trillion tokens" in PUBLISHED_MOE[0].note
    assert all(cite(r.url) in text for r in PUBLISHED_MOE)
    assert max(map(len, text.splitlines())) <= 100
    with pytest.raises(ValueError, match="ep=3 does not divide dp=8; valid: a divisor of dp"):
        PublishedLayout("x", "u", "m", "h", 8, tp=1, pp=1, dp=8, ep=3, sharding="FSDP",
                        recompute="")


@pytest.mark.parametrize("shape, kwargs, words", [
    (MIXTRAL_8X7B_SHAPE, {"ep": (3,)}, "ep=3; valid for this model: [1, 2, 4, 8]"),
    (LLAMA_70B_SHAPE, {"ep": (2,)}, "ep=2; valid for this model: [1]"),
    (DEEPSEEK_V3_SHAPE, {"tp": (3,)}, "tp=3; valid for this model on 64 GPUs: [1, 2, 4, 8]"),
])
def test_bad_moe_search_input_is_refused_with_the_valid_choices(shape, kwargs, words):
    with pytest.raises(ValueError) as error:
        search_layouts(shape, 64, **kwargs)
    assert words in str(error.value)
