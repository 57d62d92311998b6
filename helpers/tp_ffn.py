"""Lessons 05 and 06: the feed-forward block (FFN) split the Megatron-LM way.

``fc1`` (hidden -> ffn) is split by its output features ("column-parallel": rank ``r``
holds rows ``r*ffn/p .. (r+1)*ffn/p`` of ``fc1.weight``) and ``fc2`` (ffn -> hidden) by
its input features ("row-parallel": the matching columns of ``fc2.weight``). Each rank
goes from the full input to a *partial* output with no communication in between; the
full output is the sum of the partials: one all-reduce at the end.

The communication (Megatron's operators ``f`` and ``g``) and its cost are in
``helpers.tp_comm``; the shard files in ``helpers.tp_shards``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

SEED = 1  # the source seeds the model with torch.manual_seed(1)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ACTIVATIONS = ("none", "gelu")


def check_split(ffn_size: int, world_size: int) -> int:
    """``ffn_size // world_size`` after checking that the split is possible."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r}; valid: an integer >= 1")
    if not isinstance(ffn_size, int) or ffn_size < 1:
        raise ValueError(f"ffn_size={ffn_size!r}; valid: an integer >= 1")
    if ffn_size % world_size:
        valid = [p for p in range(1, min(ffn_size, 64) + 1) if ffn_size % p == 0]
        raise ValueError(
            f"ffn_size={ffn_size} is not divisible by world_size={world_size}, so the ranks "
            f"cannot hold equal shards; valid world sizes for ffn_size {ffn_size}: "
            f"{', '.join(map(str, valid))}{', ...' if ffn_size > 64 else ''}"
        )
    return ffn_size // world_size


