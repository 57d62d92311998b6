"""Lesson 13's parts that need no launch: the ledger's prediction against one process, the
saved-tensor meter's rule for weights, the fingerprint, the traffic counter's patches,
and the store prefix that lets restarted ranks meet."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers.comm.meter import CommMeter
from helpers.composed.data import MarkovTask
from helpers.composed.ledger import predicted_memory, predicted_sent, tp_dim
from helpers.models.llama import build_lm
from helpers.runs.llama_3d.config import TrainerConfig
from helpers.runs.llama_3d.digest import fingerprint, parameter_hashes, parameter_names
from helpers.runs.llama_3d.measure import StageMeter, held
from helpers.torchrun.launcher import free_port
from helpers.torchrun.ranks import attempt_store


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_process_holds_what_the_ledger_predicts_to_the_byte(dtype):
    config = TrainerConfig(dtype=dtype)
    model = build_lm(config.model, seed=0).train().to(config.torch_dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr)
    ids, targets = MarkovTask(config.model.vocab).batch(config.batch, config.seq, 0)
    meter = StageMeter()
    with meter:
        F.cross_entropy(model(ids).flatten(0, 1), targets.flatten()).backward()
    memory = held(model, opt)
    opt.step()
    memory.optimizer_state = held(model, opt).optimizer_state
    memory.activations = max(meter.peak.values())
    assert memory == predicted_memory(config, 0)
    assert predicted_sent(config, 0) == predicted_sent(config, 0, "gloo") == {}  # nothing sent


def test_gloo_sends_twice_the_rings_bytes_for_each_reduce_scatter_of_the_plan():
    fsdp, pipe = TrainerConfig(dp=2), TrainerConfig(dp=2, tp=2, pp=2)
    ring, gloo = predicted_sent(fsdp, 0), predicted_sent(fsdp, 0, "gloo")
    assert gloo["dp"] == ring["dp"] * 4 / 3  # two all-gathers and a reduce-scatter: 2 + 2
    ring, gloo = predicted_sent(pipe, 0), predicted_sent(pipe, 0, "gloo")
    assert gloo["dp"] == ring["dp"] * 3 / 2 and gloo["pp"] == ring["pp"]  # one all-gather
    assert ring["tp"] < gloo["tp"] < 2 * ring["tp"]  # half its stream bytes reduce-scatter
    with pytest.raises(ValueError, match="valid choices: ring, gloo"):
        predicted_sent(fsdp, 0, "nccl")


def test_the_meter_counts_a_received_input_but_no_weight_nor_a_view_of_one():
    layer = nn.Linear(4, 4, bias=False)
    received = torch.ones(2, 4, requires_grad=True)  # what a pipeline stage is handed
    meter = StageMeter()
    with meter:
        y = (received @ layer.weight.t()).relu()  # saves received, the weight's transpose, y
    assert meter.live["cpu"] == 2 * received.nbytes  # received and y; no weight
    del y


def test_the_meter_keeps_no_graph_alive_that_is_dropped_without_a_backward():
    """exp saves its own output: a meter holding that tensor itself would close a loop
    (output -> grad_fn -> saved value -> meter -> output) that only a backward breaks."""
    weight = nn.Parameter(torch.randn(100, dtype=torch.float64))
    meter = StageMeter()
    with meter:
        y = (torch.randn(100, dtype=torch.float64) * weight).exp()
    assert meter.live["cpu"] == 2 * y.nbytes  # mul's input, exp's output
    del y  # dropped, as PipelineStage drops its first stage's shape-inference forward
    assert meter.live["cpu"] == 0


def test_the_plan_splits_what_lesson_09_says():
    assert [tp_dim(n) for n in ("blocks.3.attn.q_proj.weight", "blocks.0.attn.o_proj.weight",
                                "blocks.1.mlp_norm.weight", "embed.weight", "head.weight",
                                "norm.weight")] == [0, 1, None, 0, 0, None]


def test_the_fingerprint_is_the_weights_and_nothing_else():
    config = TrainerConfig()
    a, b = build_lm(config.model, seed=0), build_lm(config.model, seed=0)
    order = [n for n, _ in a.named_parameters()]
    assert parameter_names(config.model) == order
    same = fingerprint(parameter_hashes(a.named_parameters()), order)
    assert same == fingerprint(parameter_hashes(reversed(list(b.named_parameters()))), order)
    with torch.no_grad():
        flat = b.head.weight.view(-1)
        flat[0] = torch.nextafter(flat[0], torch.tensor(1.0))  # one unit in the last place
    assert same != fingerprint(parameter_hashes(b.named_parameters()), order)
    with pytest.raises(ValueError, match="no hash for"):
        fingerprint({}, order)


def test_the_traffic_counter_puts_back_what_it_wrapped():
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.pipelining import schedules

    before = (dist.all_gather_single, dist.reduce_scatter_single, dist.all_reduce,
              funcol.all_reduce, schedules._batch_p2p, schedules._wait_batch_p2p)
    with CommMeter({}, timed=True):
        assert dist.all_reduce is not before[2] and funcol.all_reduce is not before[3]
    assert (dist.all_gather_single, dist.reduce_scatter_single, dist.all_reduce,
            funcol.all_reduce, schedules._batch_p2p, schedules._wait_batch_p2p) == before


def test_each_restart_attempt_meets_under_its_own_prefix(monkeypatch):
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("RANK", "0")
    assert attempt_store(1) == {}  # torchrun does not share its store: env:// as usual
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    for attempt in ("0", "1"):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
        kwargs = attempt_store(1)
        assert (kwargs["rank"], kwargs["world_size"]) == (0, 1)
        kwargs["store"].set("rank_0", f"address of attempt {attempt}")
    assert server.get("attempt_0/rank_0") == b"address of attempt 0"
    assert server.get("attempt_1/rank_0") == b"address of attempt 1"
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")  # two nodes: their counts may differ
    assert attempt_store(1) == {}


def test_a_run_that_would_resume_another_models_checkpoint_is_refused_before_launch(tmp_path):
    from dataclasses import replace

    from helpers.composed.checkpoint import identity, step_folder
    from helpers.core.errors import FolderError
    from helpers.core.files import write_verified_folder
    from helpers.runs.contract import launch

    mine = TrainerConfig(dp=2, checkpoint_dir=str(tmp_path), resume=True)
    theirs = replace(mine, model=replace(mine.model, hidden=32))
    write_verified_folder(step_folder(tmp_path, 0), lambda tmp: (tmp / ".metadata").write_bytes(b"x"),
                          meta={"model": identity(theirs), "step": 0})
    with pytest.raises(FolderError, match="hidden=32 in the checkpoint, 64 here"):
        launch(mine)  # refused here: nothing was started
