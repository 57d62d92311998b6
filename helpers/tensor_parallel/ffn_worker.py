"""One rank of the tensor-parallel FFN, as launched by ``torchrun``.

    torchrun --nproc-per-node=P -m helpers.tensor_parallel.ffn_worker [tp_demo's flags] [--train_step]

Each rank loads only its shard files and computes ``g(shard(f(x)))`` with the f and g
of ``helpers.tensor_parallel.comm``. It times the forward (compute and all-reduce apart),
proves its full output equal to the native FFN element by element, and with
``--train_step`` takes one SGD step through f and g and proves its updated shard equal
to the matching slice of the one-process model after the same step.
"""

from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch import nn

from helpers.core.devices import dtype_name, resolve_dtype
from helpers.core.timing import Timing, synchronized_clock
from helpers.distributed.ranks import Rank, max_over_ranks, process_group, worker_main, write_result
from helpers.memory.measure import measure_training_memory
from helpers.tensor_parallel.comm import f, g, ring_allreduce_bytes, tp_forward
from helpers.tensor_parallel.config import DemoConfig, build_model, parser
from helpers.tensor_parallel.ffn import shard_vs_full
from helpers.tensor_parallel.native import info_line
from helpers.tensor_parallel.proofs import checksum, checksum_tolerance, output_tolerance
from helpers.tensor_parallel.shards import load_shard

MODULE = "helpers.tensor_parallel.ffn_worker"


def timed_forward(shard: nn.Module, x: torch.Tensor, iters: int, warmup: int):
    """``g(shard(f(x)))`` ``iters`` times; the clock is read before, between and after."""
    compute, reduce, total = [], [], []
    with torch.no_grad():
        for i in range(iters):
            dist.barrier()
            t0 = synchronized_clock()
            partial = shard(f(x))  # this rank's partial output: no communication
            t1 = synchronized_clock()
            out = g(partial)  # the sum over ranks
            t2 = synchronized_clock()
            if i >= warmup:
                compute.append(t1 - t0)
                reduce.append(t2 - t1)
                total.append(t2 - t0)
    return out, Timing("compute", compute), Timing("all-reduce", reduce), Timing("step", total)


def native_diff(config: DemoConfig, rank: Rank, out: torch.Tensor) -> tuple[float, float]:
    """(max |out - native| over all ranks and elements, tolerance); native recomputed here."""
    dtype = out.dtype
    native = build_model(config).to(rank.device, dtype).eval()
    with torch.no_grad():
        reference = native(config.input_batch(dtype, rank.device))
    diff = (out.double() - reference.double()).abs().max().item()
    return max_over_ranks(diff, rank), output_tolerance(reference, dtype, rank.world_size)


def train_step_check(config: DemoConfig, rank: Rank, activation: str, lr: float) -> dict:
    """One float32 SGD step through f and g vs the same step of the full model in one process."""
    folder = config.folder(rank.world_size)
    shard = load_shard(folder, rank.world_size, rank.rank, activation=activation).to(rank.device)
    full = build_model(config, activation).to(rank.device)
    target = torch.randn(
        config.batch_size, config.seq_len, config.hidden_size,
        generator=torch.Generator().manual_seed(config.seed + 1),
    ).to(rank.device)  # fmt: skip
    results = {}
    for name, model, forward in (
        ("tp", shard, lambda m, x: tp_forward(m, x)),
        ("full", full, lambda m, x: m(x)),
    ):
        x = config.input_batch(torch.float32, rank.device).requires_grad_()
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        out = forward(model, x)
        loss = nn.functional.mse_loss(out, target)
        loss.backward()  # through g (identity) and f (all-reduce of the input gradient)
        grads = (model.fc1.weight.grad.clone(), model.fc2.weight.grad.clone())
        optimizer.step()
        results[name] = (loss.detach(), out.detach(), x.grad, grads)
    (loss, out, x_grad, grads), (loss_ref, out_ref, x_grad_ref, grads_ref) = (
        results["tp"],
        results["full"],
    )
    rows = shard.rows()
    diffs = {
        "loss": abs(loss.item() - loss_ref.item()),
        "output": (out - out_ref).abs().max().item(),
        "input_grad": (x_grad - x_grad_ref).abs().max().item(),
        "grads": shard_vs_full(grads, grads_ref, rows),
        "weights": shard_vs_full(
            (shard.fc1.weight, shard.fc2.weight), (full.fc1.weight, full.fc2.weight), rows
        ),
    }
    p = rank.world_size
    tolerances = {
        "loss": output_tolerance(loss_ref, torch.float32, p),
        "output": output_tolerance(out_ref, torch.float32, p),
        "input_grad": output_tolerance(x_grad_ref, torch.float32, p),
        "grads": output_tolerance(torch.cat([t.flatten() for t in grads_ref]), torch.float32, p),
        "weights": output_tolerance(
            torch.cat([full.fc1.weight.flatten(), full.fc2.weight.flatten()]), torch.float32, p
        ),
    }
    worst = {k: max_over_ranks(v, rank) for k, v in diffs.items()}
    return {
        "activation": activation,
        "lr": lr,
        "loss": loss.item(),
        "max_diff": worst,
        "tolerance": tolerances,
        "agrees": all(worst[k] <= tolerances[k] for k in worst),
    }


