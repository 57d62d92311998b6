"""The feed-forward block (FFN) split the Megatron-LM way.

``fc1`` (hidden -> ffn) is split by its output features ("column-parallel": rank ``r``
holds rows ``r*ffn/p .. (r+1)*ffn/p`` of ``fc1.weight``) and ``fc2`` (ffn -> hidden) by
its input features ("row-parallel": the matching columns of ``fc2.weight``). Each rank
goes from the full input to a *partial* output; the full output is their sum.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

SEED = 1  # the source seeds the model with torch.manual_seed(1)
ACTIVATIONS = ("none", "gelu")


def validate_split(ffn_size: int, world_size: int) -> int:
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


def shard_rows(ffn_size: int, world_size: int, rank: int) -> slice:
    """The slice of the ffn dimension that rank ``rank`` owns."""
    per_rank = validate_split(ffn_size, world_size)
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r}; valid: 0 .. {world_size - 1} for world size {world_size}")
    return slice(rank * per_rank, (rank + 1) * per_rank)


def _activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; valid choices: {', '.join(ACTIVATIONS)}")
    return nn.GELU() if name == "gelu" else nn.Identity()


class FeedForward(nn.Module):
    """The source's FFN: ``fc2(fc1(x))``, no biases; ``activation='gelu'`` puts a GeLU between.

    Built in the source's order (fc1, then fc2): after ``torch.manual_seed(1)`` the
    weights are the source's, bit for bit.
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
        self, hidden_size: int, ffn_size: int, world_size: int, rank: int, activation: str = "none"
    ) -> None:
        super().__init__()
        rows = shard_rows(ffn_size, world_size, rank)
        self.hidden_size, self.ffn_size = hidden_size, ffn_size
        self.world_size, self.rank = world_size, rank
        self.fc1 = nn.Linear(hidden_size, rows.stop - rows.start, bias=False)  # column-parallel
        self.act = _activation(activation)  # element-wise: each rank owns whole columns
        self.fc2 = nn.Linear(rows.stop - rows.start, hidden_size, bias=False)  # row-parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def rows(self) -> slice:
        """The slice of the ffn dimension this rank owns."""
        return shard_rows(self.ffn_size, self.world_size, self.rank)

    def load_weights(self, fc1: torch.Tensor, fc2: torch.Tensor) -> FeedForwardShard:
        """Copy the two weight chunks in, checking their shapes; returns the shard."""
        for layer, weight in ((self.fc1, fc1), (self.fc2, fc2)):
            if tuple(weight.shape) != tuple(layer.weight.shape):
                raise ValueError(
                    f"weight of shape {tuple(weight.shape)} given for a layer of shape "
                    f"{tuple(layer.weight.shape)}"
                )
        with torch.no_grad():
            self.fc1.weight.copy_(fc1)
            self.fc2.weight.copy_(fc2)
        return self


def split_weights(model: FeedForward, world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per rank: (fc1 rows, fc2 columns), exactly ``torch.split`` as the source does it."""
    per_rank = validate_split(model.fc1.weight.shape[0], world_size)
    fc1 = torch.split(model.fc1.weight.detach(), per_rank, dim=0)
    fc2 = torch.split(model.fc2.weight.detach(), per_rank, dim=1)
    return list(zip(fc1, fc2, strict=True))


def cut_shard(
    model: FeedForward, world_size: int, rank: int, activation: str = "none"
) -> FeedForwardShard:
    """Rank ``rank``'s shard cut from a full model (weights copied, same device and dtype)."""
    ffn_size, hidden_size = model.fc1.weight.shape
    shard = FeedForwardShard(hidden_size, ffn_size, world_size, rank, activation)
    shard.load_weights(*split_weights(model, world_size)[rank])
    return shard.to(model.fc1.weight.device, model.fc1.weight.dtype)


def make_shards(
    model: FeedForward, world_size: int, activation: str = "none"
) -> list[FeedForwardShard]:
    """All ``world_size`` shards of ``model``, cut in memory."""
    return [cut_shard(model, world_size, r, activation) for r in range(world_size)]


def tp_simulate(shards: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """Tensor parallelism in one process: the sum of the ranks' partial outputs, rank 0 first.

    This sum is what g's all-reduce computes across processes.
    """
    if not shards:
        raise ValueError("tp_simulate needs at least one shard")
    total = shards[0](x)
    for shard in shards[1:]:
        total = total + shard(x)
    return total


def shard_vs_full(
    shard: tuple[torch.Tensor, torch.Tensor],
    full: tuple[torch.Tensor, torch.Tensor],
    rows: slice,
) -> float:
    """Largest |difference| between a rank's (fc1, fc2) tensors and the full model's slices.

    Works for weights and for gradients: fc1's rows ``rows``, fc2's columns ``rows``.
    """
    fc1, fc2 = (t.detach().double().cpu() for t in shard)
    full1, full2 = (t.detach().double().cpu() for t in full)
    if fc1.shape != full1[rows].shape or fc2.shape != full2[:, rows].shape:
        raise ValueError(
            f"shard shapes {tuple(fc1.shape)}, {tuple(fc2.shape)} do not match the full "
            f"model's slices {tuple(full1[rows].shape)}, {tuple(full2[:, rows].shape)}"
        )
    return max((fc1 - full1[rows]).abs().max().item(), (fc2 - full2[:, rows]).abs().max().item())


def make_input(
    batch_size: int,
    seq_len: int,
    hidden_size: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = SEED,
) -> torch.Tensor:
    """The input batch, float32 in [0, 1) like the source's, from its own seeded generator.

    Its own generator makes it the same in every mode and on every rank.
    """
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand((batch_size, seq_len, hidden_size), generator=generator, dtype=torch.float32)
    return x.to(dtype).to(device)


def dtensor_plan() -> dict:
    """The same split as PyTorch's ``parallelize_module`` plan: fc1 column-, fc2 row-parallel."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
