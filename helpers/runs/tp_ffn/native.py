"""The source's native mode: time the whole FFN, write the shards, sum the ranks in one process.

Also the source's printed line, ``[INFO] tag: shape:...,sum:...[,mean:...,min:...,max:...]``,
shared with the tensor-parallel ranks. ``helpers.tp_demo`` runs it alone; a sweep's rank 0
runs it before the world sizes.
"""

from __future__ import annotations

import torch

from helpers.core.checks import Proof
from helpers.core.devices import dtype_name, resolve_device, resolve_dtype
from helpers.core.paths import display_path
from helpers.core.timing import Timing, measure
from helpers.runs.tp_ffn.config import TPFFNConfig
from helpers.runs.tp_ffn.results import NativeRun
from helpers.tensor_parallel.ffn import tp_simulate
from helpers.tensor_parallel.proofs import checksum, outputs_agree
from helpers.tensor_parallel.shards import load_shard, write_shards


def info_line(tag: str, out: torch.Tensor, total: float, timing: Timing | None = None) -> str:
    """The source's ``[INFO]`` line for an output, with its timing statistics if given."""
    line = f"[INFO] {tag}: shape:{out.shape},sum:{total:.5f}"
    if timing is not None:
        line += f",mean:{timing.mean:.5f},min:{timing.min:.5f},max:{timing.max:.5f}"
    return line


def run_native(config: TPFFNConfig, world_size: int, *, verbose: bool = True,
               write: bool = True) -> NativeRun:
    """Native mode: time the FFN, write the shards for ``world_size`` ranks, check the
    one-process simulation against the whole FFN.

    ``write=False`` reads shards written before (as a sweep's rank 0 does).
    """
    config.validate(world_size)
    device, dtype = resolve_device(config.device), resolve_dtype(config.dtype)
    p, folder = world_size, config.folder(world_size)
    model = config.model()  # float32 on the CPU: the shard bytes do not depend on --device
    if write:
        write_shards(model, p, folder)
    x = config.input_batch(dtype, device)
    model = model.to(device, dtype).eval()
    with torch.inference_mode():
        timing = measure(
            lambda: model(x), repeats=config.iters - config.warmup, warmup=config.warmup,
            label="native",
        )
        out = model(x)
        total, abs_total = checksum(out)
        if verbose:
            print(f"[INFO] device: {device}, dtype: {dtype_name(dtype)}, input seed {config.seed}")
            print(info_line("native", out, total, timing), flush=True)
        shards = [load_shard(folder, p, r).to(device, dtype) for r in range(p)]
        simulated = tp_simulate(shards, x)
    sim_total, _ = checksum(simulated)
    diff, tol, agree = outputs_agree(out, simulated, dtype, p)
    if verbose:
        print(
            f"[INFO] shards: {p} rank(s), fc1_*.bin fc2_*.bin manifest.json in {display_path(folder)}"
        )
        print(info_line("tp_simulate", simulated, sim_total))
        print(
            f"[INFO] check: max |tp_simulate - native| = {diff:.3g} over all {out.numel()} "
            f"elements, {dtype_name(dtype)} tolerance {tol:.3g}: {'OK' if agree else 'FAILED'}",
            flush=True,
        )
    return NativeRun(dtype_name(dtype), tuple(out.shape), total, abs_total, timing,
                     Proof("tp_simulate", diff, tol))
