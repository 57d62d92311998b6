"""The pictures of expert parallelism, drawn from the library's own objects.

``dispatch_diagram`` draws one dispatch all-to-all from a real routing: each rank's
(token, slot) rows as blocks coloured by the rank they go to
(:func:`~helpers.expert_parallel.traffic.routing_matrix`), arrows with the rows sent, and
the experts each rank holds (:func:`~helpers.expert_parallel.dispatch.expert_range`) with
the rows each one receives. ``moe_layer_diagram`` draws one MoE layer from a
:class:`~helpers.expert_parallel.moe.MoEShape`: a token routed by a real
:class:`~helpers.expert_parallel.moe.Router` to its ``top_k`` experts, their gate-weighted
sum, and the shared expert if there is one.
"""

from __future__ import annotations

import torch

from helpers.core.drawing import GREY, LIGHT, Diagram, rank_colour
from helpers.expert_parallel.dispatch import expert_range
from helpers.expert_parallel.moe import MoEShape, Router, Routing
from helpers.expert_parallel.traffic import routing_matrix

MAX_EP = 4  # the most ranks a dispatch diagram draws legibly
MAX_EXPERTS = 16  # the most experts either diagram draws legibly


def _check_counts(counts: object, ep: object) -> torch.Tensor:
    if isinstance(ep, bool) or not isinstance(ep, int) or not 2 <= ep <= MAX_EP:
        raise ValueError(f"ep={ep!r}; valid: an integer from 2 to {MAX_EP}")
    if not isinstance(counts, torch.Tensor) or counts.dim() != 2 \
            or counts.dtype.is_floating_point or counts.dtype == torch.bool:
        raise ValueError(f"routing_counts={counts!r}; valid: an integer tensor (ep, experts)")
    ranks, experts = counts.shape
    if ranks != ep:
        raise ValueError(f"routing_counts has {ranks} rows for ep={ep}; valid: one row per rank")
    if experts % ep or not ep <= experts <= MAX_EXPERTS:
        raise ValueError(f"experts={experts} for ep={ep}; valid: a multiple of ep up to "
                         f"{MAX_EXPERTS}")
    if (counts < 0).any() or counts.sum() == 0:
        raise ValueError("routing_counts must be >= 0 with at least one row routed")
    return counts.to(torch.long)


def _most(received: torch.Tensor) -> str:
    """Which ranks receive the most rows, in words."""
    top = int(received.max())
    ranks = [r for r, n in enumerate(received.tolist()) if n == top]
    if len(ranks) == len(received):
        return f"here every rank receives {top}"
    who = f"rank {ranks[0]} receives" if len(ranks) == 1 else \
        f"ranks {', '.join(map(str, ranks))} each receive"
    return f"here {who} the most: {top} of {int(received.sum())} rows"


def dispatch_diagram(routing_counts: torch.Tensor, ep: int) -> Diagram:
    """The dispatch all-to-all of ``routing_counts`` (ep, E): rank ``s``'s rows for expert
    ``e`` in row ``s``, column ``e``; experts split evenly over the ``ep`` ranks."""
    counts = _check_counts(routing_counts, ep)
    experts = counts.shape[1]
    matrix = routing_matrix(counts)
    received = matrix.sum(0)
    row_h, bar_w, width = 1.1, 2.2, 10.0
    height = ep * row_h + 0.6
    title = ("Each rank sends each expert's rows to the rank that holds it; "
             f"the counts change every step\n{_most(received)}")
    d = Diagram(width, height, title)
    d.text(2.3, height - 0.25, "each rank's rows, by destination rank", fontsize=8)
    d.text(8.1, height - 0.25, "the experts each rank holds: rows received", fontsize=8)
    longest = int(matrix.sum(1).max())
    y_of = [height - 0.85 - r * row_h for r in range(ep)]
    for s in range(ep):
        y, x = y_of[s] - 0.25, 1.1
        d.text(1.0, y + 0.25, f"rank {s}", align="right", colour=rank_colour(s), bold=True,
               fontsize=8)
        for dest in range(ep):
            n = int(matrix[s, dest])
            if n:
                w = bar_w * n / longest
                d.box(x, y, w, 0.5, colour=rank_colour(dest), edge="white")
                x += w
        d.text(x + 0.08, y + 0.25, f"{int(matrix[s, s])} stay", fontsize=7, align="left",
               colour=GREY)
    for dest in range(ep):
        ids = expert_range(experts, ep, dest)
        x0, y = 6.5, y_of[dest] - 0.4
        d.box(x0, y, 3.4, 0.8, colour=LIGHT, edge=rank_colour(dest))
        d.text(x0 + 0.1, y + 0.62, f"rank {dest}: receives {int(received[dest])}", fontsize=7,
               align="left", colour=rank_colour(dest), bold=True)
        cell = 3.2 / len(ids)
        for i, e in enumerate(ids):
            d.box(x0 + 0.1 + i * cell, y + 0.08, cell * 0.92, 0.38,
                  f"e{e}: {int(counts[:, e].sum())}", colour=rank_colour(dest),
                  text_colour="white", fontsize=6 if len(ids) > 2 else 7)
    spread = min(0.3, 0.7 / (ep - 1))  # a source's arrows leave a row apart, labelled there
    for s in range(ep):
        for dest in range(ep):
            n = int(matrix[s, dest])
            if s == dest or not n:
                continue
            start = (4.6, y_of[s] + ((ep - 1) / 2 - dest) * spread)
            end = (6.45, y_of[dest] + ((ep - 1) / 2 - s) * 0.1)
            d.arrow(start, end, colour=rank_colour(dest))
            d.text(start[0] - 0.05, start[1], f"{n} rows", fontsize=7, colour=rank_colour(dest),
                   align="right")
    return d


