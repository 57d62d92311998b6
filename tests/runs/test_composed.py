"""The small Llama composed over a (pp, dp, tp) mesh (lesson 13): refusals, the taught loop
without a harness, and launches proving a 3-D layout, its MoE twin (experts over dp), a
checkpoint that reshards and a killed rank against one process.

The verdicts are ``results.LayoutRun``'s (its tolerances are named there); these tests
check that they are reached, and what a verdict alone would not say (which step a run
resumed from, that the weights are identical bit for bit, that nothing is left running).
"""

import shutil
from dataclasses import replace

import pytest

from helpers.composed.checkpoint import check, load_one_process, step_folder
from helpers.composed.layout import Layout
from helpers.core.errors import FolderError
from helpers.runs.contract import launch
from helpers.runs.llama_3d.config import SMALL_LLAMA, THREE_D, SuiteConfig, TrainerConfig
from helpers.runs.llama_3d.digest import fingerprint, parameter_hashes
from helpers.runs.llama_3d.processes import survivors

# a fast model, the same layouts
SMALL = {"model": replace(SMALL_LLAMA, vocab=32, hidden=32, ffn=64), "seq": 8}


def other_model(config: TrainerConfig, **change: object) -> TrainerConfig:
    return replace(config, model=replace(config.model, **change))


@pytest.mark.parametrize(
    ("change", "world", "named"),
    [
        ({"dp": 2, "tp": 2}, 2, ["= 4", "world size is 2"]),
        ({"cp": 2, "tp": 2, "pp": 2}, 4, ["pp x dp x cp x tp = 2 x 1 x 2 x 2 = 8",
                                           "world size is 4"]),
        ({"cp": 3}, 3, ["cp=3", "seq=16", "2 x cp zig-zag chunks", "valid cp: [1, 2, 4, 8]"]),
        ({"cp": 0}, 1, ["cp=0", "an integer >= 1"]),
        ({"pp": 3}, 3, ["pp=3", "valid pp: [1, 2, 4]"]),
        ({"pp": 8}, 8, ["pp=8", "4 blocks"]),
        ({"tp": 3}, 3, ["tp=3", "heads=4"]),
        ({"dp": 3}, 3, ["batch=8", "dp=3"]),
        ({"dp": 2, "microbatches": 3}, 2, ["microbatches=3", "4 sequences"]),
        ({"pp": 2, "microbatches": 1}, 2, ["microbatches=1 < pp=2"]),
        ({"steps": 0}, 1, ["--steps 0"]),
        ({"dtype": "float16"}, 1, ["float16", "float32, float64"]),
        ({"device": "tpu"}, 1, ["tpu", "auto, cpu, cuda"]),
        ({"kill_rank": 1}, 2, ["--kill-rank 1", "both set"]),
        ({"dp": 2, "kill_rank": 1, "kill_step": 1}, 2, ["--resume"]),
        ({"kill_rank": 4, "kill_step": 1, "checkpoint_dir": "x", "resume": True}, 1,
         ["a rank below 1"]),
        ({"experts": 4, "tp": 2}, 2, ["--experts 4 with --dp 1", "valid: --dp 2 or more"]),
        ({"experts": 3, "dp": 2}, 2, ["--experts 3 is not divisible by ep = --dp 2",
                                      "valid --dp: [3]"]),
        ({"experts": 4, "top_k": 5, "dp": 2}, 2, ["--top-k 5", "valid: [1, 2, 4]",
                                                    "at most --experts 4"]),
        ({"experts": 4, "top_k": 0, "dp": 2}, 2, ["--top-k 0", "valid: [1, 2, 4]"]),
        ({"experts": 4, "top_k": 3, "dp": 2}, 2, ["--top-k 3", "dividing ffn=128"]),
        ({"experts": -1}, 1, ["--experts -1", "an integer >= 0"]),
        ({"experts": 4, "dp": 2, "cp": 2}, 4, ["--cp 2", "valid: --cp 1"]),
        ({"experts": 4, "dp": 2, "checkpoint_dir": "x"}, 2, ["--checkpoint-dir", "--experts 0"]),
    ],
)
def test_bad_layouts_are_refused_with_the_valid_choices(change, world, named):
    with pytest.raises(ValueError) as error:
        TrainerConfig(**change).validate(world)
    assert all(part in str(error.value) for part in named), str(error.value)


def test_the_suite_refuses_a_world_that_is_not_8_and_a_late_checkpoint():
    with pytest.raises(ValueError, match="4 ranks; valid: 8"):
        SuiteConfig().validate(4)
    with pytest.raises(ValueError, match="save_step=2; valid: 0 .. 1"):
        SuiteConfig(steps=4, save_step=2).validate(8)
    assert SuiteConfig().ranks() == 8 and TrainerConfig(dp=2, pp=2).ranks() == 4


