"""The expert-parallel step of ``make gpu-check``: lesson 11's MoE layer, its experts split
over one GPU per rank (NCCL), proven against one process in float64.

On CUDA: ep = 2, then 4 and 8 where that many GPUs are present (one launch each), and at
ep = 2 once more with a capacity limit and a shared expert (tokens dropped where the
experts are, as one process drops them). Every launch must prove output, auxiliary loss
and every gradient equal to one process's within the derived bound, and every rank's
bytes, counted at the dispatcher, equal to what its routing predicts. Recorded beside
them: each rank's dispatch and combine all-to-all times (mean and std over the timed
calls, the warm-up excluded) beside the alpha-beta fit of ``all_to_all_single`` on the
same GPUs, its pass time, the rows it received and kept, and the imbalance. With one GPU:
ep = 1, nothing is split or sent and nothing timed (the launch proves the code path: CUDA
tensors, NCCL, the proofs). ``--smoke``: the capacity launch on two gloo ranks on the CPU
at tiny sizes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from course_tools.gpu_check.context import Context, StepSkipped
from course_tools.gpu_check.steps_transformer_tp import native_api_missing

if TYPE_CHECKING:
    from helpers.runs.expert_parallel.config import EPLayerConfig
    from helpers.runs.expert_parallel.results import EPLayerResult

# what the dispatcher calls (helpers.expert_parallel.dispatch)
API = (("torch.distributed", "all_to_all_single"), ("torch.distributed", "all_reduce"))
EP_CHOICES = (2, 4, 8)
# the layer's sizes: full (one launch per ep) and smoke (the capacity launch only)
# (a2a_sizes: bytes each rank sends in the all-to-all fit's calls)
FULL = {"experts": 8, "top_k": 2, "hidden": 256, "ffn": 512, "tokens": 1024, "repeats": 10,
        "warmup": 2, "a2a_sizes": (2**12, 2**16, 2**20, 2**24), "a2a_repeats": 20}
SMOKE = {"experts": 4, "top_k": 2, "hidden": 16, "ffn": 32, "tokens": 16, "repeats": 2,
         "warmup": 1, "a2a_sizes": (2**10, 2**13), "a2a_repeats": 3}
CAPACITY = {"capacity_factor": 1.0, "shared": True}  # the launch that drops
TIMEOUT_S = 300.0
ONE_RANK_NOTE = (
    "ep=1 (one GPU): every expert on the one rank, nothing is split and every collective "
    "sends nothing; the launch proves only the code path (CUDA tensors, NCCL, the proofs "
    "against one process)"
)
NO_SLOPE = ("the fitted slope beta is not > 0 (the sizes' times differ by less than "
            "their noise): no bandwidth")


def ep_sizes(gpus: int) -> tuple[int, ...]:
    """The expert-parallel sizes to launch with ``gpus`` GPUs (0: the CPU rehearsal)."""
    if gpus < 0:
        raise ValueError(f"gpus={gpus!r}; valid: an integer >= 0")
    if gpus == 1:
        return (1,)
    return tuple(ep for ep in EP_CHOICES if ep <= gpus) if gpus else (2,)


def configs(eps: tuple[int, ...], device: str, smoke: bool) -> dict[str, EPLayerConfig]:
    """The step's launches by name: one per ep of ``eps``, and at the first with a capacity
    limit and a shared expert (``--smoke``: that one only)."""
    from helpers.runs.expert_parallel.config import EPLayerConfig

    sizes = SMOKE if smoke else FULL
    runs = {} if smoke else {f"ep={ep}": EPLayerConfig(ep=ep, device=device, **sizes)
                             for ep in eps}
    runs[f"ep={eps[0]}, capacity {CAPACITY['capacity_factor']}, shared"] = EPLayerConfig(
        ep=eps[0], device=device, **sizes, **CAPACITY)
    return runs


def rank_figures(result: EPLayerResult) -> list[dict]:
    """Per rank: the rows it received and kept, its all-to-all bytes counted and predicted
    (forward + backward), and its pass time (mean and std over the timed passes)."""
    rows = []
    for side in result.ranks:
        counted = side.forward.get("all_to_all", 0.0) + side.backward.get("all_to_all", 0.0)
        rows.append({
            "rank": side.rank, "experts": side.experts, "received_rows": sum(side.arrived),
            "kept_rows": sum(side.kept), "all_to_all_bytes": counted,
            "predicted_all_to_all_bytes": result.predicted(side.rank).all_to_all,
            "bytes_as_predicted": result.rank_as_predicted(side),
            "pass_mean_ms": round(side.mean_ms, 4), "pass_std_ms": round(side.std_ms, 4),
        })
    return rows


def all_to_all_figures(result: EPLayerResult) -> dict:
    """The alpha-beta fit of ``all_to_all_single`` on the launch's group, and the layer's
    dispatch and combine timed per rank (mean and std, warm-up excluded) beside it, then
    the call as a whole (the slowest rank per repeat); at ep = 1 nothing is sent, so
    nothing is timed."""
    if not result.a2a_sent:
        return {"note": f"ep={result.ep}: no other rank, no all-to-all to time"}
    fit = result.a2a_fit
    finite = math.isfinite(fit.bandwidth)
    return {
        "fit": {"sizes_bytes": result.a2a_sent, "alpha_us": round(fit.alpha_s * 1e6, 3),
                "gb_per_s": round(fit.bandwidth / 1e9, 4) if finite else None,
                "relative_residuals": [round(r, 4) for r in fit.relative_residuals],
                **({} if finite else {"note": NO_SLOPE})},
        "calls": [{"call": row.call, "who": row.who, "sent_bytes": row.sent,
                   "received_bytes": row.received, "mean_ms": round(row.mean_ms, 4),
                   "std_ms": round(row.std_ms, 4), "fit_ms": round(row.predicted_ms, 4)}
                  for row in result.a2a_rows()],
    }


def run_figures(result: EPLayerResult) -> dict:
    """One launch: verdicts, the worst difference over its bound, drops, imbalance, ranks
    and all-to-all times."""
    return {
        **result.verdicts, "worst_ratio": round(result.worst_ratio, 6),
        "capacity": result.capacity, "dropped": result.dropped,
        "dropped_one_process": result.reference_dropped,
        "imbalance_experts": round(result.imbalance, 4),
        "imbalance_ranks": round(result.rank_imbalance, 4), "ranks": rank_figures(result),
        "all_to_all": all_to_all_figures(result),
    }


def dispatch_line(f: dict) -> str:
    """Each rank's dispatch time, for the step's printed line."""
    calls = f["all_to_all"].get("calls")
    if not calls:
        return f["all_to_all"]["note"]
    return "dispatch ms " + ", ".join(f"{c['who']} {c['mean_ms']:.3f} ± {c['std_ms']:.3f}"
                                      for c in calls if c["call"] == "dispatch")


def step_expert_parallel(ctx: Context, fig: dict) -> None:
    """Lesson 11's MoE layer on the GPUs present: proofs, bytes, per-rank times."""
    from helpers.runs.contract import launch

    missing = native_api_missing(API)
    if missing:
        raise StepSkipped(missing)
    gpus = torch.cuda.device_count() if ctx.device_type == "cuda" else 0
    eps = ep_sizes(gpus)
    runs = configs(eps, "cuda" if gpus else "cpu", ctx.smoke)
    layer = {k: getattr(next(iter(runs.values())), k) for k in FULL}
    layer["a2a_sizes"] = list(layer["a2a_sizes"])
    fig.update(gpus=gpus, backend="nccl" if gpus else "gloo", dtype="float64", ep=list(eps),
               layer=layer)
    if eps == (1,):
        fig["note"] = ONE_RANK_NOTE
    fig["runs"] = {}
    for name, config in runs.items():
        result = launch(config, nproc=config.ep, timeout=TIMEOUT_S)
        fig["runs"][name] = f = run_figures(result)
        print(f"{name}: proven {f['proven']} (worst {f['worst_ratio']:.2g} of the bound), "
              f"bytes {f['bytes_as_predicted']}, dropped {f['dropped']} (one process "
              f"{f['dropped_one_process']}); {dispatch_line(f)}", flush=True)
    failed = [name for name, f in fig["runs"].items()
              if not (f["proven"] and f["bytes_as_predicted"] and f["drops_as_one_device"])]
    if failed:
        raise AssertionError(f"expert parallelism not equal to one process, or its bytes "
                             f"not as its routing predicts: {failed}")
