"""Lesson 05's "Break it": accelerate handed an offload folder that another model left."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch import nn

from helpers.core.optional import quiet_logs, require
from helpers.placement.offload import ACCELERATE_LOGGERS
from helpers.placement.sizing import Device


def dispatch_unchecked(model: nn.Module, device_map: Mapping[str, Device],
                       folder: str | Path) -> None:
    """``accelerate.dispatch_model`` as it is, offloading to ``folder``.

    Finding an ``index.json`` there, accelerate reuses the folder as it is, whatever weights
    it holds. Its one log line about parameters left on the meta device is dropped.
    """
    accelerate = require("accelerate", "dispatching a model across devices")
    if not (Path(folder) / "index.json").is_file():
        raise ValueError(f"{folder} holds no index.json; valid: a folder written by "
                         "accelerate.utils.offload_state_dict")
    with quiet_logs(ACCELERATE_LOGGERS, "Some parameters are on the meta device"):
        accelerate.dispatch_model(model, dict(device_map), offload_dir=str(folder))
