"""What fits: bytes per GPU to train a Llama shape under each way of splitting it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from helpers.core.sizes import format_bytes
from helpers.memory.estimate import estimate_transformer
from helpers.memory.ledger import KINDS, DeviceMemory
from helpers.memory.parameters import validate_dp, validate_recompute, validate_zero
from helpers.memory.transformer import TransformerShape

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class ClusterLayout:
    """How one training run splits over a cluster's GPUs, for the memory estimate: ``tp``
    tensor-parallel ranks x ``pp`` pipeline stages x ``dp`` data-parallel ranks.

    ``zero`` shards over the ``dp`` ranks (ZeRO stage 0 to 3; FSDP is 3); ``recompute``
    reruns each block's forward in its backward. Plain data parallelism (``zero`` 0)
    replicates: its row is one GPU's, whatever the number of copies. ``ep`` splits a
    mixture of experts' routed experts over that many of the ``dp`` ranks (it divides
    ``dp``: the expert-parallel ranks are data-parallel ranks too, and add no GPU).
    """

    name: str
    tp: int = 1
    pp: int = 1
    schedule: str = "1f1b"
    dp: int = 1
    zero: int = 0
    recompute: bool = False
    ep: int = 1

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; valid: {', '.join(SCHEDULES)}")
        if self.tp < 1 or self.pp < 1:
            raise ValueError(f"tp={self.tp}, pp={self.pp}; valid: integers >= 1")
        validate_dp(self.dp)
        validate_zero(self.zero)
        validate_recompute(self.recompute)
        if isinstance(self.ep, bool) or not isinstance(self.ep, int) or self.ep < 1 \
                or self.dp % self.ep:
            raise ValueError(f"ep={self.ep!r} for dp={self.dp}; valid: a divisor of dp "
                             f"{[d for d in range(1, self.dp + 1) if self.dp % d == 0]} "
                             "(expert-parallel ranks are borrowed from the data-parallel ones)")

    @property
    def gpus(self) -> int:
        """GPUs the layout spans: tp x pp x dp."""
        return self.tp * self.pp * self.dp

    def in_flight(self, microbatches: int) -> list[int]:
        """Micro-batches whose activations stage k holds at its peak.

        GPipe runs every forward before any backward: M on each stage. 1F1B starts the
        backward of micro-batch 0 as soon as it can, so stage k holds at most pp - k.
        """
        if self.schedule == "gpipe" or self.pp == 1:
            return [microbatches if self.pp > 1 else 1] * self.pp
        return [min(microbatches, self.pp - k) for k in range(self.pp)]


LAYOUTS = (
    ClusterLayout("data parallel"),
    ClusterLayout("ZeRO-1 8", dp=8, zero=1),
    ClusterLayout("ZeRO-2 8", dp=8, zero=2),
    ClusterLayout("FSDP (ZeRO-3) 8", dp=8, zero=3),
    ClusterLayout("FSDP 8 + recompute", dp=8, zero=3, recompute=True),
    ClusterLayout("FSDP 64", dp=64, zero=3),
    ClusterLayout("FSDP 64 + recompute", dp=64, zero=3, recompute=True),
    ClusterLayout("TP 8", tp=8),
    ClusterLayout("PP 8, GPipe", pp=8, schedule="gpipe"),
    ClusterLayout("PP 8, 1F1B", pp=8),
    ClusterLayout("TP 8 x PP 8, 1F1B", tp=8, pp=8),
)


def split_blocks(blocks: int, pp: int) -> list[int]:
    """Blocks per stage, as even as possible (earlier stages take the remainder)."""
    if pp > blocks:
        raise ValueError(f"pp={pp} stages for {blocks} blocks; valid: at most {blocks} stages")
    return [blocks // pp + (k < blocks % pp) for k in range(pp)]


def per_gpu(shape: TransformerShape, layout: ClusterLayout, *, seq: int, micro_batch: int = 1,
            microbatches: int = 32, precision: str = "mixed", optimizer: str = "adam",
            sequence_parallel: bool = False) -> DeviceMemory:
    """The fullest GPU's ledger (the stage with the largest total) under ``layout``
    (``sequence_parallel`` with ``tp`` > 1: the norms' tensors split along the sequence;
    a mixture of experts' routed experts split over ``layout.ep``)."""
    ledger = estimate_transformer(
        shape, batch=micro_batch, seq=seq, optimizer=optimizer, precision=precision,
        stages=split_blocks(shape.blocks, layout.pp), tp=layout.tp,
        in_flight=layout.in_flight(microbatches), dp=layout.dp, zero=layout.zero,
        recompute=layout.recompute, sequence_parallel=sequence_parallel, ep=layout.ep,
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
               microbatches: int = 32, layouts: tuple[ClusterLayout, ...] = LAYOUTS) -> list[Fit]:
    """One row per (model, layout): the fullest GPU's ledger and the GPUs the layout spans
    (plain data parallelism adds whole copies: its row is one GPU's)."""
    rows = []
    for model, shape in shapes.items():
        for layout in layouts:
            row = per_gpu(shape, layout, seq=seq, microbatches=microbatches)
            rows.append(Fit(model, layout.name, layout.gpus, row,
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


def fits_chart(rows: list[Fit], path: str | Path, *, gpu_bytes: int, cap: float | None = None,
               title: str | None = None) -> Path:
    """Horizontal stacked bars in GiB, one panel per model and one bar per layout (GPUs in
    the label), with the card's size as a dashed line; ``cap`` (GiB) cuts the axis there,
    writing a longer bar's total at its end."""
    import matplotlib.pyplot as plt

    from helpers.core.plotting import save_figure
    from helpers.memory.plots import LABELS

    models = list(dict.fromkeys(r.model for r in rows))
    if not models:
        raise ValueError("no rows to chart; valid: the rows of fits_table")
    layouts = len(rows) // len(models)
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 0.35 * layouts + 1.8),
                             squeeze=False, sharey=True)
    for ax, model in zip(axes[0], models, strict=True):
        _fits_panel(ax, [r for r in rows if r.model == model], gpu_bytes, cap, LABELS)
        ax.set_title(model, fontsize=10)
    axes[0][0].set_ylabel("layout (GPUs it spans)")
    axes[0][0].invert_yaxis()  # the table's order, top down (the panels share the axis)
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return save_figure(fig, path)


def _fits_panel(ax: object, rows: list[Fit], gpu_bytes: int, cap: float | None,
                labels: dict[str, str]) -> None:
    names = [f"{r.layout} ({r.gpus})" for r in rows]
    left = [0.0] * len(rows)
    for kind in KINDS:
        widths = [getattr(r.memory, kind) / 2**30 for r in rows]
        ax.barh(names, widths, 0.6, left=left, label=labels[kind])
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.axvline(gpu_bytes / 2**30, color="red", linestyle="--", label=f"{gpu_bytes / 2**30:g} GiB card")
    if cap:
        ax.set_xlim(0, cap)
        for y, total in enumerate(left):
            if total > cap:
                ax.annotate(f"{total:,.0f} GiB", (cap, y), xytext=(-4, 0), textcoords="offset points",
                            ha="right", va="center", fontsize=8, bbox={"boxstyle": "round", "fc": "white"})
    ax.set_xlabel("GiB on the fullest GPU")
    ax.xaxis.grid(True)
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", labelsize=8)
