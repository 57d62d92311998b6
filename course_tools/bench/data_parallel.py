"""``make bench``'s ``data_parallel`` section: lesson 06's launch at a larger size.

On CUDA the full profile's model (vocab 32000, hidden 1024, 8 blocks, 8 x 256 tokens) on
2 GPUs with NCCL. On the CPU that model's eight steps per rank take too long on two cores,
so the section keeps the full profile's vocabulary, batch and collective sizes but a middle
model (hidden 512, 4 blocks, 128 tokens: about 50 M parameters), on 2 gloo ranks.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from helpers.models.llama import lm_config
from helpers.profiles import PROFILES
from helpers.runs.contract import launch
from helpers.runs.data_parallel.config import DataParallelConfig
from helpers.runs.data_parallel.results import DataParallelResult

FULL = PROFILES["full"]
CPU_MODEL = {"hidden": 512, "blocks": 4}  # the middle size, on the CPU
CPU_SEQ = 128
RANKS = 2


def bench_config(cuda: bool | None = None) -> DataParallelConfig:
    """The full profile's launch on 2 GPUs, or at the middle model size on the CPU."""
    cuda = torch.cuda.device_count() >= RANKS if cuda is None else cuda
    if cuda:
        return DataParallelConfig.for_profile(FULL, device="cuda")
    config = DataParallelConfig.for_profile(FULL, device="cpu")
    return replace(config, model=lm_config(config.model.vocab, **CPU_MODEL), seq=CPU_SEQ)


def collective_figures(result: DataParallelResult) -> dict:
    """Per collective: the alpha-beta fit against what rank 0 sent (and against the ring
    formula), its residuals, and every size's bytes three ways and timed calls."""
    ring = result.fits("ring")
    out = {}
    for name, fit in result.fits().items():
        out[name] = {
            "alpha_s": fit.alpha_s,
            "beta_s_per_byte": fit.beta_s_per_byte,
            "bandwidth_gb_s": fit.bandwidth / 1e9 if fit.beta_s_per_byte > 0 else None,
            "ring_beta_s_per_byte": ring[name].beta_s_per_byte,
            "relative_residuals": fit.relative_residuals,
            "sent_bytes": fit.sent_bytes,
            "median_s": fit.times_s,
            "raw": [row.to_dict() for row in result.sweep if row.collective == name],
        }
    return out


def ledger_figures(result: DataParallelResult) -> dict:
    """Rank 0's ledger per technique, measured and predicted, and whether they match."""
    measured, predicted = result.measured_ledgers(), result.predicted_ledgers()
    m, p = measured.as_dict(), predicted.as_dict()
    return {"match": measured.matches(predicted), "measured": m, "predicted": p,
            "rows_match": {row: all(m[row][k] == p[row][k] for k in m[row]) for row in m}}


def bytes_figures(result: DataParallelResult) -> dict:
    """What rank 0 sent per technique in one step: by the ring formula, by gloo's
    algorithms, on the wire, each over DDP's; and the verdict (calls as planned, wire in
    bounds)."""
    ddp = result.runs["DDP"].traffic
    checks = {c.run: c for c in result.traffic_checks()}
    out = {}
    for name, run in result.runs.items():
        t = run.traffic
        out[name] = {"calls": dict(t.calls()), "ring": t.total_ring, "gloo": t.total_gloo,
                     "wire": t.wire, "ring_x_ddp": t.total_ring / ddp.total_ring,
                     "gloo_x_ddp": t.total_gloo / ddp.total_gloo,
                     "wire_x_ddp": t.wire / ddp.wire if t.wire and ddp.wire else None,
                     "calls_as_planned": checks[name].calls_as_planned,
                     "wire_ok": checks[name].wire_ok}
    return out


def proof_figures(result: DataParallelResult) -> dict:
    """Each run's proofs (max |diff|, tolerance, verdict), the collectives' and no_sync's."""
    def rows(proofs: list) -> list[dict]:
        return [{**p.as_dict(), "ok": p.ok} for p in proofs]

    return {"runs": {name: rows(run.proofs) for name, run in result.runs.items()},
            "collectives": rows(result.collective_checks),
            "no_sync": rows(result.no_sync_proofs)}


def data_parallel_section(config: DataParallelConfig | None = None) -> dict:
    """The ``data_parallel`` section of bench.json: one launch, everything from it."""
    config = config or bench_config()
    start = time.perf_counter()
    result = launch(config, nproc=RANKS, timeout=1800)
    seconds = time.perf_counter() - start
    ledgers, sent = ledger_figures(result), bytes_figures(result)
    return {
        "model": {"vocab": config.model.vocab, "hidden": config.model.hidden,
                  "blocks": config.model.blocks, "batch": config.batch, "seq": config.seq},
        "parameters": result.parameters,
        "world_size": result.world_size,
        "backend": result.backend,
        "device": config.device,
        "launch_s": seconds,
        "proofs_ok": result.ok,
        "ledgers_match": ledgers["match"],
        "traffic_ok": result.traffic_ok,
        "wire_reason": result.wire_reason,
        "collectives": collective_figures(result),
        "ledgers": ledgers,
        "bytes": sent,
        "proofs": proof_figures(result),
    }
