import time

import pytest

from helpers.timing import Timing, measure, relative_difference


def test_statistics():
    t = Timing("x", [1.0, 2.0, 3.0, 10.0])
    assert t.mean == 4.0 and t.median == 2.5
    assert t.std == pytest.approx(4.0824829, rel=1e-6)  # sample std (n - 1)
    assert Timing("one", [2.0]).std == 0.0
    assert "x: 4.0000 s +- 4.0825 s" in str(t)


def test_warmup_is_excluded_and_repeats_counted():
    calls = []

    def fn():
        # the first call is slow, as a cold start would be
        time.sleep(0.05 if not calls else 0.001)
        calls.append(1)

    t = measure(fn, repeats=4, warmup=1, label="f")
    assert len(calls) == 5 and len(t.times) == 4
    assert max(t.times) < 0.04  # the slow first call was not timed


def test_relative_difference():
    assert relative_difference(Timing("a", [1.07]), Timing("b", [1.0])) == pytest.approx(0.07)


@pytest.mark.parametrize("kwargs", [{"repeats": 0}, {"repeats": 2, "warmup": -1}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="valid"):
        measure(lambda: None, **kwargs)
