"""``make gpu-check``: the budget rule, failures kept, the report, and the CPU rehearsal."""

import ast
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from course_tools.gpu_check.catalog import STEPS
from course_tools.gpu_check.cli import main
from course_tools.gpu_check.context import Step, StepSkipped
from course_tools.gpu_check.report import report_writer
from course_tools.gpu_check.runner import run_steps

ROOT = Path(__file__).resolve().parents[2]


def gpu_check(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "course_tools.gpu_check", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_steps_past_the_budget_are_skipped_with_reason_budget():
    now = [0.0]
    ran = []

    def execute(step, fig):
        ran.append(step.name)
        fig["measured"] = 1.0
        now[0] += 10.0

    steps = [Step("a", "fits", 10, 10), Step("b", "too long", 100, 100), Step("c", "short", 1, 1)]
    records = run_steps(steps, execute, budget=50, clock=lambda: now[0])
    assert ran == ["a"]  # once one step does not fit, no later step starts
    assert [(r["name"], r["status"], r.get("reason")) for r in records] == [
        ("a", "ok", None),
        ("b", "skipped", "budget"),
        ("c", "skipped", "budget"),
    ]
    assert records[0]["figures"] == {"measured": 1.0} and records[0]["seconds"] == 10.0


def test_smoke_estimates_are_used_in_smoke_mode():
    steps = [Step("a", "slow on a GPU, quick in smoke", 1000, 1)]
    records = run_steps(steps, lambda step, fig: None, budget=5, smoke=True)
    assert records[0]["status"] == "ok" and records[0]["estimate_s"] == 1


def test_a_failing_step_is_recorded_and_the_rest_still_run():
    def execute(step, fig):
        fig["before"] = step.name
        if step.name == "bad":
            raise RuntimeError("boom")
        if step.name == "absent":
            raise StepSkipped("helpers.memory not present")

    steps = [Step(n, n, 1, 1) for n in ("bad", "absent", "good")]
    bad, absent, good = run_steps(steps, execute, budget=100)
    assert bad["status"] == "failed" and bad["figures"] == {"before": "bad"}
    assert bad["error"]["type"] == "RuntimeError" and bad["error"]["message"] == "boom"
    assert any("boom" in line for line in bad["error"]["traceback"])
    assert (absent["status"], absent["reason"]) == ("skipped", "helpers.memory not present")
    assert good["status"] == "ok"


def test_report_is_rewritten_after_every_step(tmp_path):
    doc = {
        "mode": "smoke",
        "command": "x",
        "budget_s": 9.0,
        "started": "now",
        "finished": False,
        "machine": {"description": "a test"},
    }
    write = report_writer(tmp_path / "r.json", tmp_path / "r.md", doc)
    seen = []

    def execute(step, fig):
        seen.append(json.loads((tmp_path / "r.json").read_text())["running"])
        fig["rows"] = [{"size_mb": 1, "gb_s": 2.5}]

    run_steps(
        [Step("one", "first", 1, 1), Step("two", "second", 1, 1)], execute, budget=100, report=write
    )
    assert seen == ["one", "two"]
    saved = json.loads((tmp_path / "r.json").read_text())
    assert [s["status"] for s in saved["steps"]] == ["ok", "ok"] and saved["running"] is None
    md = (tmp_path / "r.md").read_text()
    assert "| one | ok |" in md and "size_mb: 1, gb_s: 2.5" in md


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_bad_budget_is_a_clear_argparse_error(value, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--budget", value])
    assert info.value.code == 2
    assert "--budget" in capsys.readouterr().err


def test_every_step_has_its_function_and_smoke_launches_k2_only():
    from course_tools.gpu_check.catalog import step_functions
    from course_tools.gpu_check.context import FULL, SMOKE
    from course_tools.gpu_check.steps_pipeline import skip_reason

    assert list(step_functions()) == [s.name for s in STEPS]
    assert STEPS[-1].name == "composed"  # lesson 13, the last lesson
    names = [s.name for s in STEPS]  # lessons 10, 11 and 12 in order, just before it
    assert names[-4:] == ["context_parallel", "expert_parallel", "debugging", "composed"]
    assert skip_reason(4, 2, FULL.cpu_stages).startswith("2 CPU core(s)")  # cores come first
    assert skip_reason(4, 8, FULL.cpu_stages) is None
    assert "--smoke" in skip_reason(4, 8, SMOKE.cpu_stages)
    assert skip_reason(2, 2, SMOKE.cpu_stages) is None


def test_help_describes_every_step_and_the_budget():
    result = gpu_check("--help", timeout=120)
    assert result.returncode == 0, result.stderr
    for step in STEPS:
        assert step.name in result.stdout
    assert "--budget" in result.stdout and "'budget'" in result.stdout


def gpu_check_imports() -> list[str]:
    """course_tools.gpu_check's modules and every helpers module they import, inside steps too."""
    names = {"course_tools.gpu_check"}
    for path in sorted((ROOT / "course_tools" / "gpu_check").glob("*.py")):
        if path.stem != "__main__":  # it runs the check when imported
            names.add(f"course_tools.gpu_check.{path.stem}".removesuffix(".__init__"))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("helpers."):
                names.add(node.module)
    return sorted(names)


@pytest.mark.slow  # a subprocess that starts Python with torch (or a notebook)
def test_importing_the_runner_imports_no_notebook_machinery():
    modules = gpu_check_imports()
    assert "helpers.runs.tp_ffn.shard_files" in modules and "course_tools.gpu_check.runner" in modules
    assert "helpers.runs.data_parallel.results" in modules
    assert "helpers.runs.tp_llama.results" in modules
    code = (
        f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; "
        "bad = {'IPython', 'nbformat', 'nbclient', 'torchsummary'} & set(sys.modules); "
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.torchrun
@pytest.mark.slow
@pytest.mark.gpu_smoke
def test_smoke_run_passes_every_step(tmp_path):
    """The GPU check's code paths rehearsed on the CPU at the smoke profile's sizes. Its own
    CI step (`make test-gpu-smoke`), not part of `make test`: it proves nothing the lessons
    do not, and a contributor's `make test` need not pay for it."""
    result = gpu_check("--smoke", "--out", str(tmp_path), "--budget", "3000", timeout=900)
    report = tmp_path / "gpu_check_smoke.json"
    assert report.exists(), (result.stdout[-3000:], result.stderr[-3000:])
    doc = json.loads(report.read_text())
    assert [s["name"] for s in doc["steps"]] == [s.name for s in STEPS]
    for step in doc["steps"]:
        assert step["status"] in ("ok", "skipped"), (step["name"], step.get("error"))
        assert step["status"] == "ok" or step["reason"], step
    assert doc["finished"] and doc["mode"] == "smoke" and doc["machine"]["cpu_cores"] >= 1
    md = (tmp_path / "gpu_check_smoke.md").read_text()
    assert all(f"| {s.name} |" in md for s in STEPS)
    assert (tmp_path / "gpu_check_smoke" / "mp_vs_rn.png").stat().st_size > 0
    tp = {s["name"]: s for s in doc["steps"]}["transformer_tp"]["figures"]
    assert tp["world_size"] == 2 and tp["verdicts"]["all"] and tp["native"] == "ok"
    cp = {s["name"]: s for s in doc["steps"]}["context_parallel"]["figures"]
    assert list(cp["runs"]) == ["zigzag", "allgather"] and all(
        r["proven"] and r["bytes_as_predicted"] for r in cp["runs"].values())
    assert cp["runs"]["zigzag"]["native"]["ran"] is False  # no CPU kernel in its ring
    ep = {s["name"]: s for s in doc["steps"]}["expert_parallel"]["figures"]
    assert ep["ep"] == [2] and list(ep["runs"]) == ["ep=2, capacity 1.0, shared"]
    run = ep["runs"]["ep=2, capacity 1.0, shared"]
    assert run["proven"] and run["bytes_as_predicted"] and run["drops_as_one_device"]
    assert all(r["all_to_all_bytes"] == r["predicted_all_to_all_bytes"] > 0
               for r in run["ranks"])
    assert {(c["call"], c["who"]) for c in run["all_to_all"]["calls"]} == {
        (call, who) for call in ("dispatch", "combine")
        for who in ("rank 0", "rank 1", "slowest rank")}
    debugging = {s["name"]: s for s in doc["steps"]}["debugging"]["figures"]
    assert debugging["traced"]["device"] == "cpu" and all(
        p["as_predicted"] for p in debugging["traced"]["plans"])
    assert all(0 <= r["overlap_share"] <= 1 and r["communicating_events"] == r["buckets"]
               for r in debugging["traced"]["ddp"]["overlap"]["ranks"])
    assert 0 < debugging["mfu"]["mfu"] < debugging["mfu"]["hfu"]
    composed = {s["name"]: s for s in doc["steps"]}["composed"]["figures"]
    assert list(composed["runs"]) == ["tp=2"] and composed["runs"]["tp=2"]["ok"]
    assert composed["runs"]["tp=2"]["sent_ok_all_ranks"] and composed["dtype"] == "float64"
    assert not (tmp_path / "gpu_check.json").exists()  # never the real run's file
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_step_without_its_function_is_named(monkeypatch):
    from course_tools.gpu_check import catalog

    monkeypatch.setattr(catalog, "STEPS", (*catalog.STEPS, Step("lesson99", "nothing", 1, 1)))
    with pytest.raises(LookupError, match=r"no step_<name> function for step\(s\) \['lesson99'\]"):
        catalog.step_functions()


def test_the_schedules_step_skips_with_the_reason_on_a_torch_without_its_internals(monkeypatch):
    """The GPU machine's torch may lack the pipelining internals lesson 04 wraps: the step
    records itself skipped, naming what is missing, instead of crashing."""
    from course_tools.gpu_check.context import SMOKE, Context
    from course_tools.gpu_check.steps_pipeline import step_schedules
    from helpers.pipeline import events

    monkeypatch.delattr(events.schedules_module, "_wait_batch_p2p")
    ctx = Context(Path("results"), True, SMOKE, "cpu", {})
    with pytest.raises(StepSkipped, match=r"_wait_batch_p2p.\] not found"):
        step_schedules(ctx, {})


def test_the_data_parallel_ranks_record_a_missing_fsdp_tracker_and_go_on(monkeypatch):
    """The GPU machine's torch may lack FSDPMemTracker (private API): the ranks leave its
    peaks out, say why in the result, and try it only once."""
    from course_tools.gpu_check import steps_data_parallel
    from helpers.runs.data_parallel import worker

    calls = []

    def missing(*args, **kwargs):
        calls.append(args)
        raise ImportError("torch 2.11 lacks fsdp2_mem_tracker.FSDPMemTracker")

    def fake_main(config, rank):
        return [worker.track_fsdp_step("model", "x", "y").own_peaks for _ in range(3)]

    monkeypatch.setattr(worker, "track_fsdp_step", missing)
    monkeypatch.setattr(worker, "main", fake_main)
    result = steps_data_parallel.main("config", "rank 0")
    assert len(calls) == 1
    assert result == steps_data_parallel.GuardedResult(
        [{}, {}, {}], "FSDPMemTracker skipped: ImportError: torch 2.11 lacks "
        "fsdp2_mem_tracker.FSDPMemTracker")


@pytest.mark.torchrun
@pytest.mark.slow
@pytest.mark.gpu_smoke
def test_the_data_parallel_step_at_world_size_one(monkeypatch, tmp_path):
    """One GPU gives one rank: the step still proves every run, records nothing sent, no
    fitted slope, and says why (here on one gloo rank, the same code path)."""
    from course_tools.gpu_check import steps_data_parallel
    from course_tools.gpu_check.context import SMOKE, Context

    monkeypatch.setattr(steps_data_parallel, "dp_world_size", lambda ctx: 1)
    fig = {}
    steps_data_parallel.step_data_parallel(Context(tmp_path, True, SMOKE, "cpu", {}), fig)
    json.dumps(fig, allow_nan=False)  # no infinite bandwidth in the report
    assert fig["world_size"] == 1 and "world size 1" in fig["note"]
    assert fig["proofs"]["ok"] and fig["fsdp_tracker"]["outcome"] == "ok"
    assert all(row["total"] == 0 for row in fig["bytes"]["per_technique"].values())
    assert all(f["bandwidth_gb_s"] is None for f in fig["fits"].values())
    # the prediction is unsharded; the hand ZeRO-2/3 also hold one unit's full buffer
    assert set(fig["ledgers"]["differences"]) <= {"ZeRO-2", "ZeRO-3"}


def test_the_transformer_tp_step_takes_the_largest_tp_the_gpus_and_sizes_allow():
    from course_tools.gpu_check.steps_transformer_tp import largest_tp
    from helpers.profiles import get_profile
    from helpers.runs.tp_llama.config import LlamaTPConfig

    full = LlamaTPConfig.for_profile(get_profile("full"), both=True)
    assert [largest_tp(full, gpus) for gpus in (8, 4, 3, 2, 1)] == [4, 4, 2, 2, 1]
    two_kv = replace(full, model=replace(full.model, kv_heads=2))  # 2 do not split over 4 ranks
    assert largest_tp(two_kv, 8) == 2


def test_the_transformer_tp_step_reruns_without_native_and_says_why(monkeypatch):
    """If PyTorch's parallelize_module or loss_parallel fails inside the ranks the whole
    launch fails: the step launches again without it and records why; a torch lacking the
    API is not launched with it at all."""
    from course_tools.gpu_check import steps_transformer_tp as step
    from helpers.core.errors import LaunchError
    from helpers.runs import contract
    from helpers.runs.tp_llama.config import LlamaTPConfig

    launched = []

    def fake_launch(config, *, nproc, timeout):
        launched.append((config.native, nproc))
        if config.native:
            raise LaunchError("helpers.runs.tp_llama.worker failed (exit code 1) on rank 0"
                              "\n[rank0]: Traceback\n[rank0]: RuntimeError: loss_parallel broke")
        return "result"

    monkeypatch.setattr(contract, "launch", fake_launch)
    config = LlamaTPConfig(both=True, native=True, tp=2, device="cpu")
    result, native = step.launch_with_native(config)
    assert result == "result" and launched == [(True, 2), (False, 2)]
    assert native.startswith("skipped: the launch with native=True failed")
    assert "RuntimeError: loss_parallel broke" in native

    launched.clear()
    monkeypatch.setattr(step, "NATIVE_API", (("torch.distributed.tensor.parallel", "nothing"),))
    result, native = step.launch_with_native(config)
    assert launched == [(False, 2)] and "lacks torch.distributed.tensor.parallel.nothing" in native


@pytest.mark.torchrun
@pytest.mark.slow
@pytest.mark.gpu_smoke
def test_the_transformer_tp_step_at_tp_one(monkeypatch, tmp_path):
    """One GPU gives tp=1: the step still proves both modes against one process, records
    nothing sent and the whole model held, and says why (here on one gloo rank)."""
    from course_tools.gpu_check import steps_transformer_tp as step
    from course_tools.gpu_check.context import SMOKE, Context

    monkeypatch.setattr(step, "SMOKE_RANKS", 1)
    fig = {}
    step.step_transformer_tp(Context(tmp_path, True, SMOKE, "cpu", {}), fig)
    json.dumps(fig, allow_nan=False)
    assert fig["world_size"] == 1 and "tp=1" in fig["note"] and fig["native"] == "not run at tp=1"
    for mode in fig["modes"].values():
        assert all(line.endswith("OK") for line in mode["proofs"].values())
        assert mode["sent_bytes"]["total"]["measured"] == 0 and mode["held_elements"]["match"]
        assert mode["kept_bytes_per_part"]["difference"] == {}  # the hand split at tp=1, exactly
    assert set(fig["timing"]) == {"TP", "TP + SP", "one process"}


def test_the_expert_parallel_step_takes_ep_from_the_gpus():
    """ep 2, 4, 8 as far as the GPUs go; one GPU gives ep 1; the CPU rehearsal ep 2. The
    full run launches each ep and, at the first, the capacity launch; --smoke that only."""
    from course_tools.gpu_check.steps_expert_parallel import configs, ep_sizes

    assert [ep_sizes(g) for g in (0, 1, 2, 3, 4, 7, 8, 16)] == [
        (2,), (1,), (2,), (2,), (2, 4), (2, 4), (2, 4, 8), (2, 4, 8)]
    with pytest.raises(ValueError, match=r"gpus=-1; valid: an integer >= 0"):
        ep_sizes(-1)
    full = configs((2, 4), "cuda", smoke=False)
    assert list(full) == ["ep=2", "ep=4", "ep=2, capacity 1.0, shared"]
    assert [(c.ep, c.device, c.capacity_factor, c.shared) for c in full.values()] == [
        (2, "cuda", None, False), (4, "cuda", None, False), (2, "cuda", 1.0, True)]
    smoke = configs((2,), "cpu", smoke=True)
    assert list(smoke) == ["ep=2, capacity 1.0, shared"]
    for config in (*full.values(), *smoke.values()):
        config.validate(config.ep)  # every size a valid launch


def test_the_expert_parallel_step_skips_with_the_reason_on_a_torch_without_its_api(
        monkeypatch):
    from course_tools.gpu_check import steps_expert_parallel as step
    from course_tools.gpu_check.context import SMOKE, Context

    monkeypatch.setattr(step, "API", (("torch.distributed", "no_such_all_to_all"),))
    with pytest.raises(StepSkipped, match=r"lacks torch.distributed.no_such_all_to_all"):
        step.step_expert_parallel(Context(Path("results"), True, SMOKE, "cpu", {}), {})


@pytest.mark.torchrun
@pytest.mark.slow
@pytest.mark.gpu_smoke
def test_the_expert_parallel_step_at_ep_one(monkeypatch, tmp_path):
    """One GPU gives ep=1: every expert on the one rank, nothing sent and nothing to time,
    the proofs and the drops still against one process, and the note says why (here on one
    gloo rank, the same code path)."""
    from course_tools.gpu_check import steps_expert_parallel as step
    from course_tools.gpu_check.context import SMOKE, Context

    monkeypatch.setattr(step, "ep_sizes", lambda gpus: (1,))
    fig = {}
    step.step_expert_parallel(Context(tmp_path, True, SMOKE, "cpu", {}), fig)
    json.dumps(fig, allow_nan=False)
    assert fig["ep"] == [1] and "ep=1" in fig["note"]
    (run,) = fig["runs"].values()
    assert run["proven"] and run["bytes_as_predicted"] and run["drops_as_one_device"]
    (rank,) = run["ranks"]
    assert rank["experts"] == list(range(step.SMOKE["experts"]))
    assert rank["all_to_all_bytes"] == rank["predicted_all_to_all_bytes"] == 0
    assert "no all-to-all to time" in run["all_to_all"]["note"]
