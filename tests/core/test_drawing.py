"""The pen every diagram uses: a titled canvas, rank colours, a PNG the output area holds."""

from __future__ import annotations

import struct

import pytest

from helpers.core.drawing import MAX_WIDTH_IN, RANK_COLOURS, Diagram, rank_colour


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_a_diagram_is_a_png_no_wider_than_the_output_area():
    d = Diagram(30, 2, "a very wide picture still fits")
    d.box(0, 0, 30, 2, "all of it").arrow((1, 1), (29, 1), "across").text(15, 1.5, "note")
    width, height = _png_size(d._repr_png_())
    assert width <= MAX_WIDTH_IN * 100 and height > 0


def test_the_height_follows_the_canvas_and_the_title_lines():
    one = _png_size(Diagram(8, 2, "one line").png())
    two = _png_size(Diagram(8, 2, "one\ntwo").png())
    tall = _png_size(Diagram(8, 4, "one line").png())
    assert one[0] == two[0] == tall[0]
    assert one[1] < two[1] and one[1] < tall[1]


def test_save_writes_the_same_png(tmp_path):
    d = Diagram(4, 2, "saved")
    assert d.save(tmp_path / "d.png").read_bytes()[:8] == d.png()[:8]


@pytest.mark.parametrize("size", [(0, 1), (1, -1)])
def test_a_canvas_needs_a_positive_size(size):
    with pytest.raises(ValueError, match="positive size"):
        Diagram(*size, "t")


def test_a_diagram_needs_a_title_that_says_something():
    with pytest.raises(ValueError, match="takeaway"):
        Diagram(4, 2, "  ")


def test_rank_colours_are_distinct_and_wrap():
    assert len({rank_colour(r) for r in range(len(RANK_COLOURS))}) == len(RANK_COLOURS)
    assert rank_colour(len(RANK_COLOURS)) == rank_colour(0)
    with pytest.raises(ValueError, match="rank"):
        rank_colour(-1)


def test_a_diagram_records_what_it_drew_for_tests_to_read():
    d = Diagram(6, 2, "recorded")
    d.box(0, 0, 1, 1, "rank 0", colour=rank_colour(0)).arrow((1, 0.5), (2, 0.5), "send")
    d.text(3, 1, "note")
    assert d.labels == ["rank 0", "send", "note"]
    assert d.boxes == [(0, 0, 1, 1, rank_colour(0))] and d.arrows == 1