def test_layout_names_and_flags_round_trip():
    assert str(Layout(2, 2, 2)) == "dp=2 x tp=2 x pp=2" and str(Layout()) == "one device"
    config = TrainerConfig(dp=2, pp=2, reference=True, dtype="float64", kill_rank=1,
                           kill_step=2, checkpoint_dir="d", resume=True)
    assert TrainerConfig.from_args(config.args()) == config
    moe = TrainerConfig.from_args(["--dp", "2", "--tp", "2", "--pp", "2", "--experts", "4",
                                   "--top-k", "1"])
    assert (moe.experts, moe.top_k, moe.name) == (4, 1, "ep=2 x tp=2 x pp=2")
    assert moe.moe.experts == 4 and TrainerConfig().moe is None
    assert [c.name for c in SuiteConfig().configs()][-1] == "ep=2 x tp=2 x pp=2"
    assert all(not c.experts for c in SuiteConfig().configs()[:-1])
    assert len(SuiteConfig(experts=0).configs()) == len(SuiteConfig().configs()) - 1
    suite = SuiteConfig(steps=6, dtype="float32", **SMALL)
    assert SuiteConfig.from_args(suite.args()) == suite
    assert "--model-kv-heads" in suite.args()


def test_the_run_configs_read_the_profile():
    from helpers.profiles import get_profile

    profile = get_profile("smoke")
    suite = SuiteConfig.for_profile(profile)
    assert suite.model == profile.composed.model and suite.steps == profile.composed.steps
    assert suite.dtype == "float64" and suite.trainer(Layout(dp=2)).model == suite.model
    assert TrainerConfig.for_profile(profile, dp=2).batch == profile.composed.batch


def test_the_case_for_tp_innermost_fails_when_tp_sends_more_or_calls_less():
    from types import SimpleNamespace

    from helpers.runs.llama_3d.results import SuiteResult, Traffic

    def rank(calls, ring):
        gloo = {d: 2.0 * b for d, b in ring.items()}
        return SimpleNamespace(traffic=Traffic(calls, ring, gloo, {}, None))

    full = rank({"tp": 40, "dp": 6, "pp": 3}, {"tp": 290.0, "dp": 306.0, "pp": 16.0})
    three_d = SimpleNamespace(ranks=[full], layout=THREE_D, experts=0)
    order = SuiteResult.mesh_order(SimpleNamespace(runs=[three_d]))
    assert order.ok and str(order).endswith("tp sends 18 x the bytes of pp")
    tp_heavier = rank({"tp": 40, "dp": 6}, {"tp": 400.0, "dp": 306.0})
    fewer_calls = rank({"tp": 4, "dp": 6}, {"tp": 290.0, "dp": 306.0})
    for planted in (tp_heavier, fewer_calls):
        runs = [SimpleNamespace(ranks=[planted], layout=Layout(dp=2, tp=2), experts=0), three_d]
        assert not SuiteResult.mesh_order(SimpleNamespace(runs=runs)).ok
    # the MoE layout's all-to-alls make dp the busier dimension: its case is told apart
    moe = SimpleNamespace(ranks=[fewer_calls], layout=THREE_D, experts=4)
    assert SuiteResult.mesh_order(SimpleNamespace(runs=[moe, three_d])).ok


def test_each_claim_is_one_verdict_that_a_planted_error_fails():
    """``claims`` gathers the results' proofs: all pass on a right run, and a loss off by
    a picometre, a byte held, a byte sent or a wire below gloo's payload each fail theirs."""
    from helpers.memory.ledger import DeviceMemory
    from helpers.runs.llama_3d import claims
    from helpers.runs.llama_3d.results import LayoutRun, RankRecord, Traffic

    memory = DeviceMemory(weights=8, grads=8, optimizer_state=20, activations=1000)
    traffic = Traffic({"dp": 1}, {"dp": 10.0}, {"dp": 20.0}, {"all_gather": 1}, 20.0 + 288)
    rank = RankRecord(0, {"pp": 0, "dp": 0, "tp": 0}, memory, memory, 0, traffic,
                      {"dp": 10.0}, {"dp": 20.0}, {}, [0.1])
    run = LayoutRun(1, 2, 1, "float64", 0.01, [4.0, 3.0], [4.0, 3.0], 0.0, 1.0, 39, 39, "x",
                    ranks=[rank])
    for verdict in (claims.trains([run]), claims.holds([run]), claims.activations([run]),
                    claims.sends([run]), claims.on_the_wire([run])):
        assert verdict.ok and verdict.line().startswith("✓"), verdict.table()
    off = replace(run, losses=[4.0, 3.0 + 1e-12])
    assert claims.trains([run, off]).line().startswith("✗ 2 layouts on 1 to 2 ranks")
    assert claims.against("halved", run, off.losses, 0.0).failed[0].what == "loss, step 1"
    assert not claims.against("moved", run, run.losses, 1.0).ok  # the weights' bound
    planted = {
        claims.holds: replace(rank, predicted=replace(memory, grads=16)),
        claims.activations: replace(rank, predicted=replace(memory, activations=1011)),
        claims.sends: replace(rank, predicted_gloo={"dp": 20.0, "tp": 4.0}),
        claims.on_the_wire: replace(rank, traffic=replace(traffic, wire=19.0)),
    }
    for claim, bad in planted.items():
        assert not claim([replace(run, ranks=[bad])]).ok, claim.__name__


