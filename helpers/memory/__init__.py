"""What a device must hold to train: measured (one real step) and estimated (from shapes).

``measure_training_memory`` and ``estimate_training_memory`` return the same
:class:`Ledger` (weights, grads, optimizer state, activations per device), so a lesson
can prove the estimate against the measurement before it uses the estimate.

The estimator knows no lesson's model: a model is estimated when it gives its chain of
layers (:class:`LayerChain`, a ``layer_chain()`` method), or its transformer sizes
(:class:`HasTransformerShape`, a ``transformer_shape()`` method); an ``nn.Sequential`` or a
list of layers is read as it is.

Data parallelism, ZeRO sharding and activation recomputation are options of the
transformer estimate (``dp``, ``zero``, ``recompute``), and so is expert parallelism
(``ep``) for a mixture of experts (``moe``: :class:`MoETransformerShape`, DeepSeek-V3's and
Mixtral 8x7B's published shapes); :mod:`helpers.memory.recompute`
(imported on its own: it loads the timing tools) measures recomputation against it.

Taught (a lesson shows or imports them): ``ledger`` (what a device holds, in bytes),
``transformer`` (a Llama shape's memory from its sizes), ``cuts`` (stages of equal memory),
``fits`` (what fits a cluster under each split), ``recompute`` (recomputation, measured),
``torch_trackers`` (PyTorch's own trackers beside the ledger) and ``plots`` (the ledgers
drawn). They build on ``estimate``, ``moe``, ``layer_rules``, ``measure``, ``saved``,
``parameters`` and ``optimizers``.
"""

from helpers.memory.estimate import (
    HasTransformerShape,
    LayerChain,
    estimate_layers,
    estimate_training_memory,
    estimate_transformer,
    layers_of,
)
from helpers.memory.ledger import (
    DeviceMemory,
    Ledger,
    agreement_table,
    compare_ledgers,
    comparison_table,
)
from helpers.memory.measure import measure_training_memory
from helpers.memory.moe import (
    DEEPSEEK_V3_SHAPE,
    MIXTRAL_8X7B_SHAPE,
    PUBLISHED_PARAMETERS,
    LatentAttention,
    MoETransformerShape,
)
from helpers.memory.optimizers import OPTIMIZERS
from helpers.memory.parameters import (
    PRECISIONS,
    ZERO_STAGES,
    parameter_memory,
    sharded_parameter_memory,
)
from helpers.memory.saved import SavedTensorMeter
from helpers.memory.transformer import LLAMA_7B_SHAPE, LLAMA_70B_SHAPE, TransformerShape

TAUGHT = ("cuts", "fits", "ledger", "plots", "recompute", "torch_trackers", "transformer")

__all__ = [
    "DEEPSEEK_V3_SHAPE",
    "LLAMA_70B_SHAPE",
    "LLAMA_7B_SHAPE",
    "MIXTRAL_8X7B_SHAPE",
    "OPTIMIZERS",
    "PRECISIONS",
    "PUBLISHED_PARAMETERS",
    "ZERO_STAGES",
    "DeviceMemory",
    "HasTransformerShape",
    "LatentAttention",
    "LayerChain",
    "Ledger",
    "MoETransformerShape",
    "SavedTensorMeter",
    "TransformerShape",
    "agreement_table",
    "compare_ledgers",
    "comparison_table",
    "estimate_layers",
    "estimate_training_memory",
    "estimate_transformer",
    "layers_of",
    "measure_training_memory",
    "parameter_memory",
    "sharded_parameter_memory",
]
