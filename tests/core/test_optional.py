import pytest

from helpers.core.optional import require


def test_present_component_is_returned():
    assert require("json", "this test").dumps([1]) == "[1]"


def test_missing_component_names_itself_and_the_fix():
    with pytest.raises(
        ImportError,
        match=r"lesson 05 needs the optional component 'no_such_pkg_x'.*pip install -r requirements.txt",
    ):
        require("no_such_pkg_x", "lesson 05")