def test_the_taught_loop_trains_without_a_harness_and_calls_its_hooks_in_order(tmp_path):
    """One process, gloo: ``train_3d`` alone equals the one-process run exactly; a hook
    sees the start, each step around its update, and each step's end."""
    import contextlib

    import torch.distributed as dist

    from helpers.composed.training import Hooks, train_3d
    from helpers.runs.llama_3d.reference import reference_run

    calls = []

    class Recording(Hooks):
        def start(self, state):
            calls.append("start")
            return 0

        @contextlib.contextmanager
        def step(self, step):
            calls.append(f"step {step}")
            yield
            calls.append(f"updated {step}")

        def end_step(self, step, state):
            calls.append(f"end {step} ({len(state.losses)} losses)")

    config = TrainerConfig(steps=2, dtype="float64", **SMALL)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        state = train_3d(config, hooks=Recording())
    finally:
        dist.destroy_process_group()
    assert state.losses == reference_run(config).losses
    assert calls == ["start", "step 0", "updated 0", "end 0 (1 losses)", "step 1",
                     "updated 1", "end 1 (2 losses)"]


@pytest.mark.twin
@pytest.mark.torchrun
@pytest.mark.slow
def test_the_3d_layout_trains_the_one_process_model_and_its_ranks_match_their_ledgers(
        tmp_path):
    """dp x tp x pp = 2 x 2 x 2 on 8 ranks, float64: every loss and the final weights
    within the named tolerances; every rank's memory, and the sizes of the calls it issues
    per mesh dimension, as predicted; its sockets carry gloo's bytes plus headers; no rank
    keeps saved tensors from one step into the next. Its tables and charts fit a
    notebook's output area (100 characters, 950 pixels)."""
    import struct

    from helpers.comm.wire import wire_unavailable
    from helpers.runs.llama_3d import report

    run = launch(TrainerConfig(dp=2, tp=2, pp=2, steps=3, dtype="float64", **SMALL),
                 timeout=300)
    assert run.ok, run.report()
    assert run.weights_compared == run.parameters and len(run.ranks) == 8
    assert {r.rank for r in run.ranks} == set(range(8))
    assert all(r.state_ok and r.sent_ok and r.ledger_ok for r in run.ranks)
    assert all(set(r.traffic.ring) == {"dp", "tp", "pp"} for r in run.ranks)
    assert all(r.held_over == 0 for r in run.ranks)
    # a reduce-scatter sends twice the ring's bytes on gloo: FSDP's and tensor parallelism's
    assert all(r.traffic.gloo[d] > r.traffic.ring[d] for r in run.ranks for d in ("dp", "tp"))
    assert all(r.wire_ok is (None if wire_unavailable() else True) for r in run.ranks)
    assert survivors() == []
    texts = [run.report()] + [table([run]) for table in (
        report.proof_table, report.ledger_table, report.sent_table, report.wire_table,
        report.time_table)]
    assert max(len(line) for text in texts for line in text.splitlines()) <= 100, texts
    charts = [report.time_chart([run], tmp_path / "time.png", title="t"),
              report.loss_chart([run], tmp_path / "loss.png", floor=1.0, title="t")]
    assert all(struct.unpack(">I", c.read_bytes()[16:20])[0] <= 950 for c in charts)


@pytest.mark.twin
@pytest.mark.torchrun
@pytest.mark.slow
@pytest.mark.twin
@pytest.mark.torchrun
@pytest.mark.slow
def test_context_parallelism_composes_with_tp_and_pp_and_trains_the_one_process_model():
    """cp x tp x pp = 2 x 2 x 2 on 8 ranks, float64: the zig-zag ring inside every block,
    fully_shard over the cp ranks, equal to one process; every rank's state to the byte,
    its bytes per dimension as predicted (the cp group carrying the ring and FSDP)."""
    run = launch(TrainerConfig(cp=2, tp=2, pp=2, steps=3, dtype="float64", **SMALL),
                 timeout=300)
    assert run.ok, run.report()
    assert run.layout == Layout(pp=2, tp=2, cp=2) and len(run.ranks) == 8
    assert all(r.state_ok and r.sent_ok and r.ledger_ok for r in run.ranks)
    assert all(set(r.traffic.ring) == {"cp", "tp", "pp"} for r in run.ranks)
    assert {r.coords["cp"] for r in run.ranks} == {0, 1}
    assert all(r.traffic.kinds.get("p2p", 0) > 3 for r in run.ranks)  # the ring's sends too
    assert survivors() == []


