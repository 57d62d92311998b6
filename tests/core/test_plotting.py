import matplotlib.image as mpimg
import pytest

from helpers.core.plotting import bar_chart


def test_bar_chart_writes_a_real_png(tmp_path):
    path = bar_chart(
        [1.0, 2.0],
        [0.1, 0.3],
        ["Model Parallel", "Single device"],
        tmp_path / "sub" / "chart.png",
        ylabel="time (s)",
    )
    assert path == tmp_path / "sub" / "chart.png"
    assert path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = mpimg.imread(path)  # decodes
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert [p.name for p in path.parent.iterdir()] == ["chart.png"]  # no temporary left


def test_bar_chart_rejects_mismatched_lengths(tmp_path):
    with pytest.raises(ValueError, match="one length; got 2, 1, 2"):
        bar_chart([1.0, 2.0], [0.1], ["a", "b"], tmp_path / "x.png", ylabel="s")
    assert not (tmp_path / "x.png").exists()


def test_grouped_and_stacked_charts(tmp_path):
    from helpers.core.plotting import grouped_bar_chart, stacked_bar_chart

    grouped = grouped_bar_chart(
        ["p = 1", "p = 2"],
        {"a": ([1, 2], [0.1, 0.2]), "b": ([2, 1], [0, 0])},
        tmp_path / "g.png",
        ylabel="ms",
    )
    stacked = stacked_bar_chart(
        ["p = 1", "p = 2"], {"compute": [1, 2], "comm": [0.5, 1]}, tmp_path / "s.png", ylabel="ms"
    )
    for path in (grouped, stacked):
        assert mpimg.imread(path).ndim == 3
    with pytest.raises(ValueError, match="one mean and one std per group"):
        grouped_bar_chart(["x"], {"a": ([1, 2], [0, 0])}, tmp_path / "bad.png", ylabel="ms")
    with pytest.raises(ValueError, match="one value per bar"):
        stacked_bar_chart(["x"], {"a": [1, 2]}, tmp_path / "bad.png", ylabel="ms")
