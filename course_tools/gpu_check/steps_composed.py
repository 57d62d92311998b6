"""The last step of ``make gpu-check``: lesson 13's 3-D run (FSDP x tensor + sequence parallel x
pipeline, and the MoE model's ep x tp x pp) on one GPU per rank (NCCL).

With 8 GPUs, the lesson's own launch (every layout, the MoE one included, the checkpoint
round trip) at the full profile's sizes; with fewer, each of the lesson's layouts that fits
the GPUs, one launch each; with one GPU, the one-device run only (nothing is split: the proof checks the code
path on CUDA). Every run's verdict against one process (float64) must hold; the ledgers,
the calls and their bytes per mesh dimension and times are recorded beside their
predictions, not judged (other kernels keep other tensors on a GPU); NCCL's traffic does
not cross the sockets, so no wire bytes are read. ``--smoke``: tp=2 on two gloo ranks on
the CPU at the smoke sizes, judged in full (the wire included).
"""

from __future__ import annotations

import torch

from course_tools.gpu_check.context import Context, StepSkipped
from course_tools.gpu_check.steps_transformer_tp import native_api_missing

API = (
    ("torch.distributed.device_mesh", "DeviceMesh"),
    ("torch.distributed.fsdp", "fully_shard"),
    ("torch.distributed.pipelining", "Schedule1F1B"),
    ("torch.distributed.tensor.parallel", "loss_parallel"),
    ("torch.distributed.checkpoint.state_dict", "StateDictOptions"),
)
ONE_GPU_NOTE = (
    "one GPU: the one-device layout only; nothing is split and nothing is sent, so the run "
    "proves the code path (CUDA tensors, NCCL, the trainer) against the one-process model "
    "on the same GPU"
)


def run_figures(run) -> dict:
    """One layout's run: verdicts, differences, ledgers, bytes and times per dimension."""
    mean, std = run.step_time(0) if run.ranks[0].step_s else (0.0, 0.0)
    return {
        "ok": run.ok, "loss_max_diff": max(run.loss_diffs),
        "loss_max_fraction_of_tolerance": run.loss_share,
        "weight_diff": run.weight_diff, "weight_tolerance": run.weight_tolerance,
        "state_ok_all_ranks": all(r.state_ok for r in run.ranks),
        "sizes_ok_all_ranks": all(r.sizes_ok for r in run.ranks),
        "sent_ok_all_ranks": all(r.sent_ok for r in run.ranks),  # sizes, and wire if read
        "largest_activation_error": max((abs(r.activation_error) for r in run.ranks), default=0),
        "calls_rank0": run.ranks[0].traffic.calls,
        "ring_bytes_rank0": run.ranks[0].traffic.ring,
        "predicted_ring_bytes_rank0": run.ranks[0].predicted_ring,
        "wire_bytes_rank0": run.ranks[0].traffic.wire,
        "wire_note_rank0": run.ranks[0].traffic.wire_note,
        "comm_s_rank0": run.ranks[0].comm_s, "step_mean_s": mean, "step_std_s": std,
    }


def step_composed(ctx: Context, fig: dict) -> None:
    """Lesson 13 on up to 8 GPUs: every layout's proof, ledgers, bytes and times."""
    from helpers.runs.contract import launch
    from helpers.runs.llama_3d.config import SuiteConfig

    missing = native_api_missing(API)
    if missing:
        raise StepSkipped(missing)
    gpus = torch.cuda.device_count() if ctx.device_type == "cuda" else 0
    suite = SuiteConfig.for_profile(ctx.profile, device="cuda" if gpus else "cpu")
    fig.update(profile=ctx.profile.name, gpus=gpus, dtype=suite.dtype, steps=suite.steps,
               model={**{k: getattr(suite.model, k) for k in ("vocab", "hidden", "heads",
                                                              "kv_heads", "ffn", "blocks")},
                      "seq": suite.seq, "batch": suite.batch})
    if gpus >= 8:
        result = launch(suite)
        runs = {r.name: r for r in result.runs}
        fig["checkpoint_round_trip"] = {"dp x tp resumed from 3-D": run_figures(result.two_d),
                                        "3-D resumed from dp x tp": run_figures(result.back)}
    else:
        configs = suite.configs()  # the dense layouts, then the MoE one
        configs = ([c for c in configs if c.layout.world_size <= gpus] if gpus
                   else [configs[2]])  # tp=2
        if gpus == 1:
            fig["note"] = ONE_GPU_NOTE
        runs = {c.name: launch(c, timeout=300) for c in configs}
    fig["runs"] = {name: run_figures(run) for name, run in runs.items()}
    for name, f in fig["runs"].items():
        print(f"{name}: ok {f['ok']}, loss |diff| {f['loss_max_diff']:.1e}, weights "
              f"{f['weight_diff']:.1e} (tol {f['weight_tolerance']:.1e}), step "
              f"{f['step_mean_s'] * 1e3:.1f} ms, comm {f['comm_s_rank0']}")
    failed = [name for name, run in runs.items() if not run.ok]
    if not gpus:  # gloo on the CPU: the lesson's own setting, judged in full
        failed += [name for name, run in runs.items()
                   if not all(r.ledger_ok and r.sent_ok for r in run.ranks)]
    if failed:
        raise AssertionError(f"lesson 13's runs not equal to one process (or, on the CPU, not "
                             f"as predicted): {failed}")
