"""The source's command line, ``torch_tp_demo.py``, unchanged for its users.

Native mode (one process) times the whole FFN, writes the shard files, then sums the
ranks' partial outputs in one process (``tp_simulate``)::

    python -m helpers.tp_demo --hidden_size 512 --ffn_size 4096 --seq_len 512 \\
        --batch_size 8 --world_size 4 --device cuda

Tensor-parallel mode (under ``torchrun``, ``WORLD_SIZE > 1``): each rank loads its shard
and computes ``g(shard(f(x)))``; g's all-reduce gives every rank the full output::

    torchrun --nproc-per-node=4 -m helpers.tp_demo --hidden_size 512 --ffn_size 4096 \\
        --seq_len 512 --batch_size 8 --world_size 4

The work is done by ``helpers.tensor_parallel`` (``native`` and ``ffn_worker``); this
module only reads the flags and picks the mode. What differs from the source, on
purpose: one seeded input for both modes, a clock that synchronises the GPU, sums in
float64, outputs compared element by element, and shard files under results/ with a
checked manifest.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

from helpers.core.devices import resolve_device
from helpers.core.errors import TutorialError
from helpers.core.files import atomic_write_json
from helpers.runs.tp_ffn.config import DemoConfig, parser
from helpers.runs.tp_ffn.native import run_native_mode
from helpers.runs.tp_ffn.worker import run_tp_mode
from helpers.torchrun.ranks import RESULT_ENV


def main(argv: list[str] | None = None) -> int:
    """Parse the options, pick the mode, run it; errors end with one clear line."""
    ap = parser()
    ns = ap.parse_args(argv)
    config = DemoConfig.from_args(ns)
    try:
        config.validate()
        resolve_device(config.device)
    except ValueError as error:
        ap.error(str(error))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mode = config.mode if config.mode != "auto" else ("tp" if world > 1 else "native")
    if mode == "native" and world > 1:
        ap.error(
            f"native mode runs in one process, but WORLD_SIZE={world}; valid: --mode tp or auto"
        )
    first = int(os.environ.get("RANK", "0")) == 0
    if first:
        print(ns, flush=True)
    try:
        if mode == "native":
            result = run_native_mode(replace(config, mode="native"))
        else:
            result = run_tp_mode(replace(config, mode="tp")).as_dict()
    except (TutorialError, ValueError) as error:
        print(f"tp_demo: error: {error}", file=sys.stderr, flush=True)
        return 1
    if first:
        paths = (ns.json, os.environ.get(RESULT_ENV) if mode == "native" else None)
        for path in paths:
            if path:
                atomic_write_json(path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
