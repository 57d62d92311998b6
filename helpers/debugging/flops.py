"""FLOPs of a training step, counted two ways, and what share of a chip's peak a run uses.

*Model FLOPs* are what the model needs, however it is run: for a transformer's training
step, ``6 N`` per token for the weight matrix products (2 forward, 4 backward: the
activations' gradients and the weights'), ``N`` the weights in matrix products (the
embedding is a lookup and does not count), plus the attention scores: ``12 L s d`` per
token for attention's two products (``L`` blocks, ``s`` tokens, ``d`` = heads x head
dim). PaLM's appendix B (Chowdhery et al. 2022) writes it ``12 L H Q T``; ``H Q = d``
here. It counts the full ``s x s`` square: a causal mask is ignored, though a flash
kernel skips the blocks it masks.

*Hardware FLOPs* add any recomputation, e.g. the forward a checkpointed block runs again,
or the scores that a flash-attention backward recomputes instead of keeping them; here
they are counted by torch's formulas, causal mask ignored. MFU divides the model FLOPs
per second by the chip's peak; HFU divides the hardware FLOPs per second by it (PaLM's
appendix B defines both; Korthikanti et al. 2022 report both).

``torch.utils.flop_counter.FlopCounterMode`` counts what the operators of one step do,
from their shapes, by a formula per operator. An operator without a formula is not counted:
on a CPU, ``scaled_dot_product_attention`` runs ``_scaled_dot_product_flash_attention_for_cpu``,
which torch 2.14 has no formula for (its SDPA formulas cover the flash, efficient and
cuDNN kernels: :data:`CPU_ATTENTION`); :func:`counted_flops` can map it to torch's own
attention formulas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.models.llama import LMConfig

aten = torch.ops.aten
CPU_ATTENTION = (aten._scaled_dot_product_flash_attention_for_cpu,
                 aten._scaled_dot_product_flash_attention_for_cpu_backward)


def matmul_weights(config: LMConfig) -> int:
    """``N``: the weights that enter matrix products (every projection and the head;
    not the embedding, a lookup, nor the norms)."""
    head_dim = config.hidden // config.heads
    attention = 2 * config.hidden * config.heads * head_dim + 2 * config.hidden * config.kv * head_dim
    mlp = 3 * config.hidden * config.ffn
    return config.blocks * (attention + mlp) + config.hidden * config.vocab


@dataclass(frozen=True)
class StepFlops:
    """A training step's FLOPs by part, from the model's shape."""

    tokens: int
    matmul: int  # 6 N per token
    attention: int  # 12 L s d per token (scores and their use, forward and backward)
    attention_recomputed: int  # the scores a flash backward computes again: 2 L s d per token
    checkpointed: int  # each block's forward recomputed (activation checkpointing), but for
    # its last product: torch.utils.checkpoint stops early, once the backward has its inputs

    @property
    def model(self) -> int:
        """Model FLOPs: what the step needs (MFU's numerator)."""
        return self.matmul + self.attention

    @property
    def hardware(self) -> int:
        """Hardware FLOPs: what the chip computes, recomputation included (HFU's)."""
        return self.model + self.attention_recomputed + self.checkpointed


def step_flops(config: LMConfig, batch: int, seq: int, *, checkpointing: bool = False
               ) -> StepFlops:
    """The analytic FLOPs of one training step on ``batch x seq`` tokens."""
    tokens, n, d, layers = batch * seq, matmul_weights(config), config.hidden, config.blocks
    # checkpointing reruns each block's forward in backward, but PyTorch's non-reentrant
    # checkpoint stops once it has every tensor the backward needs: the block's last
    # product (the MLP's down projection) feeds only the residual sum, and is not rerun
    rerun_n = n - config.hidden * config.vocab - layers * config.ffn * config.hidden
    rerun = (2 * rerun_n + 4 * layers * seq * d) * tokens if checkpointing else 0
    return StepFlops(tokens, 6 * n * tokens, 12 * layers * seq * d * tokens,
                     2 * layers * seq * d * tokens, rerun)


def _attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


def _attention_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out, query, key, value)


