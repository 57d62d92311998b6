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

from helpers.tensor_parallel.block import Split, chunks, cut

SEED = 1  # the source seeds the model with torch.manual_seed(1)
SPLITS = (Split("fc1.weight", 0), Split("fc2.weight", 1))  # column-, then row-parallel
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
    weights are the source's, bit for bit. It is a ``helpers.tensor_parallel.block``
    ``ParallelBlock``: fc1 cut along dim 0, fc2 along dim 1.
    """

    def __init__(self, hidden_size: int, ffn_size: int, activation: str = "none") -> None:
        super().__init__()
        self.activation = activation
        self.fc1 = nn.Linear(hidden_size, ffn_size, bias=False)
        self.act = _activation(activation)
        self.fc2 = nn.Linear(ffn_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def layer_chain(self) -> tuple[list[nn.Module], list[int]]:
        """fc1, the activation, fc2, in one part (``helpers.memory``'s ``LayerChain``)."""
        return [self.fc1, self.act, self.fc2], []

    def splits(self) -> tuple[Split, ...]:
        """fc1 column-parallel (its rows), fc2 row-parallel (its columns)."""
        return SPLITS

    def shard(self, world_size: int, rank: int) -> FeedForwardShard:
        """Rank ``rank``'s empty shard, the same activation."""
        hidden, ffn = self.sizes().values()
        return FeedForwardShard(hidden, ffn, world_size, rank, self.activation)

    def plan(self) -> dict:
        return dtensor_plan()

    def sizes(self) -> dict[str, int]:
        ffn_size, hidden_size = self.fc1.weight.shape
        return {"hidden_size": int(hidden_size), "ffn_size": int(ffn_size)}


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

    def layer_chain(self) -> tuple[list[nn.Module], list[int]]:
        """The rank's fc1, activation, fc2, in one part (``helpers.memory``'s ``LayerChain``)."""
        return [self.fc1, self.act, self.fc2], []

    def rows(self) -> slice:
        """The slice of the ffn dimension this rank owns."""
        return shard_rows(self.ffn_size, self.world_size, self.rank)


def split_weights(model: FeedForward, world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per rank: (fc1 rows, fc2 columns), exactly ``torch.split`` as the source does it."""
    validate_split(model.fc1.weight.shape[0], world_size)
    return [(c["fc1.weight"], c["fc2.weight"]) for c in chunks(model, world_size)]


def cut_shard(
    model: FeedForward, world_size: int, rank: int, activation: str = "none"
) -> FeedForwardShard:
    """Rank ``rank``'s shard cut from a full model (weights copied, same device and dtype)."""
    validate_split(model.fc1.weight.shape[0], world_size)
    shard = cut(model, world_size, rank)
    shard.act = _activation(activation)
    return shard


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
