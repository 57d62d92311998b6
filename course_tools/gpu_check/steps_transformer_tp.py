"""Step 10 of ``make gpu-check``: lesson 09's tensor-parallel Llama (GQA, RoPE, vocab split).

The lesson's worker on one GPU per rank (NCCL) at the full profile's sizes, tp the largest
of 4, 2, 1 that the GPUs and the sizes allow, without and with sequence parallelism:
each mode's proofs against one process, the collectives issued (their bytes by the ring
formula and by gloo's algorithms) against the plan, what the sockets sent (nothing to read
with NCCL: recorded as None with the reason), activation bytes kept measured beside
predicted, the weights each rank holds, and mean +- std of step, communication and
computation times. With tp > 1 the same launch proves ``parallelize_module`` and
``loss_parallel`` equal to the hand split; if that part fails (or this torch lacks the
API) the launch runs again without it and the reason is recorded. ``--smoke``: two gloo
ranks on the CPU at the smoke profile's sizes.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import asdict, replace
from typing import TYPE_CHECKING

import torch

from course_tools.gpu_check.context import Context
from helpers.core.errors import LaunchError

if TYPE_CHECKING:
    from helpers.runs.tp_llama.config import LlamaTPConfig
    from helpers.runs.tp_llama.results import LlamaTPResult, ModeRun

TP_CHOICES = (4, 2, 1)
SMOKE_RANKS = 2
TIMEOUT_S = 240.0
ONE_RANK_NOTE = (
    "tp=1 (one GPU): nothing is split and every collective sends nothing, so the byte "
    "counts are 0 and the held weights are the whole model; the launch proves only the "
    "code path (NCCL, CUDA tensors, the proofs against one process)"
)
# what the worker's native part imports (helpers.tensor_parallel.plans, runs.tp_llama.step)
NATIVE_API = (
    ("torch.distributed.device_mesh", "init_device_mesh"),
    ("torch.distributed.tensor", "Replicate"),
    ("torch.distributed.tensor", "Shard"),
    ("torch.distributed.tensor.parallel", "parallelize_module"),
    ("torch.distributed.tensor.parallel", "loss_parallel"),
    ("torch.distributed.tensor.parallel", "ColwiseParallel"),
    ("torch.distributed.tensor.parallel", "RowwiseParallel"),
    ("torch.distributed.tensor.parallel", "SequenceParallel"),
    ("torch.distributed.tensor.parallel", "PrepareModuleInput"),
)
MODE_NAMES = {"False": "TP", "True": "TP + SP", "one process": "one process"}


# --- the launch -------------------------------------------------------------------------


def largest_tp(config: LlamaTPConfig, gpus: int) -> int:
    """The largest of 4, 2, 1 that is at most ``gpus`` and splits ``config``'s model."""
    for tp in (t for t in TP_CHOICES if t <= gpus):
        try:
            replace(config, tp=None).validate(tp)
        except ValueError:
            continue
        return tp
    return 1


def tp_config(ctx: Context) -> LlamaTPConfig:
    """The lesson's launch at this run's profile: both modes, timed, the one process too;
    tp from the visible GPUs (two gloo ranks for ``--smoke``); native only when tp > 1."""
    from helpers.runs.tp_llama.config import LlamaTPConfig

    config = LlamaTPConfig.for_profile(ctx.profile, device=ctx.device_type, both=True,
                                       time_one_process=True)
    gpus = SMOKE_RANKS if ctx.device_type == "cpu" else torch.cuda.device_count()
    tp = largest_tp(config, gpus)
    return replace(config, tp=tp, native=tp > 1)


def native_api_missing(api: tuple[tuple[str, str], ...] | None = None) -> str | None:
    """What this torch lacks of ``api`` (default: the native API the worker uses), or None."""
    for module, name in NATIVE_API if api is None else api:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as error:
            return f"torch {torch.__version__} lacks {module}.{name} ({type(error).__name__})"
    return None


def error_lines(error: Exception, keep: int = 3) -> str:
    """A launch error in short: its first line and the first exception lines of the logs."""
    lines = str(error).splitlines()
    found = [ln.strip() for ln in lines[1:] if re.search(r"[\w.]*(Error|Exception): ", ln)]
    return " | ".join(dict.fromkeys([lines[0] if lines else "", *found[:keep]]))[:800]


def launch_with_native(config: LlamaTPConfig, timeout: float = TIMEOUT_S
                       ) -> tuple[LlamaTPResult, str]:
    """(result, the native part's outcome). The native part runs inside the ranks, so if
    it raises the launch fails: then the launch runs again without it, and says why."""
    from helpers.runs.contract import launch

    nproc = config.tp or 1
    if not config.native:
        return launch(config, nproc=nproc, timeout=timeout), "not run at tp=1"
    missing = native_api_missing()
    if missing:
        config = replace(config, native=False)
        return launch(config, nproc=nproc, timeout=timeout), f"skipped: {missing}"
    try:
        return launch(config, nproc=nproc, timeout=timeout), "ok"
    except LaunchError as error:
        reason = f"skipped: the launch with native=True failed ({error_lines(error)}); rerun without"
        print(reason)
        return launch(replace(config, native=False), nproc=nproc, timeout=timeout), reason


# --- what is recorded -------------------------------------------------------------------