@dataclass(frozen=True)
class CountedFlops:
    """What ``FlopCounterMode`` counted in one step, by operator."""

    by_operator: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_operator.values())


def counted_flops(step: Callable[[], object], *, cpu_attention: bool = False) -> CountedFlops:
    """``FlopCounterMode``'s count of ``step()``; with ``cpu_attention`` the CPU's attention
    kernel is counted by torch's own attention formulas (forward: the scores and their use;
    backward: those of the flash backward, which recomputes the scores)."""
    from torch.utils.flop_counter import FlopCounterMode

    formulas = (_attention, _attention_backward)
    mapping = dict(zip(CPU_ATTENTION, formulas, strict=True)) if cpu_attention else {}
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        step()
    counts = counter.get_flop_counts()["Global"]
    return CountedFlops({str(op).removeprefix("aten."): int(n) for op, n in counts.items()})


def training_step(model: nn.Module, ids: torch.Tensor, targets: torch.Tensor
                  ) -> Callable[[], None]:
    """One forward and backward of ``model`` on next-token targets, as a function."""
    def step() -> None:
        logits = model(ids)
        F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    return step


@dataclass(frozen=True)
class Peak:
    """A measured matrix-multiply rate of this machine: the denominator of MFU here."""

    size: int
    threads: int
    dtype: str
    seconds: list[float]  # per multiply, each of several timed blocks

    @property
    def flops_per_s(self) -> float:
        """The best block's rate: what the chip reaches on a large square multiply."""
        return 2 * self.size**3 / min(self.seconds)


def measure_peak(size: int = 512, threads: int = 1, dtype: torch.dtype = torch.float32,
                 repeats: int = 7, number: int = 3) -> Peak:
    """Time ``size x size`` matrix multiplies on ``threads`` CPU threads with
    ``torch.utils.benchmark`` (warm-up excluded): ``repeats`` blocks of ``number`` each."""
    from torch.utils.benchmark import Timer

    if not isinstance(size, int) or size < 64:
        raise ValueError(f"size={size!r}; valid: an integer >= 64")
    if not isinstance(repeats, int) or repeats < 1 or not isinstance(number, int) or number < 1:
        raise ValueError(f"repeats={repeats!r}, number={number!r}; valid: integers >= 1")
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=g, dtype=dtype) for _ in range(2))
    timer = Timer("a @ b", globals={"a": a, "b": b}, num_threads=threads)
    timer.timeit(number)  # warm-up
    return Peak(size, threads, str(dtype).removeprefix("torch."),
                [timer.timeit(number).mean for _ in range(repeats)])


def utilisation(flops: float, seconds: float, peak_flops_per_s: float) -> float:
    """The share of ``peak_flops_per_s`` that ``flops`` done in ``seconds`` used."""
    if seconds <= 0 or peak_flops_per_s <= 0:
        raise ValueError(f"seconds={seconds}, peak={peak_flops_per_s}; valid: both > 0")
    return flops / seconds / peak_flops_per_s


@dataclass(frozen=True)
class GPUPeak:
    """A GPU's BF16 tensor-core peak as its data sheet prints it: with 2:4 structured
    sparsity. A training step's dense matrix products reach at most half of it."""

    name: str
    sparse_tflops: float
    source: str

    @property
    def dense_tflops(self) -> float:
        """The dense peak: half the data sheet's figure "with sparsity"."""
        return self.sparse_tflops / 2


GPU_PEAKS = (
    GPUPeak("A100 SXM 80GB", 624.0,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    GPUPeak("H100 SXM", 1979.0,
            "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"),
    GPUPeak("H200 SXM", 1979.0, "https://www.nvidia.com/en-us/data-center/h200/"),
)


def gpu_peak(name: str) -> GPUPeak:
    """The published peaks of the GPU whose name contains ``name`` (e.g. "H100")."""
    for peak in GPU_PEAKS:
        if name.lower() in peak.name.lower() or peak.name.split()[0].lower() in name.lower():
            return peak
    raise ValueError(f"no published peak for {name!r}; valid: "
                     f"{', '.join(p.name for p in GPU_PEAKS)}")