def moe_layer_diagram(shape: MoEShape, seed: int = 0) -> Diagram:
    """One MoE layer of ``shape``: a token, drawn from ``seed``, routed by a
    :class:`Router` of ``shape`` (weights from ``seed``) to its ``top_k`` experts, whose
    outputs are summed weighted by the gates (plus the shared expert)."""
    if not isinstance(shape, MoEShape):
        raise ValueError(f"shape={shape!r}; valid: an MoEShape")
    shape.validate()
    if shape.experts > MAX_EXPERTS:
        raise ValueError(f"experts={shape.experts}; valid: up to {MAX_EXPERTS} to draw")
    routing = routed_token(shape, seed)
    chosen = routing.experts[0].tolist()
    gates = routing.gates[0].tolist()
    k, e = shape.top_k, shape.experts
    per_expert = 3 * shape.hidden * shape.ffn
    active = (k + shape.shared) * per_expert
    total = (e + shape.shared) * per_expert
    row = 0.42 if e <= 8 else 0.34
    low = 0.9 if shape.shared else 0.3  # room for the shared expert below the others
    height = e * row + low + 0.9
    shared = " (and the shared one, which sees every token)" if shape.shared else ""
    title = (f"The router sends each token to {k} of its {e} experts{shared}:\n"
             f"{active:,} of {total:,} expert weights work per token; "
             "the output is their gate-weighted sum")
    d = Diagram(10.0, height, title)
    y_of = [height - 0.7 - i * row for i in range(e)]
    mid = (y_of[0] + y_of[-1]) / 2
    d.box(0.2, mid - 0.35, 1.1, 0.7, "token x", fontsize=8)
    d.box(1.9, mid - 0.35, 1.5, 0.7, f"router\ntop-{k} of {e}", fontsize=8)
    d.arrow((1.3, mid), (1.9, mid))
    for i in range(e):
        on = i in chosen
        d.box(4.6, y_of[i] - row * 0.4, 1.6, row * 0.8, f"expert {i}", fontsize=7,
              colour=rank_colour(0) if on else LIGHT, text_colour="white" if on else GREY,
              edge=rank_colour(0) if on else GREY)
    d.box(7.5, mid - 0.4, 1.4, 0.8, "sum\nΣ g·expert(x)", fontsize=8)
    for slot, (i, g) in enumerate(zip(chosen, gates, strict=True)):
        d.arrow((3.4, mid), (4.6, y_of[i]), colour=rank_colour(0))
        d.arrow((6.2, y_of[i]), (7.5, mid), colour=rank_colour(0))
        d.text(6.25, y_of[i] + row * 0.45, f"g{slot + 1}={g:.2f}", fontsize=7,
               colour=rank_colour(0), align="left")
    d.arrow((8.9, mid), (9.8, mid), "out", fontsize=8)
    if shape.shared:
        d.box(4.6, 0.15, 1.6, 0.5, "shared expert", fontsize=7, colour=rank_colour(1),
              text_colour="white")
        d.arrow((0.75, mid - 0.35), (4.6, 0.4), "every token", colour=rank_colour(1),
                fontsize=7)
        d.arrow((6.2, 0.4), (8.2, mid - 0.4), colour=rank_colour(1))
    if shape.capacity_factor is not None:
        d.text(5.4, height - 0.2, f"capacity factor {shape.capacity_factor:g}: an expert's "
               "extra rows are dropped", fontsize=7, colour=GREY)
    return d


def routed_token(shape: MoEShape, seed: int = 0) -> Routing:
    """The :class:`~helpers.expert_parallel.moe.Routing` of one token drawn from ``seed``
    by a :class:`Router` of ``shape`` whose weights are drawn from ``seed`` (the random
    state of the caller is kept)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        router = Router(shape)
        token = torch.randn(1, shape.hidden)
        with torch.no_grad():
            return router(token)
