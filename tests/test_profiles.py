import pytest

from helpers.core import profiles


def test_named_profiles_and_env_var(monkeypatch):
    assert profiles.get_profile("small").name == "small"
    full = profiles.get_profile("full")
    # the source documents' sizes
    assert (full.resnet_batch, full.image_size, full.num_batches, full.repeats) == (120, 128, 3, 10)
    assert (full.hidden_size, full.ffn_size, full.seq_len, full.ffn_batch, full.world_size) == (
        512,
        4096,
        512,
        8,
        4,
    )
    monkeypatch.setenv(profiles.ENV_VAR, "FULL")
    assert profiles.get_profile().name == "full"


def test_auto_follows_cuda(monkeypatch):
    monkeypatch.setattr(profiles.torch.cuda, "is_available", lambda: True)
    assert profiles.resolve_name("auto") == "full"
    monkeypatch.setattr(profiles.torch.cuda, "is_available", lambda: False)
    assert profiles.resolve_name("auto") == "small"


def test_small_is_smaller_everywhere():
    small, full = profiles.PROFILES["small"], profiles.PROFILES["full"]
    for field in ("resnet_batch", "image_size", "repeats", "hidden_size", "ffn_size", "seq_len"):
        assert getattr(small, field) <= getattr(full, field), field


@pytest.mark.parametrize("bad", ["large", "", "smal"])
def test_unknown_profile_names_the_value_and_choices(monkeypatch, bad):
    monkeypatch.setenv(profiles.ENV_VAR, bad)
    with pytest.raises(ValueError, match=rf"unknown profile '{bad}'.*small, full, auto"):
        profiles.get_profile()


def test_a_mistyped_profile_given_to_the_runner_is_one_line(monkeypatch, capsys):
    """`TUTORIAL_PROFILE=smal make run` ends with the bad value and the choices, no traceback."""
    from course_tools import run_notebooks

    monkeypatch.setenv("TUTORIAL_PROFILE", "smal")
    monkeypatch.setenv("TUTORIAL_PROGRESS", "final")  # main sets it; restored after the test
    with pytest.raises(SystemExit) as stop:
        run_notebooks.main([])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "unknown profile 'smal'" in err and "valid choices: small, full, auto" in err
    assert "Traceback" not in err
