"""What fits: bytes per GPU to train a Llama shape under each way of splitting it."""

from __future__ import annotations

from dataclasses import dataclass

from helpers.core.sizes import format_bytes
from helpers.memory.estimate import estimate_transformer
from helpers.memory.ledger import DeviceMemory
from helpers.memory.transformer import TransformerShape

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Layout:
    """``tp`` tensor-parallel ranks x ``pp`` pipeline stages (x data-parallel copies)."""

    name: str
    tp: int = 1
    pp: int = 1
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; valid: {', '.join(SCHEDULES)}")
        if self.tp < 1 or self.pp < 1:
            raise ValueError(f"tp={self.tp}, pp={self.pp}; valid: integers >= 1")

    def in_flight(self, microbatches: int) -> list[int]:
        """Micro-batches whose activations stage k holds at its peak.

        GPipe runs every forward before any backward: M on each stage. 1F1B starts the
        backward of micro-batch 0 as soon as it can, so stage k holds at most pp - k.
        """
        if self.schedule == "gpipe" or self.pp == 1:
            return [microbatches if self.pp > 1 else 1] * self.pp
        return [min(microbatches, self.pp - k) for k in range(self.pp)]


LAYOUTS = (
    Layout("data parallel"),
    Layout("TP 8", tp=8),
    Layout("PP 8, GPipe", pp=8, schedule="gpipe"),
    Layout("PP 8, 1F1B", pp=8),
    Layout("TP 8 x PP 8, 1F1B", tp=8, pp=8),
)


def split_blocks(blocks: int, pp: int) -> list[int]:
    """Blocks per stage, as even as possible (earlier stages take the remainder)."""
    if pp > blocks:
        raise ValueError(f"pp={pp} stages for {blocks} blocks; valid: at most {blocks} stages")
    return [blocks // pp + (k < blocks % pp) for k in range(pp)]


def per_gpu(shape: TransformerShape, layout: Layout, *, seq: int, micro_batch: int = 1,
            microbatches: int = 32, precision: str = "mixed",
            optimizer: str = "adam") -> DeviceMemory:
    """The fullest GPU's ledger (the stage with the largest total) under ``layout``."""
    ledger = estimate_transformer(
        shape, batch=micro_batch, seq=seq, optimizer=optimizer, precision=precision,
        stages=split_blocks(shape.blocks, layout.pp), tp=layout.tp,
        in_flight=layout.in_flight(microbatches),
    )
    return max(ledger.rows.values(), key=lambda r: r.total)


@dataclass(frozen=True)
class Fit:
    """One (model, layout): GPUs per model copy, the fullest GPU's ledger, whether it fits."""

    model: str
    layout: str
    gpus: int
    memory: DeviceMemory
    fits: bool


def fits_table(shapes: dict[str, TransformerShape], *, gpu_bytes: int, seq: int,
               microbatches: int = 32, layouts: tuple[Layout, ...] = LAYOUTS) -> list[Fit]:
    """One row per (model, layout) (data parallelism adds copies, each GPU holding a whole
    one, so its row is one GPU's)."""
    rows = []
    for model, shape in shapes.items():
        for layout in layouts:
            row = per_gpu(shape, layout, seq=seq, microbatches=microbatches)
            rows.append(Fit(model, layout.name, layout.tp * layout.pp, row,
                            row.total <= gpu_bytes))
    return rows


def format_fits(rows: list[Fit], gpu_bytes: int) -> str:
    """The table as text, with the budget named."""
    head = (f"{'model':<10}{'layout':<20}{'GPUs':>5}{'weights':>11}{'grads':>11}"
            f"{'optimizer':>12}{'activations':>13}{'total':>13}  fits {format_bytes(gpu_bytes)}?")
    lines = [head]
    for r in rows:
        m = r.memory
        cells = (m.weights, m.grads, m.optimizer_state, m.activations, m.total)
        widths = (11, 11, 12, 13, 13)
        lines.append(f"{r.model:<10}{r.layout:<20}{r.gpus:>5}"
                     + "".join(f"{format_bytes(c):>{w}}" for c, w in zip(cells, widths, strict=True))
                     + f"  {'yes' if r.fits else 'no'}")
    return "\n".join(lines)
