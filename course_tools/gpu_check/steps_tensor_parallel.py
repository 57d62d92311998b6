"""Step 9 of ``make gpu-check``: lessons 07-08's tensor-parallel FFN.

The source's ``tp_demo`` command, the shards, tp ranks (NCCL, one GPU per rank) with a
training step, and DTensor, each proven equal to the native FFN; native vs tp timings.
One launch does every world size (lesson 08's sweep: native on rank 0, then each world
size p on ranks 0 .. p-1, DTensor on every rank); ``--smoke`` runs it on one rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from course_tools.gpu_check.context import Context
from helpers.core.paths import REPO_ROOT
from helpers.runs.tp_ffn.results import NativeRun, TPRun
from helpers.tensor_parallel.dtensor import DTensorRun


def demo_args(ctx: Context) -> list[str]:
    """The source's documented flags at this run's FFN sizes (--smoke: tiny, float32, CPU)."""
    f = ctx.profile.ffn
    flags = {"hidden_size": f.hidden_size, "ffn_size": f.ffn_size, "seq_len": f.seq_len,
             "batch_size": f.batch_size, "world_size": f.world_size, "device": "cuda"}  # fmt: skip
    if ctx.smoke:
        flags |= {"device": "cpu", "dtype": "float32", "iters": f.iters, "warmup": f.warmup}
    return [word for name, value in flags.items() for word in (f"--{name}", str(value))]


def run_demo_command(ctx: Context, json_path: Path | None = None) -> dict:
    """The source's ``python -m helpers.tp_demo ...`` as a subprocess: its [INFO] lines.

    With ``json_path`` the command also writes its native result there (``--json``).
    """
    args = demo_args(ctx)
    env = None
    if ctx.smoke:
        args += ["--shard_dir", str(ctx.scratch / "tp_demo_shards")]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread, like every smoke process
    if json_path is not None:
        args += ["--json", str(json_path)]
    cmd = [sys.executable, "-m", "helpers.tp_demo", *args]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    info = [line for line in proc.stdout.splitlines() if line.startswith("[INFO]")]
    checks = [line for line in info if line.startswith("[INFO] check:")]
    for line in info:
        print(line)
    return {
        "command": "python -m helpers.tp_demo " + " ".join(args),
        "returncode": proc.returncode,
        "info": info,
        "stderr_tail": proc.stderr.splitlines()[-10:] if proc.returncode else [],
        "agrees": proc.returncode == 0 and bool(checks) and all(c.endswith("OK") for c in checks),
    }


def tp_world_sizes(ctx: Context) -> list[int]:
    """1 and every power of two up to the GPU count (one GPU per rank).

    The smoke run takes world size 1 on gloo: the path a one-GPU machine takes with NCCL
    (two gloo ranks are lesson 08's and the unit tests' own; the pipeline step launches two).
    """
    if ctx.device_type == "cpu":
        return [1]
    gpus = torch.cuda.device_count()
    return [p for p in (1, 2, 4, 8) if p <= gpus]


def tp_run_row(run: TPRun, native: NativeRun) -> dict:
    """One launch with the training step: timings, backend, elementwise and step proofs."""
    return {
        "world_size": run.world_size,
        "backend": run.backend,
        "device": run.device,
        "dtype": run.dtype,
        "tp_s": run.step.mean,
        "tp_std_s": run.step.std,
        "native_s": native.timing.mean,
        "tp_over_native": run.step.mean / native.timing.mean,
        "compute_s": run.compute.mean,
        "allreduce_s": run.allreduce.mean,
        "ring_bytes_per_rank": run.ring_bytes,  # what a ring (NCCL's) sends per all-reduce
        "wire": [w.to_dict() for w in run.wire],  # None with the reason on NCCL
        "output_max_diff": run.output.max_diff,
        "output_tolerance": run.output.tolerance,
        "output_agrees": run.agrees(native),
        "train_step_agrees": run.train_step.ok,
        "train_step_max_diff": {q.what: q.max_diff for q in run.train_step.proofs},
    }


def dtensor_figures(d: DTensorRun) -> dict:
    """parallelize_module on the same ranks: its shards equal the files, its output the hand tp."""
    return {
        "world_size": d.world_size,
        "backend": d.backend,
        "local_shards_equal_files": d.shards_equal_files,
        "max_diff_vs_hand_tp": d.vs_hand.max_diff,
        "tolerance": d.vs_hand.tolerance,
        "mean_s": d.timing.mean,
        "agrees": d.ok,
    }


def step_tensor_parallel(ctx: Context, fig: dict) -> None:
    """tp_demo's command; shards; tp ranks and DTensor proven equal to native; timings."""
    from helpers.runs.contract import launch
    from helpers.runs.tp_ffn.config import TPFFNConfig
    from helpers.runs.tp_ffn.shard_files import write_all_shards

    fig["demo"] = run_demo_command(ctx)
    sizes = tp_world_sizes(ctx)
    if ctx.device_type == "cuda" and torch.cuda.device_count() < 2:
        fig["skipped_world_sizes"] = "2..N: one GPU here, and NCCL never gets two ranks on one GPU"
    # every world size in one launch; the largest also proves parallelize_module
    config = TPFFNConfig.for_profile(ctx.profile, ranks=max(sizes), sweep=tuple(sizes),
                                     train_step=True, dtensor=True)
    write_all_shards(config, sizes)
    sweep = launch(config, timeout=300 * len(sizes))
    native = sweep.native
    fig["native"] = {
        "dtype": native.dtype,
        "mean_s": native.timing.mean,
        "std_s": native.timing.std,
        "tp_simulate_max_diff": native.simulate.max_diff,
        "tp_simulate_agrees": native.simulate.ok,
    }
    fig["runs"] = []
    runs = sweep.runs
    for p in sizes:
        fig["runs"].append(tp_run_row(runs[p], native))
        print({k: v for k, v in fig["runs"][-1].items() if k != "train_step_max_diff"})
    proofs = [
        ("tp_demo command", fig["demo"]["agrees"]),
        ("tp_simulate", native.simulate.ok),
    ]
    fig["dtensor"] = dtensor_figures(runs[max(sizes)].dtensor)
    proofs.append(("dtensor", fig["dtensor"]["agrees"]))
    problems = [
        f"tp p={r['world_size']}"
        for r in fig["runs"]
        if not (r["output_agrees"] and r["train_step_agrees"])
    ]
    problems += [name for name, ok in proofs if not ok]
    if problems:
        raise AssertionError(f"not proven equal to native: {', '.join(problems)}")
