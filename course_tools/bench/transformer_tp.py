"""``make bench``'s ``transformer_tp`` section: lesson 09's launch at a larger size.

On 4 or more GPUs the full profile's Llama (vocab 32002, hidden 1024, 4 blocks, 4 x 256
tokens) with NCCL. On the CPU that model's step takes seconds per rank and 4 ranks share
the cores, so the section keeps the full profile's heads, batch and a padded vocabulary
but a middle model (vocab 8002, hidden 512, MLP 1408, 128 tokens: about 19 M parameters),
on gloo ranks. tp = 2 and 4, without and with sequence parallelism, each timed; the tp = 2
launch also times the one-process model. Chart: ``results/transformer_tp_bench.png``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace

import matplotlib.pyplot as plt
import numpy as np
import torch

from helpers.core.paths import display_path, results_path
from helpers.core.plotting import save_figure
from helpers.profiles import PROFILES
from helpers.runs.contract import launch
from helpers.runs.tp_llama.config import LlamaTPConfig
from helpers.runs.tp_llama.results import LlamaTPResult, ModeRun, StepTimes

FULL = PROFILES["full"]
TP_SIZES = (2, 4)
CPU_MODEL = {"vocab": 8002, "hidden": 512, "ffn": 1408}
CPU_RUN = {"seq": 128, "time_steps": 5}
CHART = "transformer_tp_bench.png"
MODE_KEYS = {"TP": "False", "TP + SP": "True"}


def bench_config(cuda: bool | None = None) -> LlamaTPConfig:
    """Both modes, timed: the full profile's Llama on GPUs, the middle model on the CPU."""
    cuda = torch.cuda.device_count() >= max(TP_SIZES) if cuda is None else cuda
    config = LlamaTPConfig.for_profile(FULL, device="cuda" if cuda else "cpu", both=True)
    return config if cuda else replace(config, model=replace(config.model, **CPU_MODEL),
                                       **CPU_RUN)


def times_figures(times: StepTimes) -> dict:
    """Mean and std of the step, communication and computation seconds."""
    out: dict = {"steps": len(times.step_s)}
    for what, values in (("step", times.step_s), ("comm", times.comm_s),
                         ("compute", times.compute_s)):
        out[f"{what}_mean_s"], out[f"{what}_std_s"] = times.mean_std(values)
    return out


def mode_figures(mode: ModeRun, times: StepTimes) -> dict:
    """One tp and mode: times, bytes (ring formula, gloo's algorithms, each rank's sockets)
    and activation bytes (rank 0) against predicted."""
    return {
        **times_figures(times),
        "ok": mode.ok,
        "ring_bytes": sum(mode.ring.values()),
        "planned_ring_bytes": sum(mode.planned_ring.values()),
        "gloo_bytes": sum(mode.gloo.values()),
        "ring_per_collective": mode.ring,
        "wire_bytes_per_rank": [w.sent for w in mode.wire],
        "activation_bytes_per_rank": sum(mode.kept.values()),
        "predicted_activation_bytes_per_rank": sum(mode.predicted_kept.values()),
        "activation_bytes_per_part": mode.kept,
        "held_elements_per_rank": mode.held,
        "predicted_held_elements_per_rank": mode.predicted_held,
    }


def run_figures(result: LlamaTPResult) -> dict:
    """Every mode of one launch, by name."""
    timing = result.timing or {}
    return {m.name: mode_figures(m, timing[MODE_KEYS[m.name]]) for m in result.modes}


def sizes_title(config: LlamaTPConfig, backend: str) -> str:
    """The chart's title: the model, the batch, the backend."""
    m = config.model
    return (f"Llama: vocab {m.vocab}, hidden {m.hidden}, {m.heads} heads "
            f"({m.kv} kv), MLP {m.ffn}, {m.blocks} blocks\n"
            f"batch {config.batch} x {config.seq} tokens; {backend}"
            + (", one thread per rank" if backend == "gloo" else ""))


def tp_chart(per_tp: dict, one: dict, title: str, path: str) -> str:
    """Stacked bars per tp and mode, computation below communication, std on the top;
    the one-process step as a dashed line."""
    rows = [(f"tp={tp}\n{mode}", row) for tp, modes in per_tp.items() for mode, row in modes.items()]
    x = np.arange(len(rows))
    compute = [r["compute_mean_s"] for _, r in rows]
    comm = [r["comm_mean_s"] for _, r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.bar(x, compute, color="tab:blue", label="computation (step - communication)")
    ax.bar(x, comm, bottom=compute, color="tab:orange", label="communication (in collectives)")
    ax.errorbar(x, [r["step_mean_s"] for _, r in rows], yerr=[r["step_std_s"] for _, r in rows],
                fmt="none", ecolor="black", capsize=4, label="step, mean +- std")
    ax.axhline(one["step_mean_s"], color="gray", linestyle="--", label="one process (tp = 1)")
    ax.set_xticks(x, [name for name, _ in rows])
    ax.set_xlabel("tensor-parallel size and mode (SP: sequence parallelism)")
    ax.set_ylabel("seconds per training step (s)")
    ax.set_ylim(bottom=0)
    ax.grid(True, axis="y", alpha=0.4)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return display_path(save_figure(fig, path))


def transformer_tp_section(config: LlamaTPConfig | None = None,
                           tp_sizes: tuple[int, ...] = TP_SIZES) -> dict:
    """The ``transformer_tp`` section of bench.json: one launch per tp, the chart."""
    config = config or bench_config()
    per_tp, launches, one, backend, parameters = {}, {}, None, "", 0
    for tp in tp_sizes:
        start = time.perf_counter()
        result = launch(replace(config, tp=tp, time_one_process=one is None),
                        nproc=tp, timeout=1800)
        launches[tp] = {"seconds": time.perf_counter() - start, "verdicts": result.verdicts()}
        per_tp[tp] = run_figures(result)
        if one is None:
            one = times_figures((result.timing or {})["one process"])
        backend, parameters = result.backend, result.parameters
    title = sizes_title(config, backend)
    return {
        "model": {**asdict(config.model), "seq": config.seq, "batch": config.batch},
        "parameters": parameters,
        "device": config.device,
        "backend": backend,
        "threads_per_rank": 1,
        "time_steps": config.time_steps,
        "warmup": config.warmup,
        "verdicts_ok": all(v["verdicts"]["all"] for v in launches.values()),
        "launches": {str(tp): v for tp, v in launches.items()},
        "one_process": one,
        "per_tp": {str(tp): modes for tp, modes in per_tp.items()},
        "chart": tp_chart(per_tp, one, title, results_path(CHART)),
    }
