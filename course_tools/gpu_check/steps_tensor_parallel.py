"""Step 7 of ``make gpu-check``: lessons 06-07's tensor-parallel FFN.

The source's ``tp_demo`` command, the shards, tp ranks (NCCL, one GPU per rank) with a
training step, and DTensor, each proven equal to the native FFN; native vs tp timings.
``--smoke`` launches as few processes as cover the code: the demo command's own native
run stands in for the launched one, one rank runs tp, and DTensor is left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from course_tools.gpu_check.context import Context
from helpers.core.paths import REPO_ROOT
from helpers.core.timing import Timing

if TYPE_CHECKING:
    from helpers.tensor_parallel.config import DemoConfig


def _pick(result: dict, *keys: str) -> dict:
    return {k: result[k] for k in keys}


def run_demo_command(ctx: Context, json_path: Path | None = None) -> dict:
    """The source's ``python -m helpers.tp_demo ...`` as a subprocess: its [INFO] lines.

    With ``json_path`` the command also writes its native result there (``--json``).
    """
    args = ctx.sizes.demo_args.split()
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
    (two gloo ranks are lesson 07's and the unit tests' own; the pipeline step launches two).
    """
    if ctx.device_type == "cpu":
        return [1]
    gpus = torch.cuda.device_count()
    return [p for p in (1, 2, 4, 8) if p <= gpus]


def tp_run_row(config: DemoConfig, p: int, native: dict) -> dict:
    """launch_tp with the training step: timings, backend, elementwise and step proofs."""
    from helpers.tensor_parallel.runs import launch_tp

    r = launch_tp(config, p, train_step=True, timeout=300)
    step = r["train_step"]
    return {
        "world_size": p,
        "backend": r["backend"],
        "device": r["device"],
        "dtype": r["dtype"],
        "tp_s": r["mean_s"],
        "tp_std_s": r["std_s"],
        "native_s": native["mean_s"],
        "tp_over_native": r["mean_s"] / native["mean_s"],
        "compute_s": Timing("c", r["compute_times_s"]).mean,
        "allreduce_s": Timing("a", r["allreduce_times_s"]).mean,
        "output_max_diff": r["output_max_diff"],
        "output_tolerance": r["output_tolerance"],
        "output_agrees": r["output_agrees"],
        "train_step_agrees": step["agrees"],
        "train_step_max_diff": step["max_diff"],
    }


def dtensor_figures(config: DemoConfig, world_size: int) -> dict:
    """launch_dtensor: its shards equal the files, its output equals hand-made tp."""
    from helpers.tensor_parallel.runs import launch_dtensor

    d = launch_dtensor(config, world_size, timeout=300)
    out = _pick(
        d, "world_size", "backend", "local_shards_equal_files", "max_diff_vs_hand_tp", "tolerance"
    )
    out["mean_s"] = Timing("dtensor", d["times_s"]).mean
    out["agrees"] = d["local_shards_equal_files"] and d["max_diff_vs_hand_tp"] <= d["tolerance"]
    return out


def step_tensor_parallel(ctx: Context, fig: dict) -> None:
    """tp_demo's command; shards; tp ranks and DTensor proven equal to native; timings."""
    from helpers.tensor_parallel.runs import launch_native, sweep_config, write_all_shards

    demo_json = ctx.scratch / "tp_demo_native.json" if ctx.smoke else None
    if demo_json is not None:
        demo_json.unlink(missing_ok=True)  # never a previous run's
    fig["demo"] = run_demo_command(ctx, demo_json)
    sizes = tp_world_sizes(ctx)
    if ctx.device_type == "cuda" and torch.cuda.device_count() < 2:
        fig["skipped_world_sizes"] = "2..N: one GPU here, and NCCL never gets two ranks on one GPU"
    config = replace(sweep_config(sizes, ctx.sizes.tp_profile), **ctx.sizes.tp_overrides)

    def at(p: int) -> DemoConfig:
        return replace(config, world_size=p, shard_dir=str(ctx.scratch / "tp_shards" / f"world{p}"))

    for p in sizes:
        write_all_shards(at(p), [p])
    if demo_json is None:
        native = launch_native(at(max(sizes)), timeout=300)
    elif demo_json.exists():  # --smoke: the demo command ran the same FFN natively
        native = json.loads(demo_json.read_text())
        fig["native_from"] = "the tp_demo command (--smoke: one launch fewer)"
    else:
        raise AssertionError(f"the tp_demo command failed: {fig['demo']['stderr_tail']}")
    fig["native"] = _pick(
        native, "device", "dtype", "mean_s", "std_s", "tp_simulate_max_diff", "tp_simulate_agrees"
    )
    fig["runs"] = []
    for p in sizes:
        fig["runs"].append(tp_run_row(at(p), p, native))
        print({k: v for k, v in fig["runs"][-1].items() if k != "train_step_max_diff"})
    proofs = [
        ("tp_demo command", fig["demo"]["agrees"]),
        ("tp_simulate", native["tp_simulate_agrees"]),
    ]
    if ctx.smoke:
        fig["dtensor"] = {"skipped": "not in --smoke: two more processes for one more proof"}
    else:
        fig["dtensor"] = dtensor_figures(at(max(sizes)), max(sizes))
        proofs.append(("dtensor", fig["dtensor"]["agrees"]))
    problems = [
        f"tp p={r['world_size']}"
        for r in fig["runs"]
        if not (r["output_agrees"] and r["train_step_agrees"])
    ]
    problems += [name for name, ok in proofs if not ok]
    if problems:
        raise AssertionError(f"not proven equal to native: {', '.join(problems)}")
