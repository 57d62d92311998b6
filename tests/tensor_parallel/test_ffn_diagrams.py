"""The tensor-parallel FFN's pictures draw the shard plan the lessons run, and refuse what
cannot be drawn."""

from __future__ import annotations

import pytest
import torch

from helpers.core.drawing import DPI, rank_colour
from helpers.tensor_parallel.ffn import SPLITS, FeedForward, shard_rows, split_weights
from helpers.tensor_parallel.ffn_diagrams import ffn_split_diagram, torchrun_shards_diagram


def _model(hidden: int = 8, ffn: int = 16) -> FeedForward:
    torch.manual_seed(0)
    return FeedForward(hidden, ffn)


def _rank_boxes(diagram, rank: int) -> list:
    return [b for b in diagram.boxes if b[4] == rank_colour(rank)]


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_the_split_picture_labels_each_ranks_slices_as_the_split_cuts_them(world_size):
    model = _model()
    d = ffn_split_diagram(model, world_size)
    labels = "\n".join(d.labels)
    for rank, (fc1, fc2) in enumerate(split_weights(model, world_size)):
        rows = shard_rows(16, world_size, rank)
        span = f"{rows.start}–{rows.stop - 1}"
        assert f"fc1.weight\nrows {span}\n[{fc1.shape[0]} × {fc1.shape[1]}]" in labels
        assert f"fc2.weight\ncolumns {span}\n[{fc2.shape[0]} × {fc2.shape[1]}]" in labels
        assert f"y{rank}\n[tokens × 8]" in labels
        assert len(_rank_boxes(d, rank)) == 4  # fc1, its output, fc2, the partial output
    assert sum(f"rank {r}" in d.labels for r in range(world_size)) == world_size
    assert f"rank {world_size}" not in d.labels
    assert "all-\nreduce\n(sum)" in d.labels and f"the {world_size}\npartials" in labels
    assert d.arrows == 5 * world_size + 1  # five per rank, into g included; one out of g
    assert "one all-reduce" in d.title
    assert d.figure.get_size_inches()[0] * DPI <= 940


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_torchrun_picture_shows_each_process_loading_its_own_files(world_size):
    d = torchrun_shards_diagram(_model(), world_size)
    for rank in range(world_size):
        files = [s.file(rank) for s in SPLITS]
        assert files == [f"fc1_{rank}.bin", f"fc2_{rank}.bin"]
        assert all(any(label.startswith(f + "\n") for label in d.labels) for f in files)
        assert f"process {rank}\nRANK={rank}" in d.labels
        assert len(_rank_boxes(d, rank)) == 3  # the process and its two files
    assert not any(f"_{world_size}.bin" in label for label in d.labels)
    assert f"torchrun --nproc-per-node={world_size}" in d.labels
    assert sum("all-reduce" in label for label in d.labels) == 1  # one per forward
    assert d.arrows == 4 * world_size
    assert d.figure.get_size_inches()[0] * DPI <= 940


@pytest.mark.parametrize("draw", [ffn_split_diagram, torchrun_shards_diagram])
def test_a_split_that_cannot_be_made_or_drawn_is_refused_by_its_value(draw):
    with pytest.raises(ValueError, match="world_size=3"):
        draw(_model(), 3)  # 16 does not split over 3 ranks
    with pytest.raises(ValueError, match="world_size=16: the picture has room for 1 to 8"):
        draw(_model(ffn=32), 16)
    with pytest.raises(ValueError, match="world_size=0"):
        draw(_model(), 0)


def test_the_pictures_render_as_png():
    for d in (ffn_split_diagram(_model(), 2), torchrun_shards_diagram(_model(), 2)):
        assert d.png().startswith(b"\x89PNG")
