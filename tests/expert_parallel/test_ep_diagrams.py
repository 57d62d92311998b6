"""The expert-parallel pictures draw what the library computes: the dispatch's rows per
(source, destination) rank and per expert from ``routing_matrix`` and ``expert_range``, and
the MoE layer's chosen experts and gates from a real ``Router``; bad input is refused."""

from __future__ import annotations

import re
import struct
from collections import Counter

import pytest
import torch

from helpers.core.drawing import LIGHT, MAX_WIDTH_IN, rank_colour
from helpers.expert_parallel.diagrams import dispatch_diagram, moe_layer_diagram
from helpers.expert_parallel.dispatch import expert_range
from helpers.expert_parallel.moe import MoEShape, Router
from helpers.expert_parallel.traffic import routing_matrix

SKEWED = torch.tensor([[7, 1, 4, 12], [3, 9, 2, 2]])


def _width(png: bytes) -> int:
    return struct.unpack(">I", png[16:20])[0]


def _routing_counts(ep: int, experts: int, seed: int) -> torch.Tensor:
    """Each rank's rows per expert from a real top-2 routing of 16 tokens a rank."""
    torch.manual_seed(seed)
    router = Router(MoEShape(hidden=8, ffn=8, experts=experts, top_k=2))
    x = torch.randn(ep, 16, 8) + 0.5  # tokens sharing a direction: an uneven load
    return torch.stack([torch.bincount(router(x[r]).experts.reshape(-1), minlength=experts)
                        for r in range(ep)])


@pytest.mark.parametrize("ep, experts, seed", [(2, 4, 0), (2, 8, 1), (4, 8, 2), (4, 16, 3)])
def test_the_dispatch_draws_the_routing_matrix_and_each_ranks_experts(ep, experts, seed):
    counts = _routing_counts(ep, experts, seed)
    matrix = routing_matrix(counts)
    d = dispatch_diagram(counts, ep)
    off = [int(matrix[s, t]) for s in range(ep) for t in range(ep) if s != t and matrix[s, t]]
    assert d.arrows == len(off)
    assert Counter(label for label in d.labels if label.endswith(" rows")) == \
        Counter(f"{n} rows" for n in off)
    assert [label for label in d.labels if label.endswith(" stay")] == \
        [f"{int(matrix[s, s])} stay" for s in range(ep)]
    assert [label for label in d.labels if ": receives " in label] == \
        [f"rank {r}: receives {int(matrix[:, r].sum())}" for r in range(ep)]
    # each expert drawn in its rank's colour, with the rows it receives from every rank
    drawn = [label for label in d.labels if re.fullmatch(r"e\d+: \d+", label)]
    assert drawn == [f"e{e}: {int(counts[:, e].sum())}" for e in range(experts)]
    owners = [r for r in range(ep) for _ in expert_range(experts, ep, r)]
    expert_boxes = [b for b in d.boxes if b[3] == 0.38]
    assert [b[4] for b in expert_boxes] == [rank_colour(r) for r in owners]
    # each rank's rows: one block per destination it sends to, its width the rows
    blocks = [b for b in d.boxes if b[3] == 0.5]
    longest = int(matrix.sum(1).max())
    want = [(rank_colour(t), 2.2 * int(matrix[s, t]) / longest)
            for s in range(ep) for t in range(ep) if matrix[s, t]]
    assert [(b[4], pytest.approx(b[2])) for b in blocks] == want
    received = matrix.sum(0)
    busiest = [r for r in range(ep) if received[r] == received.max()]
    if len(busiest) == 1:
        assert f"rank {busiest[0]} receives the most: {int(received.max())}" in d.title
    assert _width(d.png()) <= MAX_WIDTH_IN * 100


