"""Lesson 10's diagrams draw what the run uses: the mesh's groups are PyTorch's, and the piece
of a weight a rank is drawn holding is the piece the ledger predicts it holds."""

from __future__ import annotations

import re
import struct

import pytest
import torch

from helpers.composed.diagrams import mesh_diagram, weight_diagram
from helpers.composed.layout import DIMS, Layout
from helpers.composed.ledger import _pieces
from helpers.core.drawing import rank_colour
from helpers.exercises.mesh_groups import torch_groups
from helpers.profiles import get_profile
from helpers.runs.llama_3d.config import THREE_D, WITH_CP, SuiteConfig

LAYOUTS = [THREE_D, Layout(pp=2, dp=1, tp=4), Layout(pp=4, dp=2, tp=1), Layout(dp=2, tp=2)]


def suite() -> SuiteConfig:
    return SuiteConfig.for_profile(get_profile("small"))


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_the_layouts_groups_are_the_ones_pytorchs_device_mesh_forms(layout):
    want = torch_groups(layout.pp, layout.dp, layout.tp)
    assert {d: sorted(layout.groups(d)) for d in ("pp", "dp", "tp")} == want
    assert layout.groups("cp") == [[r] for r in range(layout.world_size)]  # cp = 1
    assert torch.equal(layout.grid(), torch.arange(layout.world_size).view(
        layout.pp, layout.dp, 1, layout.tp))
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        assert layout.grid()[c["pp"], c["dp"], c["cp"], c["tp"]].item() == rank


@pytest.mark.parametrize("layout", [WITH_CP, Layout(dp=2, cp=2, tp=2), Layout(pp=2, dp=2, cp=2)],
                         ids=str)
def test_a_mesh_with_cp_forms_pytorchs_four_dimensional_groups(layout):
    from torch.distributed.device_mesh import init_device_mesh

    from helpers.exercises.mesh_groups import _fake_rank

    found: dict[str, set] = {d: set() for d in DIMS}
    for rank in range(layout.world_size):
        with _fake_rank(rank, layout.world_size):
            mesh = init_device_mesh("cpu", tuple(getattr(layout, d) for d in DIMS),
                                    mesh_dim_names=DIMS)
            for d in DIMS:
                found[d].add(tuple(mesh[d].mesh.tolist()))
    assert {d: sorted(layout.groups(d)) for d in DIMS} == {
        d: [list(g) for g in sorted(found[d])] for d in DIMS}
    drawn = mesh_diagram(layout)
    assert len(drawn.boxes) == 4 * layout.world_size  # a row for cp too
    assert "cp groups" in drawn.title


def test_bad_mesh_input_is_refused_by_name():
    with pytest.raises(ValueError, match="3 ranks for a mesh of 8"):
        THREE_D.grid([0, 1, 2])
    with pytest.raises(ValueError, match="dim='ep'; valid: pp, dp, cp, tp"):
        THREE_D.groups("ep")
    with pytest.raises(ValueError, match="rank=8; valid: 0 .. 7"):
        THREE_D.coords(8)
    with pytest.raises(ValueError, match="a mesh of 1 ranks"):
        mesh_diagram(Layout())
    with pytest.raises(ValueError, match="32 ranks.*valid: 2 to 16"):
        mesh_diagram(Layout(pp=4, dp=4, tp=2))


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_the_mesh_diagram_colours_each_group_once_per_dimension(layout):
    drawn = mesh_diagram(layout)
    world = layout.world_size
    assert len(drawn.boxes) == 3 * world  # one box per rank, in a row per dimension
    for row, dim in enumerate(("tp", "dp", "pp")):
        boxes = drawn.boxes[row * world:(row + 1) * world]
        colour = {}
        for g, members in enumerate(layout.groups(dim)):
            for rank in members:
                colour[rank] = rank_colour(g)
        # the boxes are drawn group by group: each carries its group's colour, at its rank's x
        by_x = sorted(boxes)
        assert [b[4] for b in by_x] == [colour[r] for r in range(world)]
        text = "  ".join("{" + ", ".join(map(str, m)) + "}" for m in layout.groups(dim))
        assert text in drawn.labels
    said = drawn.title.split("pp groups ")[1]
    assert said == (f"ranks {layout.tp * layout.dp} apart" if layout.pp > 1 else "one rank each")


@pytest.mark.parametrize("layout", [THREE_D, Layout(pp=2, tp=2), Layout(dp=2, pp=2)], ids=str)
@pytest.mark.parametrize("name", ["mlp.down_proj.weight", "attn.q_proj.weight", "head.weight",
                                  "embed.weight"])
def test_the_weight_diagram_draws_the_piece_the_ledger_predicts(layout, name):
    config = suite().trainer(layout)
    for rank in sorted({0, 3, layout.world_size - 1}):  # stage 0 and the last; tp and dp > 0
        stage = layout.coords(rank)["pp"]
        held = {n: h for n, h, _ in _pieces(config, stage)}
        block = next((n for n in held if n.startswith("blocks.")), "").split(".")[1]
        full = name if name in ("head.weight", "embed.weight") else f"blocks.{block}.{name}"
        if full not in held:
            with pytest.raises(ValueError, match=re.escape(f"name={full!r}")):
                weight_diagram(config, rank, full)
            continue
        drawn = weight_diagram(config, rank, full)
        count = next(lb for lb in drawn.labels if lb.startswith("holds "))
        assert count.endswith(f"= {held[full]:,} elements"), (rank, full, count)
        parts = len([lb for lb in drawn.labels if lb.startswith("block ")]) + 2
        model, pieces = drawn.boxes[:parts], drawn.boxes[parts:]
        ours = [b for b in model if b[4] == rank_colour(rank)]
        assert len(ours) == config.model.blocks // layout.pp + (2 if layout.pp == 1 else 1)
        mine = [b for b in pieces if b[4] == rank_colour(rank)]
        assert len(mine) == 1  # one piece of the weight: its share of the drawn area is held's
        share = mine[0][2] * mine[0][3] / sum(b[2] * b[3] for b in pieces)
        assert share == pytest.approx(held[full] / _numel(config, full))


def _numel(config, name: str) -> int:
    from helpers.models.llama import build_lm

    return build_lm(config.model, seed=config.seed).get_parameter(name).numel()


def test_a_weight_the_rank_does_not_hold_is_refused_naming_the_valid_ones():
    config = suite().trainer(THREE_D)
    with pytest.raises(ValueError, match=r"blocks.3.mlp.up_proj.weight.*stage 0; valid: "
                                         r"embed.weight, blocks.0"):
        weight_diagram(config, 0, "blocks.3.mlp.up_proj.weight")
    with pytest.raises(ValueError, match="no 2-D weight"):
        weight_diagram(config, 0, "blocks.0.attn_norm.weight")


def test_the_diagrams_fit_the_output_area_and_state_their_takeaway():
    config = suite().trainer(THREE_D)
    for drawn in (mesh_diagram(THREE_D),
                  weight_diagram(config, 3, "blocks.0.mlp.down_proj.weight")):
        png = drawn.png()
        assert struct.unpack(">I", png[16:20])[0] <= 940
        assert ":" in drawn.title or ";" in drawn.title  # a sentence, not settings
    assert "1/4" in weight_diagram(config, 3, "blocks.0.mlp.down_proj.weight").title
