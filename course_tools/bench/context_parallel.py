"""``make bench`` section ``context_parallel`` (lesson 10): one causal attention layer of
4,096 tokens on 2 ranks under every variant, each proven against one process, with each
rank's time per forward and backward, the part spent computing, and the scores it computed."""

from __future__ import annotations

from helpers.context_parallel.traffic import VARIANTS
from helpers.runs.context_parallel.config import CPAttentionConfig
from helpers.runs.contract import launch

SEQ, HIDDEN, HEADS, KV_HEADS, REPEATS, WARMUP = 4096, 256, 8, 2, 5, 2


def context_parallel_section() -> dict:
    """Per variant: verdicts, per-rank mean and std of a pass, computing time, scores."""
    out = {"seq": SEQ, "hidden": HIDDEN, "heads": HEADS, "kv_heads": KV_HEADS, "cp": 2,
           "causal": True, "repeats": REPEATS, "variants": {}}
    for variant in VARIANTS:
        config = CPAttentionConfig(variant=variant, seq=SEQ, hidden=HIDDEN, heads=HEADS,
                                   kv_heads=KV_HEADS, batch=1, causal=True, repeats=REPEATS,
                                   warmup=WARMUP)
        result = launch(config, nproc=2, timeout=900)
        out["variants"][variant] = {
            "proven": result.proven.ok, "bytes_as_predicted": result.bytes_as_predicted,
            "imbalance": result.imbalance,
            "ranks": [{"rank": r.rank, "scores": r.scores, "mean_ms": r.mean_ms,
                       "std_ms": r.std_ms, "computing_ms": r.computing_ms}
                      for r in result.ranks],
        }
        rows = ", ".join(f"rank {r.rank} {r.mean_ms:.0f} ± {r.std_ms:.0f} ms" for r in result.ranks)
        print(f"  context_parallel {variant}: proven {result.proven.ok}, {rows}", flush=True)
    return out
