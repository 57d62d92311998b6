"""``make bench``'s ``expert_parallel`` section: registered, its choices checked before any
launch, and at a tiny size every layout proven, counted and timed per rank, the balance runs
recorded and their chart saved."""

from __future__ import annotations

import json

import pytest

from course_tools.bench import expert_parallel as bench
from course_tools.bench.__main__ import SECTIONS
from helpers.profiles import PROFILES
from helpers.runs.expert_parallel.balance_runs import MODES

SMOKE = PROFILES["smoke"].expert_parallel
TINY = {"top_k": 2, "hidden": 8, "ffn": 16, "tokens": 8, "repeats": 2, "warmup": 1,
        "a2a_sizes": (256, 2048), "a2a_repeats": 2}


def test_the_section_is_registered_before_memory():
    names = list(SECTIONS)
    assert names.index("context_parallel") < names.index("expert_parallel") < names.index("memory")


@pytest.mark.parametrize("layouts, layer, match", [
    (((2, 4),), {"tokenz": 8}, r"layer keys \['tokenz'\]; valid: \[.*'tokens'"),
    (((1, 4),), None, r"layouts \[\(1, 4\)\]; valid: ep >= 2"),
])
def test_bad_choices_are_refused_before_any_launch(layouts, layer, match, monkeypatch):
    monkeypatch.setattr(bench, "launch", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(ValueError, match=match):
        bench.expert_parallel_section(layouts, layer, balance_steps=1)


@pytest.mark.bench_smoke
@pytest.mark.torchrun
@pytest.mark.slow
def test_the_section_at_a_tiny_size(tmp_path):
    out = bench.expert_parallel_section(((2, 4),), TINY, balance=SMOKE, balance_steps=2,
                                        chart=tmp_path / "balance.png")
    json.dumps(out, allow_nan=False)  # bench.json takes it
    assert out["proven"] and out["bytes_as_predicted"]
    assert out["layer"]["a2a_sizes"] == [256, 2048] and out["layer"]["tokens"] == 8
    (name, layout), = out["layouts"].items()
    assert name == "ep=2, 4 experts" and layout["drops_as_one_device"]
    assert layout["imbalance_ranks"] >= 1 and layout["imbalance_experts"] >= 1
    assert layout["fit"]["sizes_bytes"] == [256, 2048]
    assert [r["rank"] for r in layout["ranks"]] == [0, 1]
    for rank in layout["ranks"]:
        assert rank["all_to_all_bytes"] == rank["predicted_all_to_all_bytes"] > 0
        for call in ("dispatch", "combine"):
            assert rank[call]["mean_ms"] > 0 and rank[call]["std_ms"] >= 0
        assert rank["pass"]["mean_ms"] > 0
    assert set(layout["slowest_rank"]) == {"dispatch", "combine"}
    balance = out["balance"]
    assert list(balance["modes"]) == list(MODES) and balance["seed"] == bench.SEED
    assert balance["experts"] == SMOKE.experts and balance["model"]["hidden"] == SMOKE.model.hidden
    assert all(m["steps"] == 2 for m in balance["modes"].values())
    assert (tmp_path / "balance.png").stat().st_size > 0 and balance["chart"] == "balance.png"
