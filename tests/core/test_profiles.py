from dataclasses import asdict

import pytest

from helpers import profiles


def test_named_profiles_and_env_var(monkeypatch):
    assert profiles.get_profile("small").name == "small"
    full = profiles.get_profile("full")
    # the source documents' sizes
    r, f = full.resnet, full.ffn
    assert (r.batch, r.image_size, r.batches, full.repeats) == (120, 128, 3, 10)
    assert (f.hidden_size, f.ffn_size, f.seq_len, f.batch_size, f.world_size) == (512, 4096, 512, 8, 4)
    assert f == profiles.SOURCE_FFN
    monkeypatch.setenv(profiles.ENV_VAR, "FULL")
    assert profiles.get_profile().name == "full"


def test_auto_follows_cuda(monkeypatch):
    monkeypatch.setattr(profiles.torch.cuda, "is_available", lambda: True)
    assert profiles.resolve_name("auto") == "full"
    monkeypatch.setattr(profiles.torch.cuda, "is_available", lambda: False)
    assert profiles.resolve_name("auto") == "small"


def _sizes(profile: profiles.Profile) -> dict[str, int]:
    """Every size of a profile, by section and field (``ffn.hidden_size``)."""
    out = {"warmup": profile.warmup, "repeats": profile.repeats}
    for section in ("toy", "resnet", "pipeline", "schedules", "ffn", "wide_ffn", "lm"):
        for k, v in asdict(getattr(profile, section)).items():
            if isinstance(v, dict):  # the small Llama's shape (``LMConfig``)
                out |= {f"{section}.{k}.{n}": x for n, x in v.items() if isinstance(x, int)
                        and not isinstance(x, bool) and x is not None}
            else:
                out[f"{section}.{k}"] = v
    return out


def test_smoke_small_full_grow_everywhere():
    smoke, small, full = (_sizes(profiles.PROFILES[n]) for n in profiles.NAMES)
    assert smoke.keys() == small.keys() == full.keys()
    for key in small:
        assert smoke[key] <= small[key] <= full[key], key


def test_the_profile_variable_cannot_pick_smoke(monkeypatch):
    """smoke is for the tests and gpu-check --smoke; a lesson is never run at it."""
    assert profiles.get_profile("smoke").name == "smoke"
    monkeypatch.setenv(profiles.ENV_VAR, "smoke")
    with pytest.raises(ValueError, match="valid choices: small, full, auto"):
        profiles.get_profile()


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
