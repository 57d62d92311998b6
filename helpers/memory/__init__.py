"""What a device must hold to train: measured (one real step) and estimated (from shapes).

``measure_training_memory`` and ``estimate_training_memory`` return the same
:class:`Ledger` (weights, grads, optimizer state, activations per device), so a lesson
can prove the estimate against the measurement before it uses the estimate.
"""

from helpers.memory.estimate import (
    PRECISIONS,
    estimate_layers,
    estimate_training_memory,
    estimate_transformer,
    parameter_memory,
)
from helpers.memory.ledger import DeviceMemory, Ledger, compare_ledgers, comparison_table
from helpers.memory.measure import measure_training_memory
from helpers.memory.optimizers import OPTIMIZERS
from helpers.memory.saved import SavedTensorMeter
from helpers.memory.transformer import LLAMA_7B_SHAPE, LLAMA_70B_SHAPE, TransformerShape

__all__ = [
    "LLAMA_70B_SHAPE",
    "LLAMA_7B_SHAPE",
    "OPTIMIZERS",
    "PRECISIONS",
    "DeviceMemory",
    "Ledger",
    "SavedTensorMeter",
    "TransformerShape",
    "compare_ledgers",
    "comparison_table",
    "estimate_layers",
    "estimate_training_memory",
    "estimate_transformer",
    "measure_training_memory",
    "parameter_memory",
]