@pytest.mark.twin
@pytest.mark.torchrun
@pytest.mark.slow
def test_experts_over_dp_compose_with_tp_and_pp_and_train_the_one_process_model():
    """ep x tp x pp = 2 x 2 x 2 on 8 ranks, float64, the MoE model (4 experts, top-2): its
    experts split over the dp ranks, equal to the one-process MoE model; every rank's
    state to the byte (its two experts of each block whole), its activations from its
    routing, its bytes per dimension as predicted (the all-to-alls from its routing
    counts, beside FSDP's), its wire within gloo's headers. A twin: lesson 13's launch
    trains the same layout, asserted in its cells."""
    from helpers.comm.wire import wire_unavailable

    run = launch(TrainerConfig(dp=2, tp=2, pp=2, experts=4, top_k=2, steps=3,
                               dtype="float64", **SMALL), timeout=300)
    assert run.ok, run.report()
    assert run.name == "ep=2 x tp=2 x pp=2" and run.experts == 4 and len(run.ranks) == 8
    assert run.weights_compared == run.parameters
    assert all(r.state_ok and r.sizes_ok and r.ledger_ok for r in run.ranks)
    assert all(r.wire_ok is (None if wire_unavailable() else True) for r in run.ranks)
    assert all(r.traffic.kinds["all_to_all"] > 0 and r.held_over == 0 for r in run.ranks)
    assert all(set(r.traffic.ring) == {"dp", "tp", "pp"} for r in run.ranks)
    assert survivors() == []


@pytest.mark.twin
@pytest.mark.torchrun
@pytest.mark.slow
def test_a_checkpoint_saved_under_one_layout_resumes_under_another(tmp_path):
    """tp=2 trains 2 steps and saves after each; dp=2 resumes and finishes 4 steps, equal
    to the one-process run; one process loads the checkpoint with the same fingerprint;
    incomplete folders and other models are refused by name. A twin: lesson 13's launch
    makes the same round trip (dp x tp x pp -> dp x tp -> dp x tp x pp), loads it in one
    process and refuses the same folders, all asserted in its cells."""
    first = TrainerConfig(tp=2, steps=2, checkpoint_dir=str(tmp_path), dtype="float64")
    saved = launch(first, timeout=240)
    manifest = check(step_folder(tmp_path, 1), first)
    assert manifest.step == 1 and manifest.weights_sha256 == saved.weights_sha256
    assert manifest.layout == "tp=2" and len(manifest.losses) == 2
    second = replace(first, tp=1, dp=2, steps=4, resume=True)
    resumed = launch(second, timeout=240)
    assert resumed.resumed_from == 1 and resumed.loaded_ok and resumed.ok, resumed.report()
    assert resumed.losses[-1] < resumed.losses[0] - 0.3  # it learns
    model, _, read = load_one_process(step_folder(tmp_path, 1), second)
    order = [n for n, _ in model.named_parameters()]
    assert fingerprint(parameter_hashes(model.named_parameters()), order) == read.weights_sha256
    with pytest.raises(FolderError, match="hidden=64 in the checkpoint, 32 here"):
        check(step_folder(tmp_path, 1), other_model(second, hidden=32))
    with pytest.raises(FolderError, match="dtype=float64 in the checkpoint, float32 here"):
        check(step_folder(tmp_path, 1), replace(second, dtype="float32"))
    broken = tmp_path / "broken"
    shutil.copytree(step_folder(tmp_path, 1), broken)
    (broken / ".metadata").unlink()
    with pytest.raises(FolderError, match="missing"):
        check(broken, second)


@pytest.mark.twin
@pytest.mark.torchrun
@pytest.mark.slow
def test_a_rank_killed_mid_training_is_restarted_and_ends_with_the_same_weights(tmp_path):
    """Rank 1 SIGKILLs itself as step 2 starts; torchrun --max-restarts=1 restarts both
    ranks, which resume after step 1: the same losses and weights, bit for bit, as a run
    that was never interrupted, and no process left."""
    config = TrainerConfig(dp=2, steps=4, **SMALL)
    plain = launch(config, timeout=240)
    killed = replace(config, checkpoint_dir=str(tmp_path), resume=True, kill_rank=1,
                     kill_step=2)
    run = launch(killed, restarts=1, timeout=240)
    assert run.attempt == 1 and run.resumed_from == 1 and plain.attempt == 0
    assert run.losses == plain.losses and run.weights_sha256 == plain.weights_sha256
    assert survivors() == []
