"""The context-parallel step of ``make gpu-check``: one attention layer split over the
sequence, each variant proven against one process, and PyTorch's own context_parallel().

On CUDA: one GPU per rank (NCCL), cp = 2 when there are two GPUs, else 1 (nothing is
split: the step checks the code path on CUDA, and lets ``context_parallel()`` run its
flash-attention ring on a one-rank mesh beside the hand version). ``--smoke``: cp = 2 on
two gloo ranks on the CPU (the zig-zag ring and the all-gather), where
``context_parallel()`` must record why it cannot run.
"""

from __future__ import annotations

import torch

from course_tools.gpu_check.context import Context, StepSkipped
from course_tools.gpu_check.steps_transformer_tp import native_api_missing

API = (("torch.distributed.tensor.experimental", "context_parallel"),
       ("torch.distributed.device_mesh", "init_device_mesh"))
SEQ = {"full": 4096, "smoke": 64}


def step_context_parallel(ctx: Context, fig: dict) -> None:
    """Every variant proven on the GPUs present; per-rank times; the native API's verdict."""
    from helpers.context_parallel.traffic import VARIANTS
    from helpers.runs.context_parallel.config import CPAttentionConfig
    from helpers.runs.contract import launch

    missing = native_api_missing(API)
    if missing:
        raise StepSkipped(missing)
    gpus = torch.cuda.device_count() if ctx.device_type == "cuda" else 0
    cp = min(gpus, 2) if gpus else 2
    seq = SEQ["smoke" if ctx.smoke else "full"]
    fig.update(gpus=gpus, cp=cp, seq=seq)
    runs = {}
    # the smoke rehearsal runs two launches (the unit tests prove every variant in-process)
    for variant in (("zigzag", "allgather") if ctx.smoke else VARIANTS):
        config = CPAttentionConfig(variant=variant, seq=seq, hidden=512, heads=8, kv_heads=2,
                                   batch=1, causal=True, repeats=3, warmup=1,
                                   device="cuda" if gpus else "cpu", native=variant == "zigzag")
        result = launch(config, nproc=cp, timeout=300)
        runs[variant] = {
            "proven": result.proven.ok, "worst": result.proven.worst.max_diff,
            "bytes_as_predicted": result.bytes_as_predicted, "imbalance": result.imbalance,
            "rank_ms": [round(r.mean_ms, 3) for r in result.ranks],
            "native": result.native.to_dict() if result.native else None,
        }
        print(f"{variant}: proven {result.proven.ok} (worst {result.proven.worst.max_diff:.1e}), "
              f"bytes {result.bytes_as_predicted}, per-rank ms {runs[variant]['rank_ms']}")
    fig["runs"] = runs
    failed = [v for v, r in runs.items() if not (r["proven"] and r["bytes_as_predicted"])]
    if failed:
        raise AssertionError(f"context-parallel attention not equal to one process: {failed}")