def test_the_dispatch_of_a_known_routing():
    d = dispatch_diagram(SKEWED, 2)  # experts 0, 1 on rank 0; 2, 3 on rank 1
    assert sorted(label for label in d.labels if label.endswith(" rows")) == ["12 rows",
                                                                              "16 rows"]
    assert "every rank receives 20" in d.title  # 8 + 12 and 16 + 4
    assert "ranks 0, 2 each receive the most: 9 of 26" in dispatch_diagram(
        torch.tensor([[2, 1, 3, 0, 0, 0], [1, 1, 0, 1, 5, 3], [1, 3, 1, 3, 0, 1]]), 3).title


@pytest.mark.parametrize("counts, ep, match", [
    (SKEWED, 1, "ep=1; valid: an integer from 2 to 4"),
    (SKEWED, 5, "ep=5"),
    (SKEWED, True, "ep=True"),
    (SKEWED.float(), 2, "valid: an integer tensor"),
    (SKEWED[0], 2, "valid: an integer tensor"),
    ([[1, 2], [3, 4]], 2, "valid: an integer tensor"),
    (SKEWED, 4, "2 rows for ep=4"),
    (torch.ones(2, 3, dtype=torch.long), 2, "experts=3 for ep=2; valid: a multiple of ep"),
    (torch.ones(2, 18, dtype=torch.long), 2, "up to 16"),
    (-SKEWED, 2, "must be >= 0"),
    (torch.zeros(2, 4, dtype=torch.long), 2, "at least one row"),
])
def test_a_bad_routing_is_refused(counts, ep, match):
    with pytest.raises(ValueError, match=match):
        dispatch_diagram(counts, ep)


@pytest.mark.parametrize("shape", [
    MoEShape(hidden=16, ffn=32, experts=8, top_k=2),
    MoEShape(hidden=16, ffn=32, experts=8, top_k=2, shared=True),
    MoEShape(hidden=32, ffn=16, experts=16, top_k=4, capacity_factor=1.25),
    MoEShape(hidden=8, ffn=8, experts=4, top_k=1, shared=True),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_layer_draws_a_real_routers_choice_and_gates(shape, seed):
    state = torch.random.get_rng_state()
    d = moe_layer_diagram(shape, seed)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's draws are kept
    torch.manual_seed(seed)
    router = Router(shape)
    with torch.no_grad():
        routing = router(torch.randn(1, shape.hidden))
    experts = [b for b in d.boxes if b[2] == 1.6 and b[4] != rank_colour(1)]  # not shared
    assert len(experts) == shape.experts
    lit = [i for i, b in enumerate(experts) if b[4] != LIGHT]
    assert lit == sorted(routing.experts[0].tolist())
    gates = [label for label in d.labels if re.fullmatch(r"g\d=[0-9.]+", label)]
    assert gates == [f"g{s + 1}={g:.2f}" for s, g in enumerate(routing.gates[0].tolist())]
    assert sum(float(g.split("=")[1]) for g in gates) == pytest.approx(1, abs=0.01 * shape.top_k)
    assert ("shared expert" in d.labels) == shape.shared
    assert ("every token" in d.labels) == shape.shared
    per = 3 * shape.hidden * shape.ffn
    assert (f"{(shape.top_k + shape.shared) * per:,} of "
            f"{(shape.experts + shape.shared) * per:,} expert weights") in d.title
    assert any("capacity factor" in label for label in d.labels) == \
        (shape.capacity_factor is not None)
    assert _width(d.png()) <= MAX_WIDTH_IN * 100


@pytest.mark.parametrize("shape, match", [
    ((16, 32, 8, 2), "valid: an MoEShape"),
    (MoEShape(hidden=8, ffn=8, experts=4, top_k=5), "top_k=5; valid: an integer from 1"),
    (MoEShape(hidden=8, ffn=8, experts=32, top_k=2), "experts=32; valid: up to 16"),
])
def test_a_bad_shape_is_refused(shape, match):
    with pytest.raises(ValueError, match=match):
        moe_layer_diagram(shape)