def resolve_device(name: str | torch.device) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` as a device that exists here, else a clear error."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    valid = "cpu" + (f", cuda, cuda:0 .. cuda:{gpus - 1}" if gpus else "")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {name!r}; valid choices here: {valid}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {name!r}; valid choices here: {valid}")
    if device.type == "cuda":
        if gpus == 0:
            raise ValueError(
                f"device {name!r} needs a CUDA GPU but this machine has none; valid choices here: cpu"
            )
        if device.index is not None and device.index >= gpus:
            raise ValueError(
                f"device {name!r} does not exist: this machine has {gpus} GPU(s); "
                f"valid choices here: {valid}"
            )
    return device


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """``float32``, ``float16`` or ``bfloat16`` as a torch dtype, else a clear error."""
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    if name in DTYPES:
        return DTYPES[name]
    raise ValueError(f"unknown dtype {name!r}; valid choices: {', '.join(DTYPES)}")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``'float16'``."""
    return str(dtype).removeprefix("torch.")


def _activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; valid choices: {', '.join(ACTIVATIONS)}")
    return nn.GELU() if name == "gelu" else nn.Identity()


class FeedForward(nn.Module):
    """The source's FFN: ``fc2(fc1(x))``, no biases; ``activation='gelu'`` puts a GeLU between.

    The layers are created in the source's order (fc1, then fc2), so after
    ``torch.manual_seed(1)`` the weights are the source's, bit for bit.
    """

    def __init__(self, hidden_size: int, ffn_size: int, activation: str = "none") -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, ffn_size, bias=False)
        self.act = _activation(activation)
        self.fc2 = nn.Linear(ffn_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class FeedForwardShard(nn.Module):
    """Rank ``rank``'s part of the FFN: ``ffn/p`` rows of fc1, the matching columns of fc2.

    ``forward`` returns the rank's *partial* output; the sum over ranks is the FFN's output.
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_size: int,
        world_size: int,
        rank: int,
        activation: str = "none",
    ) -> None:
        super().__init__()
        per_rank = check_split(ffn_size, world_size)
        if not 0 <= rank < world_size:
            raise ValueError(
                f"rank={rank!r}; valid: 0 .. {world_size - 1} for world size {world_size}"
            )
        self.hidden_size, self.ffn_size = hidden_size, ffn_size
        self.world_size, self.rank = world_size, rank
        self.fc1 = nn.Linear(hidden_size, per_rank, bias=False)  # column-parallel
        self.act = _activation(activation)  # element-wise: each rank owns whole columns
        self.fc2 = nn.Linear(per_rank, hidden_size, bias=False)  # row-parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def rows(self) -> slice:
        """The slice of the ffn dimension this rank owns."""
        per_rank = self.ffn_size // self.world_size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    @classmethod
    def from_full(
        cls, model: FeedForward, world_size: int, rank: int, activation: str = "none"
    ) -> FeedForwardShard:
        """Rank ``rank``'s shard cut from a full model (weights copied)."""
        ffn_size, hidden_size = model.fc1.weight.shape
        shard = cls(hidden_size, ffn_size, world_size, rank, activation)
        fc1, fc2 = split_weights(model, world_size)[rank]
        shard.load_weights(fc1, fc2)
        return shard.to(model.fc1.weight.device, model.fc1.weight.dtype)

    @classmethod
    def from_files(
        cls,
        folder,
        world_size: int,
        rank: int,
        *,
        hidden_size: int | None = None,
        ffn_size: int | None = None,
        activation: str = "none",
    ) -> FeedForwardShard:
        """Rank ``rank``'s shard loaded from shard files, checked against their manifest."""
        from helpers.tp_shards import load_shard

        manifest, fc1, fc2 = load_shard(
            folder, world_size, rank, hidden_size=hidden_size, ffn_size=ffn_size
        )
        shard = cls(manifest["hidden_size"], manifest["ffn_size"], world_size, rank, activation)
        shard.load_weights(fc1, fc2)
        return shard

    def load_weights(self, fc1: torch.Tensor, fc2: torch.Tensor) -> None:
        """Copy the two weight shards in, checking their shapes."""
        for layer, weight in ((self.fc1, fc1), (self.fc2, fc2)):
            if tuple(weight.shape) != tuple(layer.weight.shape):
                raise ValueError(
                    f"weight of shape {tuple(weight.shape)} given for a layer of shape "
                    f"{tuple(layer.weight.shape)}"
                )
        with torch.no_grad():
            self.fc1.weight.copy_(fc1)
            self.fc2.weight.copy_(fc2)


def split_weights(model: FeedForward, world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per rank: (fc1 rows, fc2 columns), exactly ``torch.split`` as the source does it."""
    per_rank = check_split(model.fc1.weight.shape[0], world_size)
    fc1 = torch.split(model.fc1.weight.detach(), per_rank, dim=0)
    fc2 = torch.split(model.fc2.weight.detach(), per_rank, dim=1)
    return list(zip(fc1, fc2, strict=True))


def make_shards(
    model: FeedForward, world_size: int, activation: str = "none"
) -> list[FeedForwardShard]:
    """All ``world_size`` shards of ``model``, cut in memory."""
    return [FeedForwardShard.from_full(model, world_size, r, activation) for r in range(world_size)]


def tp_simulate(shards: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """Tensor parallelism in one process: the sum of the ranks' partial outputs, rank 0 first.

    This sum is what ``all_reduce(SUM)`` (the operator ``g``) computes across processes.
    """
    if not shards:
        raise ValueError("tp_simulate needs at least one shard")
    total = shards[0](x)
    for shard in shards[1:]:
        total = total + shard(x)
    return total


def make_input(
    batch_size: int,
    seq_len: int,
    hidden_size: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = SEED,
) -> torch.Tensor:
    """The input batch, drawn (as float32 in [0, 1), like the source) from its own generator.

    Its own seeded generator makes it the same in every mode and on every rank, whatever
    else consumed random numbers before.
    """
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand((batch_size, seq_len, hidden_size), generator=generator, dtype=torch.float32)
    return x.to(dtype).to(device)


# --- tolerances ------------------------------------------------------------------------


def eps(dtype: torch.dtype) -> float:
    """Machine epsilon: the gap between 1 and the next number of ``dtype``."""
    return torch.finfo(dtype).eps


def output_tolerance(reference: torch.Tensor, dtype: torch.dtype, world_size: int) -> float:
    """Largest element-wise difference allowed between native and tensor-parallel outputs.

    Both compute the same products; they differ in how they add them up. The native
    output adds ``ffn`` products and rounds once. Each rank adds only ``ffn/p`` of them
    (in another order, so the last bits of float32 sums differ) and rounds its partial
    output to ``dtype``; then the ``p`` partials are added, each addition rounded again.
    Every rounding costs up to half a unit in the last place (``eps/2`` relative), the
    reordered sums a few more, so we allow ``4 * p * eps * max|y|``: a few units in the
    last place per rank. Wrong weights miss by far more (see the tests).
    """
    return 4 * max(world_size, 1) * eps(dtype) * reference.detach().abs().max().item()


def checksum(out: torch.Tensor) -> tuple[float, float]:
    """(sum, sum of absolute values) of an output, added up in float64.

    The source prints ``out.sum()`` in float16, which rounds the sum itself to 11 bits
    (and overflows past 65504); the float64 sum keeps every digit printed meaningful.
    """
    out = out.detach().double()
    return out.sum().item(), out.abs().sum().item()


def checksum_tolerance(abs_sum: float, dtype: torch.dtype | str) -> float:
    """How far apart the checksums of two correct computations may be: ``eps * sum|y|``.

    Each output element may differ by about one ``eps`` relative to its size; summed with
    the same sign everywhere that is ``eps * sum|y|``. Real differences have random signs
    and are far smaller, while a wrong weight or a missing rank moves the sum by whole
    units.
    """
    return eps(resolve_dtype(dtype)) * abs_sum


def checksums_match(reference: dict, candidate: dict) -> bool:
    """Whether two results of ``helpers.tp_demo`` agree within the dtype's checksum tolerance."""
    tol = checksum_tolerance(reference["abs_sum"], reference["dtype"])
    return abs(reference["checksum"] - candidate["checksum"]) <= tol
