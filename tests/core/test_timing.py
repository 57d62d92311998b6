import pytest

from helpers.core import timing
from helpers.core.timing import Timing, measure, relative_difference


def test_statistics():
    t = Timing("x", [1.0, 2.0, 3.0, 10.0])
    assert t.mean == 4.0 and t.median == 2.5
    assert t.std == pytest.approx(4.0824829, rel=1e-6)  # sample std (n - 1)
    assert Timing("one", [2.0]).std == 0.0
    assert "x: 4.0000 s +- 4.0825 s" in str(t)


def test_warmup_is_excluded_and_repeats_counted(monkeypatch):
    """A fake clock: the warm-up call costs 100 s, every later one 1 s; only the latter count."""
    now = [0.0]
    monkeypatch.setattr(timing, "synchronized_clock", lambda: now[0])
    calls = []

    def fn():
        now[0] += 100.0 if not calls else 1.0
        calls.append(1)

    t = measure(fn, repeats=4, warmup=1, label="f")
    assert len(calls) == 5 and t.times == [1.0, 1.0, 1.0, 1.0]


def test_as_dict_carries_every_statistic():
    d = Timing("x", [3.0, 1.0, 2.0]).as_dict()
    assert d == {
        "times_s": [3.0, 1.0, 2.0],
        "mean_s": 2.0,
        "std_s": 1.0,
        "min_s": 1.0,
        "max_s": 3.0,
    }


def test_relative_difference():
    assert relative_difference(Timing("a", [1.07]), Timing("b", [1.0])) == pytest.approx(0.07)


@pytest.mark.parametrize("kwargs", [{"repeats": 0}, {"repeats": 2, "warmup": -1}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="valid"):
        measure(lambda: None, **kwargs)


def test_alternating_timing_interleaves_and_excludes_warmup(monkeypatch):
    """A B A B: each round times every function once, in order, after the warm-up rounds."""
    now = [0.0]
    monkeypatch.setattr(timing, "synchronized_clock", lambda: now[0])
    order = []

    def make(name, cost):
        def fn():
            order.append(name)
            now[0] += cost
        return fn

    out = timing.measure_alternating({"a": make("a", 1.0), "b": make("b", 3.0)}, repeats=3, warmup=1)
    assert order == ["a", "b"] * 4
    assert out["a"].times == [1.0] * 3 and out["b"].times == [3.0] * 3
    with pytest.raises(ValueError, match="repeats=0"):
        timing.measure_alternating({"a": make("a", 1.0)}, repeats=0)


def test_within_spread_compares_the_difference_with_both_spreads():
    a, b = Timing("a", [1.0, 1.2]), Timing("b", [1.2, 1.4])
    assert timing.within_spread(a, b)  # |1.1 - 1.3| = 0.2 <= 0.141 + 0.141
    assert not timing.within_spread(a, Timing("c", [1.3, 1.5]))  # 0.3 > 0.283
