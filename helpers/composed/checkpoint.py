"""Checkpoints of a 3-D run with ``torch.distributed.checkpoint``, loadable under any layout.

Every rank saves its own shards of the model and the optimizer state, under the model's
parameter names (``get_state_dict``: a DTensor is saved as the pieces of one tensor), so a
run on another mesh loads exactly the pieces it needs: ``dcp.load`` reshards. The files are
written into a staging folder, then rank 0 moves them into a verified folder
(``helpers.core.files``: a manifest with every file's size and SHA-256, swapped into place
whole), recording the model's sizes, the step and the losses so far. Loading checks every
file and refuses a folder that is incomplete or holds another model, by name.
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from helpers.core.errors import FolderError
from helpers.core.files import verify_folder, write_verified_folder


def _OPTIONS():  # noqa: N802 - a constant, built when torch.distributed.checkpoint is loaded
    """The optimizer's entries keyed by parameter name, one level deep (``state.<name>.
    exp_avg``, ``param_groups.<name>.lr``). ``get_state_dict`` already keys the state by
    parameter name; ``flatten_optimizer_state_dict`` keys the hyper-parameters by name too,
    which would otherwise be each rank's list of param groups: pipeline stages hold
    different parameters, and their lists would collide in one checkpoint."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def identity(config) -> dict:
    """What makes two checkpoints the same model, whatever their layouts: its shape, the
    seed its weights were drawn from, and its dtype."""
    return {**asdict(config.model), "seed": config.seed, "dtype": config.dtype}


def step_folder(root: str | Path, step: int) -> Path:
    """The folder of the checkpoint taken after ``step``."""
    return Path(root) / f"step_{step:04d}"


def save(root: str | Path, step: int, module: torch.nn.Module, optimizer, config,
         losses: list[float], group=None, weights_sha256: str = "") -> Path:
    """Collective over ``group`` (default: all ranks): every rank saves its shards; the
    group's first rank seals the folder (its manifest records ``weights_sha256``, the
    weights' fingerprint, ``helpers.runs.llama_3d.digest``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = step_folder(root, step)
    staging = final.with_name(f".{final.name}.staging")
    first = dist.get_rank(group) == 0
    if first:  # what a killed attempt left half-written
        shutil.rmtree(staging, ignore_errors=True)
    dist.barrier(group=group)
    model_state, optim_state = get_state_dict(module, optimizer, options=_OPTIONS())
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(staging),
             process_group=group)
    dist.barrier(group=group)
    if first:
        def fill(tmp: Path) -> None:
            for path in staging.iterdir():
                shutil.move(str(path), tmp / path.name)

        meta = {"model": identity(config), "step": step,
                "losses": losses, "layout": str(config.layout),
                "weights_sha256": weights_sha256}
        write_verified_folder(final, fill, meta=meta)
        shutil.rmtree(staging, ignore_errors=True)
    dist.barrier(group=group)
    return final


def latest(root: str | Path) -> Path | None:
    """The newest sealed checkpoint folder under ``root`` (None if there is none)."""
    folders = sorted(p for p in Path(root).glob("step_*") if p.is_dir()) if root else []
    return folders[-1] if folders else None


@dataclass(frozen=True)
class Manifest:
    """What a sealed checkpoint says of itself."""

    step: int  # the checkpoint was taken after this step
    layout: str  # the layout that saved it
    losses: list[float]  # the loss of every step up to ``step``
    weights_sha256: str  # the weights' fingerprint (``helpers.runs.llama_3d.digest``)


def check(folder: str | Path, config) -> Manifest:
    """The manifest of a complete checkpoint of this model; ``FolderError`` naming what is
    missing or what differs otherwise."""
    manifest = verify_folder(folder)
    if ".metadata" not in manifest["files"]:
        raise FolderError(f"{folder} holds no .metadata: not a complete checkpoint; valid: a "
                          "folder written by helpers.composed.checkpoint.save")
    theirs, mine = manifest.get("model", {}), identity(config)
    wrong = {k: (theirs.get(k), v) for k, v in mine.items() if theirs.get(k) != v}
    if wrong:
        listed = ", ".join(f"{k}={a} in the checkpoint, {b} here" for k, (a, b) in wrong.items())
        raise FolderError(f"{folder} holds another model ({listed}); valid: the same model "
                          "sizes and seed, under any layout")
    return Manifest(manifest["step"], manifest.get("layout", ""), list(manifest.get("losses", [])),
                    manifest.get("weights_sha256", ""))


def _load_into(folder: str | Path, module: torch.nn.Module, optimizer, group) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(module, optimizer, options=_OPTIONS())
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(folder), process_group=group)
    set_state_dict(module, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"], options=_OPTIONS())


def load(folder: str | Path, module: torch.nn.Module, optimizer, config,
         group=None) -> Manifest:
    """Collective over ``group``: check the folder, then load this rank's pieces into
    ``module`` and ``optimizer`` (resharded to this layout); returns the manifest."""
    manifest = check(folder, config)
    _load_into(folder, module, optimizer, group)
    return manifest


def load_one_process(folder: str | Path, config) -> tuple[torch.nn.Module, torch.optim.Optimizer,
                                                         Manifest]:
    """Without any process group: the whole model and its AdamW, loaded from a checkpoint
    that any layout wrote (``dcp.load`` reads every shard it needs); and the manifest."""
    from helpers.models.llama import build_lm

    manifest = check(folder, config)
    model = build_lm(config.model, seed=config.seed).train().to(config.torch_dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    with warnings.catch_warnings():  # one process, no process group: as intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        _load_into(folder, model, optimizer, None)
    return model, optimizer, manifest