class TensorParallelFFN(nn.Module):
    """A rank's whole forward, ``g(shard(f(x)))``, as one module (to measure its memory)."""

    def __init__(self, shard: nn.Module) -> None:
        super().__init__()
        self.shard = shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tp_forward(self.shard, x)


def rank_memory(config: DemoConfig, rank: Rank, shard: nn.Module) -> dict:
    """This rank's ledger for one float32 SGD step of ``g(shard(f(x)))`` with an MSE loss.

    ``helpers.memory.measure_training_memory`` on the rank's own process: what this rank
    holds, measured where it is held (weights and grads of its shard; activations it keeps).
    """
    model = TensorParallelFFN(copy.deepcopy(shard).float())
    x = config.input_batch(torch.float32, rank.device)
    target = torch.zeros_like(x)  # the values do not change the bytes
    return measure_training_memory(model, x, target).as_dict()


def run_tp_mode(
    config: DemoConfig, *, train_step: bool = False, activation: str = "none", lr: float = 0.1,
    verbose: bool = True,
) -> dict:  # fmt: skip
    """Tensor-parallel mode, one call per rank under ``torchrun``; returns this rank's result."""
    config.validate()
    dtype = resolve_dtype(config.dtype)
    with process_group(MODULE, device=config.device, backend=config.backend) as rank:
        world = rank.world_size
        shard = load_shard(config.folder(world), world, rank.rank).to(rank.device, dtype).eval()
        x = config.input_batch(dtype, rank.device)
        if verbose and rank.rank == 0:
            print(
                f"[INFO] backend: {rank.reason}; {world} ranks, each on {rank.device}, dtype {dtype_name(dtype)}"
            )
            if config.world_size != world:
                print(
                    f"[INFO] --world_size {config.world_size} ignored: torchrun started {world} ranks"
                )
        out, compute, reduce, total = timed_forward(shard, x, config.iters, config.warmup)
        diff, tol = native_diff(config, rank, out)
        total_sum, abs_sum = checksum(out)
        if verbose and rank.rank == 0:
            print(info_line("tp", out, total_sum, total), flush=True)
            print(
                f"[INFO] check: max |tp - native| = {diff:.3g} over all ranks and elements, "
                f"tolerance {tol:.3g}: {'OK' if diff <= tol else 'FAILED'}",
                flush=True,
            )
        result = {
            "mode": "tp",
            "config": asdict(config),
            "world_size": world,
            "backend": rank.backend,
            "backend_reason": rank.reason,
            "device": str(rank.device),
            "dtype": dtype_name(dtype),
            "shape": list(out.shape),
            "checksum": total_sum,
            "abs_sum": abs_sum,
            "checksum_tolerance": checksum_tolerance(abs_sum, dtype),
            "output_max_diff": diff,
            "output_tolerance": tol,
            "output_agrees": diff <= tol,
            "shard_dir": str(config.folder(world)),
            "threads": torch.get_num_threads(),
            "compute_times_s": compute.times,
            "allreduce_times_s": reduce.times,
            "allreduce_bytes_per_rank": ring_allreduce_bytes(
                out.numel() * out.element_size(), world
            ),
            **total.as_dict(),
        }
        result["memory"] = rank_memory(config, rank, shard)
        if train_step:
            result["train_step"] = train_step_check(config, rank, activation, lr)
        write_result(rank, result)
        dist.barrier()
        return result


def worker_parser() -> argparse.ArgumentParser:
    """tp_demo's flags plus the training step's."""
    ap = argparse.ArgumentParser(parents=[parser(f"torchrun ... -m {MODULE}")], add_help=False)
    ap.add_argument(
        "--train_step", action="store_true", help="also check one SGD step through f and g"
    )
    ap.add_argument(
        "--activation", default="none", help="between fc1 and fc2 in the step: none or gelu"
    )
    ap.add_argument("--lr", type=float, default=0.1, help="SGD learning rate of the step")
    return ap


def main(argv: list[str] | None = None) -> int:
    ns = worker_parser().parse_args(argv)
    config = DemoConfig.from_args(ns)
    return worker_main(
        MODULE,
        lambda: run_tp_mode(config, train_step=ns.train_step, activation=ns.activation, lr=ns.lr),
    )


if __name__ == "__main__":
    sys.exit(main())
