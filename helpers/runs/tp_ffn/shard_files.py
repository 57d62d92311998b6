"""The shard files a launch reads, written first in this process: one folder per world size."""

from __future__ import annotations

from collections.abc import Sequence

from helpers.runs.tp_ffn.config import TPFFNConfig
from helpers.tensor_parallel.shards import write_shards


def write_all_shards(config: TPFFNConfig, world_sizes: Sequence[int]) -> dict[int, str]:
    """Shard files for every world size (same model, same seed), in ``config.folder(p)``."""
    model = config.model()
    return {p: str(write_shards(model, p, config.folder(p))) for p in world_sizes}