def measured_predicted(measured: dict | int, predicted: dict | int) -> dict:
    """Measured beside predicted, whether they are equal, and (per key) where they differ."""
    out = {"measured": measured, "predicted": predicted, "match": measured == predicted}
    if isinstance(measured, dict):
        out["difference"] = difference(measured, predicted)
    return out


def difference(measured: dict, predicted: dict) -> dict:
    """measured - predicted, per key where they differ."""
    keys = [*measured, *(k for k in predicted if k not in measured)]
    return {k: d for k in keys if (d := measured.get(k, 0) - predicted.get(k, 0))}


def whole(counts: dict[str, float]) -> dict[str, float | int]:
    """Byte counts as integers where they are whole (the report prints them in full)."""
    return {k: int(v) if float(v).is_integer() else v for k, v in counts.items()}


def mode_figures(mode: ModeRun) -> dict:
    """One mode: verdict, proof lines, the calls issued and their bytes (the ring formula
    on the issued sizes against the plan's; gloo's algorithms likewise), what each rank's
    sockets sent (None on NCCL, with the reason), activations kept, weights held."""
    sent, predicted = whole(mode.ring), whole(mode.planned_ring)
    total = measured_predicted(sum(sent.values()), sum(predicted.values()))
    return {
        "ok": mode.ok,
        "proofs": {p.what: p.line() for p in mode.proofs},  # a dict: Markdown shows it plain
        "native_proofs": {p.what: p.line() for p in mode.native} if mode.native else None,
        "calls": mode.calls,
        "as_planned": mode.as_planned,
        "sent_bytes": {**measured_predicted(sent, predicted), "total": total},
        "gloo_bytes": measured_predicted(whole(mode.gloo), whole(mode.planned_gloo)),
        "wire": [w.to_dict() for w in mode.wire],
        "native_kept_bytes_per_part": mode.native_kept,
        "kept_bytes_per_part": measured_predicted(mode.kept, mode.predicted_kept),
        "held_elements": measured_predicted(mode.held, mode.predicted_held),
    }


def timing_figures(result: LlamaTPResult) -> dict:
    """Mean and std of step, communication and computation seconds per mode."""
    out = {}
    for key, times in (result.timing or {}).items():
        row = {"steps": len(times.step_s)}
        for what, values in (("step", times.step_s), ("comm", times.comm_s),
                             ("compute", times.compute_s)):
            row[f"{what}_mean_s"], row[f"{what}_std_s"] = times.mean_std(values)
        out[MODE_NAMES.get(key, key)] = row
    return out


def record(result: LlamaTPResult, native: str, fig: dict) -> None:
    """Everything the step records, into ``fig``."""
    fig.update(world_size=result.world_size, backend=result.backend,
               backend_reason=result.reason, parameters=result.parameters, native=native)
    if result.world_size == 1:
        fig["note"] = ONE_RANK_NOTE
    fig["verdicts"] = result.verdicts()
    fig["one_process_kept_bytes"] = measured_predicted(
        result.one_process_kept, result.predicted_one_process_kept)
    fig["modes"] = {m.name: mode_figures(m) for m in result.modes}
    fig["timing"] = timing_figures(result)


def summary(fig: dict) -> str:
    """One line per mode and per timing row, for the console."""
    lines = [f"tp {fig['world_size']} ({fig['backend']}); verdicts {fig['verdicts']}; "
             f"native: {fig['native']}"]
    for name, m in fig["modes"].items():
        lines.append(f"{name}: ring formula {m['sent_bytes']['total']['measured']:.0f} B "
                     f"(planned {m['sent_bytes']['total']['predicted']:.0f}); kept match "
                     f"{m['kept_bytes_per_part']['match']}; held {m['held_elements']['measured']}")
    for name, t in fig["timing"].items():
        lines.append(f"{name}: step {t['step_mean_s'] * 1e3:.2f} +- {t['step_std_s'] * 1e3:.2f} "
                     f"ms, comm {t['comm_mean_s'] * 1e3:.2f} ms, compute "
                     f"{t['compute_mean_s'] * 1e3:.2f} ms")
    return "\n".join(lines)


def judge(result: LlamaTPResult) -> None:
    """On gloo (float32 on the CPU, the lesson's own setting) every proof, byte count and
    held count must equal its prediction; NCCL's runs on GPUs (other kernels, e.g. fused attention keeping other tensors) are
    recorded, not judged."""
    if result.backend != "gloo":
        return
    one = result.one_process_kept == result.predicted_one_process_kept
    problems = [] if one else ["the one-process kept bytes"]
    problems += [m.name for m in result.modes if not m.ok]
    if problems:
        raise AssertionError(f"lesson 09 not as predicted: {', '.join(problems)}; "
                             f"verdicts {result.verdicts()}")


def step_transformer_tp(ctx: Context, fig: dict) -> None:
    """Lesson 09 on up to 4 GPUs: proofs, bytes, activations, held weights, timings."""
    config = tp_config(ctx)
    fig.update(profile=ctx.profile.name, device=config.device, tp=config.tp,
               model={**asdict(config.model), "seq": config.seq, "batch": config.batch},
               time_steps=config.time_steps, warmup=config.warmup)
    result, native = launch_with_native(config)
    record(result, native, fig)
    print(summary(fig))
    judge(result)
