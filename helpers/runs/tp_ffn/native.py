"""The source's native mode: time the whole FFN, write the shards, sum the ranks in one process.

Also the source's printed line, ``[INFO] tag: shape:...,sum:...[,mean:...,min:...,max:...]``,
shared with the tensor-parallel ranks.
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from helpers.core.devices import dtype_name, resolve_device, resolve_dtype
from helpers.core.paths import display_path
from helpers.core.timing import Timing, measure
from helpers.runs.tp_ffn.config import DemoConfig, build_model
from helpers.tensor_parallel.ffn import tp_simulate
from helpers.tensor_parallel.proofs import checksum, checksum_tolerance, outputs_agree
from helpers.tensor_parallel.shards import load_shard, write_shards


def info_line(tag: str, out: torch.Tensor, total: float, timing: Timing | None = None) -> str:
    """The source's ``[INFO]`` line for an output, with its timing statistics if given."""
    line = f"[INFO] {tag}: shape:{out.shape},sum:{total:.5f}"
    if timing is not None:
        line += f",mean:{timing.mean:.5f},min:{timing.min:.5f},max:{timing.max:.5f}"
    return line


def run_native_mode(config: DemoConfig, *, verbose: bool = True, write: bool = True) -> dict:
    """Native mode: time the FFN, write the shards, check the one-process simulation.

    ``write=False`` reads shards written before (as ``ffn_worker --sweep``'s rank 0 does).
    """
    config.validate()
    device, dtype = resolve_device(config.device), resolve_dtype(config.dtype)
    p, folder = config.world_size, config.folder()
    model = build_model(config)  # float32 on the CPU: the shard bytes do not depend on --device
    if write:
        write_shards(model, p, folder)
    x = config.input_batch(dtype, device)
    model = model.to(device, dtype).eval()
    with torch.inference_mode():
        timing = measure(
            lambda: model(x), repeats=config.iters - config.warmup, warmup=config.warmup
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
    return {
        "mode": "native",
        "config": asdict(config),
        "world_size": p,
        "backend": None,
        "device": str(device),
        "dtype": dtype_name(dtype),
        "shape": list(out.shape),
        "checksum": total,
        "abs_sum": abs_total,
        "checksum_tolerance": checksum_tolerance(abs_total, dtype),
        "tp_simulate_checksum": sim_total,
        "tp_simulate_max_diff": diff,
        "tp_simulate_tolerance": tol,
        "tp_simulate_agrees": agree,
        "shard_dir": display_path(folder),
        "threads": torch.get_num_threads(),
        **timing.as_dict(),
    }
