"""Lesson 13's predictions, checkpoint fingerprint and verdicts to the letter.

- The ledger: what each rank of each layout holds and sends, predicted from the shapes,
  against the bytes lesson 13's run measured (the small profile, float64: its stored
  ledger and traffic tables, copied below; weights, gradients and optimizer state were
  measured equal to the prediction there, the activations printed where they differ);
  the pieces and the refusals by hand.
- The checkpoint: its identity, folders, the manifest it reads back, the refusals of an
  incomplete folder and of another model word for word, and a save and two loads of a
  tiny model on one process (a one-rank gloo group, no launch).
- The claims: small hand-built runs drive each verdict both ways, with its exact line.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers.composed.checkpoint import (
    Manifest,
    check,
    identity,
    latest,
    load,
    load_one_process,
    save,
    step_folder,
)
from helpers.composed.experts import RankRouting
from helpers.composed.layout import Layout
from helpers.composed.ledger import (
    _local_numel,
    _pieces,
    moe_kind,
    predicted_memory,
    predicted_sent,
    tp_dim,
)
from helpers.core.errors import FolderError
from helpers.core.files import verify_folder, write_verified_folder
from helpers.expert_parallel.memory import LayerLoad
from helpers.memory.ledger import DeviceMemory
from helpers.profiles import get_profile
from helpers.runs.llama_3d import claims
from helpers.runs.llama_3d.config import SMALL_LLAMA, SuiteConfig, TrainerConfig
from helpers.runs.llama_3d.results import LayoutRun, RankRecord, Traffic

SUITE = SuiteConfig.for_profile(get_profile("small"))
ONE, DP2, TP2, PP2 = Layout(), Layout(dp=2), Layout(tp=2), Layout(pp=2)
THREE_D, CP_3D = Layout(pp=2, dp=2, tp=2), Layout(pp=2, tp=2, cp=2)

# ---------------------------------------------------------------- the ledger

# lesson 13's stored ledger table: (layout, stage) -> weights, gradients, optimizer state,
# and the estimator's activations (the measured ones are within 1 % of these)
MEASURED = {
    (ONE, 0): (1_249_792, 1_249_792, 2_499_740, 4_746_248),
    (DP2, 0): (624_896, 624_896, 1_249_948, 2_373_128),
    (TP2, 0): (627_200, 643_584, 1_254_556, 2_669_312),  # the embedding's gradient whole
    (PP2, 0): (624_640, 624_640, 1_249_356, 2_241_536),
    (PP2, 1): (625_152, 625_152, 1_250_384, 1_252_360),
    (THREE_D, 0): (156_672, 156_672, 313_420, 626_240),
    (THREE_D, 1): (156_928, 156_928, 313_936, 354_208),
    (CP_3D, 0): (156_672, 156_672, 313_420, 626_240),
    (CP_3D, 1): (156_928, 156_928, 313_936, 354_208),
}


@pytest.mark.parametrize(("layout", "stage"), list(MEASURED))
def test_each_rank_holds_what_lesson_13_measured(layout, stage):
    weights, grads, state, activations = MEASURED[layout, stage]
    got = predicted_memory(SUITE.trainer(layout), stage)
    assert (got.weights, got.grads, got.optimizer_state, got.activations) == (
        weights, grads, state, activations)


def test_the_moe_rank_holds_what_lesson_13_measured():
    """Every local expert trained and kept (2 a block, 2 blocks a stage): the weights,
    gradients and AdamW state measured; an expert never reached keeps no state, one not
    reached in the last step no gradient."""
    config = SUITE.trainer(THREE_D, moe=True)
    even = LayerLoad(tokens=16, arrived=(16, 16), kept=(16, 16))

    def routing(trained: int = 4, kept: int = 4) -> RankRouting:
        return RankRouting(0, [], [[even, even], [even, even]], trained, kept)

    expert = 3 * 64 * 64 * 8  # bytes of one expert's three float64 weights
    for stage, (weights, state) in enumerate(((453_632, 907_372), (453_888, 907_888))):
        got = predicted_memory(config, stage, routing())
        assert (got.weights, got.grads, got.optimizer_state) == (weights, weights, state)
        idle = predicted_memory(config, stage, routing(trained=3))
        assert (idle.grads, idle.optimizer_state) == (weights - expert, state)
        never = predicted_memory(config, stage, routing(trained=3, kept=3))
        assert never.optimizer_state == state - 2 * expert - 3 * 4  # no exp_avg(_sq), no steps
    with pytest.raises(ValueError) as error:
        predicted_sent(config, 0)
    assert str(error.value) == ("an MoE model's prediction without its routing; valid: "
                                "routing=the rank's RankRouting (helpers.composed.experts)")


def test_the_moe_activations_by_hand():
    """ep=2 x tp=2 x pp=2, 2 rows of 16 tokens a micro-batch. A router that sends no token
    leaves the dense stage (626,240 and 354,208 B, measured) without its MLPs: 2 blocks x
    32 tokens x 8 B x (4 x 128 / 2 + 64 - 32) = 147,456 B each micro-batch in flight, 2 on
    stage 0 and 1 on stage 1. A layer whose 32 tokens go 32 rows to each local expert, all
    kept, saves 234,272 B (router 2,304, dispatch 34,336, experts 164,352, placed rows
    33,280), 32 of them the counts already in the dense part: 468,480 B for the 2 blocks of
    a micro-batch. Stage 0 keeps both micro-batches, stage 1 the larger one."""
    config = SUITE.trainer(THREE_D, moe=True)
    zero = LayerLoad(tokens=0, arrived=(0, 0), kept=(0, 0))
    full = LayerLoad(tokens=32, arrived=(32, 32), kept=(32, 32))

    def activations(stage: int, first: LayerLoad, second: LayerLoad) -> int:
        routing = RankRouting(0, [], [[first, second], [first, second]], 4, 4)
        return predicted_memory(config, stage, routing).activations

    assert activations(0, zero, zero) == 626_240 - 2 * 147_456 == 331_328
    assert activations(1, zero, zero) == 354_208 - 147_456 == 206_752
    assert activations(0, full, full) == 331_328 + 2 * 468_480
    assert activations(0, full, zero) == activations(0, zero, full) == 331_328 + 468_480
    for first, second in ((full, full), (full, zero), (zero, full)):
        assert activations(1, first, second) == 206_752 + 468_480
    # no pipeline (ep=2 alone): one micro-batch of 4 rows, 4 blocks of 64 tokens whose
    # MLPs (4 x 128 wide, no tp) leave the dense rank's 2,373,128 B: 1,048,576 B
    flat = SUITE.trainer(Layout(dp=2), moe=True)
    routing = RankRouting(0, [], [[zero]] * 4, 4, 4)
    assert predicted_memory(flat, 0, routing).activations == 2_373_128 - 1_048_576


def test_the_moe_ranks_dp_traffic_by_hand():
    """ep=2 x tp=2 x pp=2, stage 0, ring formula. fully_shard sends the dense 3-D rank's
    313,344 B less its MLPs (2 blocks x 3 x 64 x 128 / 2 tp / 2 dp elements, 8 B each,
    gathered from 2 ranks: 196,608 B) plus the routers (2 x 4 x 64 / 2 dp: 4,096 B), and
    no expert. Each of the 4 MoE forwards (2 blocks x 2 micro-batches) adds the counts'
    all-to-all (2 experts' int64 counts to the other rank: 16 B) and their all-reduce
    (32 B over 2 ranks: 32 B); rows that leave their rank add 4 all-to-alls of 16 rows of
    64 x 8 B (dispatch, combine and their backward). The mean over the timed steps."""
    config = SUITE.trainer(THREE_D, moe=True)
    even = LayerLoad(tokens=16, arrived=(16, 16), kept=(16, 16))
    home = torch.tensor([[16, 16, 0, 0], [0, 0, 16, 16]])  # every row to its own experts
    spread = torch.full((2, 4), 8)  # half of each rank's rows to the other rank

    def dp(*steps: torch.Tensor, algorithm: str = "ring") -> float:
        routing = RankRouting(0, [[m] * 4 for m in steps], [[even] * 2] * 2, 4, 4)
        return predicted_sent(config, 0, algorithm, routing)["dp"]

    assert dp() == 313_344 - 196_608 + 4_096 == 120_832
    assert dp(algorithm="gloo") == 120_832 * 3 / 2  # the reduce-scatter an all-reduce
    assert dp(home) == dp(home, home) == 120_832 + 4 * (16 + 32)
    moved = 16 + 32 + 4 * 16 * 64 * 8
    assert dp(spread) == 120_832 + 4 * moved
    assert dp(home, spread) == 120_832 + (4 * 48 + 4 * moved) / 2


# lesson 13's stored traffic table, KiB per step as printed (ring, gloo; pp's the same)
SENT_KIB = {
    (DP2, 0): {"dp": ("1831", "2441")},
    (TP2, 0): {"tp": ("1168", "1744")},
    (PP2, 0): {"pp": ("64", "64")},
    (PP2, 1): {"pp": ("64", "64")},
    (THREE_D, 0): {"dp": ("306", "459"), "tp": ("290", "434"), "pp": ("16", "16")},
    (THREE_D, 1): {"dp": ("306", "460"), "tp": ("292", "436"), "pp": ("16", "16")},
    (CP_3D, 0): {"cp": ("434", "587"), "tp": ("290", "434"), "pp": ("16", "16")},
    (CP_3D, 1): {"cp": ("434", "588"), "tp": ("292", "436"), "pp": ("16", "16")},
}


@pytest.mark.parametrize(("layout", "stage"), list(SENT_KIB))
def test_each_rank_sends_what_lesson_13_measured(layout, stage):
    config = SUITE.trainer(layout)
    ring, gloo = predicted_sent(config, stage), predicted_sent(config, stage, "gloo")
    assert {d: (f"{ring[d] / 1024:.0f}", f"{gloo[d] / 1024:.0f}") for d in ring} == \
        SENT_KIB[layout, stage]
    assert set(gloo) == set(ring)


def test_the_3d_rank_0_sends_the_bytes_measured_to_the_byte():
    """Lesson 13 printed rank 0's step: gloo 434.00 KiB over tp, 459.00 over dp, 16.00
    over pp; 626,688 B by the ring formula, 930,816 by gloo's algorithms."""
    config = SUITE.trainer(THREE_D)
    ring, gloo = predicted_sent(config, 0, "ring"), predicted_sent(config, 0, "gloo")
    assert gloo == {"tp": 434 * 1024, "dp": 459 * 1024, "pp": 16 * 1024}
    assert sum(ring.values()) == 626_688 and sum(gloo.values()) == 930_816
    # the MoE layout's tp over gloo, 628.09 KiB printed; its routing leaves tp alone
    moe = SUITE.trainer(THREE_D, moe=True)
    even = LayerLoad(tokens=16, arrived=(16, 16), kept=(16, 16))
    routed = predicted_sent(moe, 0, "gloo", RankRouting(0, [], [[even] * 2] * 2, 4, 4))
    assert f"{routed['tp'] / 1024:.2f}" == "628.09" and routed["pp"] == 16 * 1024
    with pytest.raises(ValueError) as error:
        predicted_sent(config, 0, "nccl")
    assert str(error.value) == "algorithm='nccl'; valid choices: ring, gloo"


def test_a_middle_stage_sends_both_ways_and_context_parallel_traffic_scales():
    """pp=4 (4 micro-batches): the end stages send the batch's stream once (8 x 16 x 64
    x 8 B = 65,536: activations forward or gradients back), a middle stage both ways.
    Ring attention's bytes (whole float64 numbers) are each block's, for the whole batch:
    on one stage of 4 blocks twice those of a stage of 2, however the batch is cut into
    micro-batches; the same on gloo (sends and receives)."""
    pipe = SUITE.trainer(Layout(pp=4), microbatches=4)
    assert [predicted_sent(pipe, s)["pp"] for s in range(4)] == [65_536, 131_072, 131_072,
                                                                 65_536]
    flat, staged = SUITE.trainer(Layout(dp=2, cp=2)), SUITE.trainer(Layout(pp=2, dp=2, cp=2))
    one = predicted_sent(flat, 0)["cp"]
    assert one == 2 * predicted_sent(staged, 0)["cp"] == 2 * predicted_sent(staged, 1)["cp"]
    assert one % 8 == 0 and one == predicted_sent(flat, 0, "gloo")["cp"]


def test_the_pieces_by_hand():
    """A (10, 6) weight split along dim 1 over tp 2, then fully_shard over 3: (10, 3) cut
    into chunks of ceil(10 / 3) = 4 rows, 12 elements; along dim 0: (5, 6), 2 rows, 12."""
    assert _local_numel([10, 6], 1, 2, 3) == 12 and _local_numel([10, 6], 0, 2, 3) == 12
    assert _local_numel([10, 6], None, 2, 1) == 60 and _local_numel([7], None, 1, 2) == 4
    assert moe_kind("blocks.0.mlp.experts.3.w1") == "expert"
    assert moe_kind("blocks.1.mlp.router.weight") == "router"
    assert moe_kind("blocks.1.mlp.shared.w2") == "router"
    assert moe_kind("blocks.1.mlp.up_proj.weight") == "dense"
    assert [tp_dim(n) for n in ("blocks.0.mlp.up_proj.weight", "blocks.0.mlp.down_proj.weight",
                                "blocks.0.attn_norm.weight", "embed.weight", "head.weight",
                                "norm.weight", "blocks.2.attn.k_proj.weight")] == \
        [0, 1, None, 0, 0, None, 0]
    # the tp=2 stage: the head's (64, 64) over tp by rows, 2048 elements; a norm whole
    pieces = {name: (held, piece) for name, held, piece in _pieces(SUITE.trainer(TP2), 0)}
    assert pieces["head.weight"] == (2048, 2048) and pieces["norm.weight"] == (64, 64)
    pieces = {name: (held, piece) for name, held, piece in _pieces(SUITE.trainer(THREE_D), 1)}
    assert pieces["head.weight"] == (1024, 2048) and "embed.weight" not in pieces
    assert pieces["blocks.2.mlp.down_proj.weight"] == (2048, 4096)


# ---------------------------------------------------------------- the checkpoint

TINY = TrainerConfig(model=replace(SMALL_LLAMA, vocab=32, hidden=32, ffn=64), seq=8,
                     dtype="float64", steps=2)


def test_identity_is_the_model_the_seed_and_the_dtype():
    assert identity(TINY) == {"vocab": 32, "hidden": 32, "blocks": 4, "ffn": 64, "heads": 4,
                              "kv_heads": 2, "rope": True, "tied": False, "seed": 0,
                              "dtype": "float64"}
    assert identity(replace(TINY, dp=2, lr=0.5)) == identity(TINY)  # not the layout


def test_step_folders_and_the_latest(tmp_path, monkeypatch):
    assert step_folder("/r", 7) == Path("/r/step_0007")
    assert step_folder(tmp_path, 12345) == tmp_path / "step_12345"
    assert latest(tmp_path) is None and latest("") is None
    (tmp_path / "step_0010").write_text("a file, not a checkpoint")
    assert latest(tmp_path) is None
    for step in (2, 9):
        step_folder(tmp_path, step).mkdir()
    (tmp_path / "other").mkdir()
    assert latest(tmp_path) == tmp_path / "step_0009"
    assert latest(str(tmp_path)) == tmp_path / "step_0009"
    monkeypatch.chdir(tmp_path)
    assert latest("") is None  # no root: none, not the working directory's


def _sealed(folder: Path, meta: dict, metadata: bool = True) -> Path:
    def fill(tmp: Path) -> None:
        (tmp / ("x.distcp" if not metadata else ".metadata")).write_bytes(b"shards")

    write_verified_folder(folder, fill, meta=meta)
    return folder


def test_check_reads_the_manifest_and_refuses_another_model_word_for_word(tmp_path):
    meta = {"model": identity(TINY), "step": 3, "losses": [2.5, 2.0], "layout": "dp=2",
            "weights_sha256": "ab12"}
    folder = _sealed(tmp_path / "step_0003", meta)
    assert check(folder, TINY) == Manifest(3, "dp=2", [2.5, 2.0], "ab12")
    bare = _sealed(tmp_path / "bare", {"model": identity(TINY), "step": 0})
    assert check(bare, TINY) == Manifest(0, "", [], "")
    other = replace(TINY, seed=1, model=replace(TINY.model, hidden=64))
    with pytest.raises(FolderError) as error:
        check(folder, other)
    assert str(error.value) == (f"{folder} holds another model (hidden=32 in the checkpoint, 64 "
                                "here, seed=0 in the checkpoint, 1 here); valid: the same model "
                                "sizes and seed, under any layout")
    with pytest.raises(FolderError) as error:
        check(folder, replace(TINY, dtype="float32"))
    assert "(dtype=float64 in the checkpoint, float32 here)" in str(error.value)
    unnamed = _sealed(tmp_path / "unnamed", {"step": 0})
    with pytest.raises(FolderError, match=r"\(vocab=None in the checkpoint, 32 here, hidden="):
        check(unnamed, TINY)
    partial = _sealed(tmp_path / "partial", meta, metadata=False)
    with pytest.raises(FolderError) as error:
        check(partial, TINY)
    assert str(error.value) == (f"{partial} holds no .metadata: not a complete checkpoint; "
                                "valid: a folder written by helpers.composed.checkpoint.save")


def _state(model, optimizer) -> dict[str, torch.Tensor]:
    out = {f"w.{n}": p.detach().clone() for n, p in model.named_parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, state in optimizer.state.items():
        for key, value in state.items():
            out[f"{key}.{names[id(p)]}"] = value.detach().clone()
    return out


def test_a_checkpoint_saved_on_one_rank_loads_back_exactly(tmp_path):
    """One training step of the tiny model, saved after step 1 on a one-rank gloo group;
    loaded into a model of another seed (and a fresh AdamW), and without any group: the
    same weights and AdamW state, the manifest as saved; a leftover staging folder of a
    killed attempt is cleared; another model is refused before anything is loaded."""
    from torch.distributed.checkpoint import FileSystemReader

    from helpers.models.llama import build_lm

    def trained(seed: int):
        model = build_lm(TINY.model, seed=seed).train().to(torch.float64)
        optimizer = torch.optim.AdamW(model.parameters(), lr=TINY.lr)
        ids = torch.arange(16).reshape(2, 8) % 32
        model(ids).square().mean().backward()
        optimizer.step()
        return model, optimizer

    model, optimizer = trained(0)
    saved = _state(model, optimizer)
    staging = tmp_path / ".step_0001.staging"
    staging.mkdir()
    (staging / "junk").write_text("left by a killed attempt")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        folder = save(tmp_path, 1, model, optimizer, TINY, [3.0, 2.0], weights_sha256="cafe")
        other, other_opt = trained(1)
        before = _state(other, other_opt)
        with pytest.raises(FolderError, match="holds another model"):
            load(folder, other, other_opt, replace(TINY, seed=5))
        assert all(torch.equal(before[k], v) for k, v in _state(other, other_opt).items())
        manifest = load(folder, other, other_opt, TINY)
        second = save(tmp_path, 2, model, optimizer, TINY, [3.0, 2.0, 1.0])  # no leftover
    finally:
        dist.destroy_process_group()
    assert folder == tmp_path / "step_0001" and not staging.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0001", "step_0002"]
    assert manifest == Manifest(1, "one device", [3.0, 2.0], "cafe")
    assert check(second, TINY) == Manifest(2, "one device", [3.0, 2.0, 1.0], "")
    assert latest(tmp_path) == second
    assert verify_folder(folder)["model"] == identity(TINY)
    assert "junk" not in verify_folder(folder)["files"]  # the leftover was not sealed in
    loaded = _state(other, other_opt)
    assert loaded.keys() == saved.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    keys = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    assert "optim.param_groups.head.weight.lr" in keys  # the groups keyed by name
    assert "optim.state.head.weight.exp_avg" in keys
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alone, alone_opt, again = load_one_process(folder, TINY)
    assert not [w for w in caught if "torch.distributed is disabled" in str(w.message)]
    assert again == manifest and isinstance(alone_opt, torch.optim.AdamW)
    assert alone_opt.param_groups[0]["lr"] == TINY.lr
    one = _state(alone, alone_opt)
    assert one.keys() == saved.keys() and all(torch.equal(saved[k], one[k]) for k in saved)
    assert all(p.dtype == torch.float64 and p.requires_grad for p in alone.parameters())
    assert alone.training


# ---------------------------------------------------------------- the claims

MEMORY = DeviceMemory(weights=8, grads=8, optimizer_state=20, activations=1000)


def _rank(rank: int, traffic: Traffic, **change) -> RankRecord:
    record = RankRecord(rank, {"pp": 0, "dp": rank, "tp": 0}, MEMORY, MEMORY, 0, traffic,
                        dict(traffic.ring), dict(traffic.gloo), {}, [0.1])
    return replace(record, **change)


def _traffic(wire: float | None = 20.0 + 288) -> Traffic:
    return Traffic({"dp": 1}, {"dp": 10.0}, {"dp": 20.0}, {"all_gather": 1}, wire)


def _run(dp: int = 2, pp: int = 1, losses=(4.0, 3.0), weight_diff: float = 0.0,
         ranks=None) -> LayoutRun:
    """float64, lr 0.01, gradients of at most 1: the weights' tolerance
    2 x 0.01 x 4 x eps x 1 / 1e-8, the losses' 4 eps x |reference|."""
    ranks = [_rank(0, _traffic()), _rank(1, _traffic())] if ranks is None else ranks
    return LayoutRun(pp, dp, 1, "float64", 0.01, list(losses), [4.0, 3.0], weight_diff, 1.0,
                     39, 39, "x", ranks=ranks)


EPS = torch.finfo(torch.float64).eps
WEIGHT_TOL = 2 * 0.01 * 4 * EPS / 1e-8


def test_trains_names_its_layouts_and_fails_a_loss_a_picometre_off():
    right, deep = _run(), _run(dp=1, pp=4)
    verdict = claims.trains([right, deep])
    assert verdict.claim == "2 layouts on 1 to 4 ranks train as one process"
    assert [(p.what, p.max_diff) for p in verdict.proofs] == [
        ("dp=2: loss, step 0", 0.0), ("dp=2: loss, step 1", 0.0), ("dp=2: final weights", 0.0),
        ("pp=4: loss, step 0", 0.0), ("pp=4: loss, step 1", 0.0), ("pp=4: final weights", 0.0)]
    assert verdict.line() == "✓ 2 layouts on 1 to 4 ranks train as one process (6 checks, all exact)"
    assert claims.trains([right], "named").claim == "named"
    off = _run(losses=(4.0, 3.0 + 1e-12))
    assert claims.trains([right, off]).line().startswith(
        "✗ 2 layouts on 1 to 2 ranks train as one process (1 of 6 checks failed; "
        "dp=2: loss, step 1: 1.0e-12 > 2.7e-15 allowed)")
    moved = _run(weight_diff=2 * WEIGHT_TOL)
    assert [p.what for p in claims.trains([moved]).failed] == ["dp=2: final weights"]
    assert claims.trains([_run(weight_diff=WEIGHT_TOL)]).ok


def test_against_holds_other_losses_to_the_runs_tolerances():
    run = _run()
    verdict = claims.against("halved", run, [4.0, 3.0 + 2e-15], WEIGHT_TOL)
    assert verdict.ok and verdict.claim == "halved"
    assert [(p.what, p.max_diff, p.tolerance) for p in verdict.proofs] == [
        ("loss, step 0", 0.0, 4 * EPS * 4.0), ("loss, step 1", 3.0 + 2e-15 - 3.0, 4 * EPS * 3.0),
        ("final weights", WEIGHT_TOL, WEIGHT_TOL)]
    first = claims.against("first", run, [4.0 - 1e-14, 3.0], 0.0)
    assert [p.what for p in first.failed] == ["loss, step 0"]
    assert not claims.against("moved", run, [4.0, 3.0], WEIGHT_TOL * 1.5).ok
    for losses in ([4.0], [4.0, 3.0, 2.0]):  # a step short or over: not fewer checks
        with pytest.raises(ValueError):
            claims.against("uneven", run, losses, 0.0)


def test_holds_and_activations_take_their_own_proofs_of_every_rank():
    run = _run()
    holds, acts = claims.holds([run]), claims.activations([run])
    assert holds.claim == "every rank holds the weights, gradients and optimizer state predicted"
    assert [p.what for p in holds.proofs] == [
        f"dp=2: rank {r} (stage 0) {k}" for r in (0, 1)
        for k in ("weights", "grads", "optimizer_state")]
    assert acts.claim == "each rank's activations within 1% of the estimator's"
    assert [(p.what, p.tolerance) for p in acts.proofs] == [
        ("dp=2: rank 0 (stage 0) activations", 0.01), ("dp=2: rank 1 (stage 0) activations", 0.01)]
    assert holds.ok and acts.ok
    grads = _rank(1, _traffic(), predicted=replace(MEMORY, grads=16))
    bad = claims.holds([_run(ranks=[_rank(0, _traffic()), grads])])
    assert [(p.what, p.max_diff) for p in bad.failed] == [("dp=2: rank 1 (stage 0) grads", 8)]
    assert claims.activations([_run(ranks=[grads])]).ok  # not an activation
    near = _rank(0, _traffic(), predicted=replace(MEMORY, activations=1010))
    assert claims.activations([_run(ranks=[near])]).ok  # 10 / 1010 < 1 %
    assert claims.holds([_run(ranks=[near])]).ok
    far = _rank(0, _traffic(), predicted=replace(MEMORY, activations=1011))
    assert [p.what for p in claims.activations([_run(ranks=[far])]).failed] == [
        "dp=2: rank 0 (stage 0) activations"]


def test_sends_compares_every_dimension_both_ways_exactly():
    run = _run()
    verdict = claims.sends([run])
    assert verdict.claim == "along each mesh dimension, each rank sends the bytes its plan predicts"
    assert [(p.what, p.max_diff, p.tolerance) for p in verdict.proofs] == [
        ("dp=2: rank 0 dp (ring)", 0.0, 0), ("dp=2: rank 0 dp (gloo)", 0.0, 0),
        ("dp=2: rank 1 dp (ring)", 0.0, 0), ("dp=2: rank 1 dp (gloo)", 0.0, 0)]
    planted = _rank(1, _traffic(), predicted_ring={"dp": 10.5},
                    predicted_gloo={"dp": 20.0, "tp": 4.0})
    bad = claims.sends([_run(ranks=[_rank(0, _traffic()), planted])])
    assert [(p.what, p.max_diff) for p in bad.failed] == [
        ("dp=2: rank 1 dp (ring)", 0.5), ("dp=2: rank 1 tp (gloo)", math.inf)]
    unpredicted = _rank(0, replace(_traffic(), ring={"dp": 10.0, "pp": 1.0}),
                        predicted_ring={"dp": 10.0})
    assert [p.what for p in claims.sends([_run(ranks=[unpredicted])]).failed] == [
        "dp=2: rank 0 pp (ring)"]
    ordered = _rank(0, replace(_traffic(), ring={"tp": 1.0, "dp": 10.0}),
                    predicted_ring={"tp": 1.0, "dp": 10.0})
    assert [p.what for p in claims.sends([_run(ranks=[ordered])]).proofs][:2] == [
        "dp=2: rank 0 dp (ring)", "dp=2: rank 0 tp (ring)"]


def test_on_the_wire_allows_gloos_headers_and_nothing_below_its_payload():
    """One all-gather on 2 ranks: 288 B of headers allowed over gloo's 20 B."""
    verdict = claims.on_the_wire([_run()])
    assert verdict.claim == "each rank's wire = gloo's bytes + at most its headers"
    assert [(p.what, p.max_diff, p.tolerance) for p in verdict.proofs] == [
        ("dp=2: rank 0, wire - gloo", 288.0, 288.0), ("dp=2: rank 1, wire - gloo", 288.0, 288.0)]
    exact = _rank(0, _traffic(wire=20.0))
    assert claims.on_the_wire([_run(ranks=[exact])]).proofs[0].max_diff == 0.0
    over = _rank(0, _traffic(wire=20.0 + 289))
    below = _rank(1, _traffic(wire=19.0))
    bad = claims.on_the_wire([_run(ranks=[over, below])])
    assert [(p.what, p.max_diff) for p in bad.failed] == [
        ("dp=2: rank 0, wire - gloo", 289.0), ("dp=2: rank 1, wire - gloo", math.inf)]
    unread = _rank(1, _traffic(wire=None))
    assert claims.on_the_wire([_run(ranks=[unread])]) is None
    assert len(claims.on_the_wire([_run(ranks=[unread, exact])]).proofs) == 1


@pytest.fixture(autouse=True)
def _no_leftover_group():
    yield
    if dist.is_initialized():  # a failed test must not leave its group to the next
        dist.destroy_process_group()

