"""The layout search: every way to split a Llama over a cluster, the ones that fit, and one chosen.

A layout is ``tp`` tensor-parallel ranks inside a node x ``pp`` pipeline stages (1F1B) x
``dp`` data-parallel ranks, sharded under ZeRO stage 0 to 3 (3 is FSDP), with or without
recomputing each block. The global batch is fixed (``global_batch`` sequences per step, in
micro-batches of ``micro_batch``), so a layout also fixes the micro-batches each pipeline
runs per step, ``m = global_batch / (dp * micro_batch)``, and with them its bubble.

Of the layouts whose fullest GPU fits the card (:func:`helpers.memory.fits.per_gpu`), the
search chooses in :func:`rule_key`'s order: the fewest model-parallel GPUs ``tp * pp``
(data parallelism scales the rest); at equal ``tp * pp``, tensor parallelism inside a node
before pipeline stages across nodes, which is also the smaller 1F1B bubble
``(pp - 1) / (m + pp - 1)``; then no recomputation if it fits without (it reruns every
block's forward); then the least sharding. The first two are the takeaways of Narayanan
et al. 2021 (arXiv:2104.04473), whose data parallelism keeps whole copies of the model;
letting ZeRO's sharded data parallelism count as data parallelism is this course's
extension, which that paper's own comparison questions (§5.2: with twice the GPUs at the
same batch, their tensor + pipeline + data parallelism "outperforms ZeRO-3 by 70%",
ZeRO-3 without model parallelism, at 175B and 530B parameters): ``zero=(0, 1, 2)``
searches without ZeRO-3.

A mixture of experts (:class:`~helpers.memory.moe.MoETransformerShape`) adds ``ep``: its
routed experts split over ``ep`` of the ``dp`` ranks (``ep`` divides ``dp`` and the
experts). At equal everything else the search takes the smallest ``ep`` that fits
(:func:`search_key`): a larger one sends each token's copies to more ranks, beyond a node
once ``ep > 8``.
:func:`helpers.composed.published_layouts.compare_moe` sets the search beside a published
MoE layout.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

from helpers.core.sizes import format_bytes
from helpers.memory.fits import ClusterLayout, per_gpu
from helpers.memory.ledger import DeviceMemory
from helpers.memory.moe import MoETransformerShape
from helpers.memory.parameters import ZERO_STAGES, validate_recompute, validate_zero
from helpers.memory.transformer import TransformerShape
from helpers.pipeline.events import bubble_theory

CARD = 80 * 2**30  # an "80 GB" card, counted as 80 GiB
GPUS_PER_NODE = 8
SHARDING = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "FSDP"}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}; valid: an integer >= 1")
    return value


@dataclass(frozen=True)
class Candidate:
    """One layout of the search, its micro-batches per step and its fullest GPU's ledger."""

    layout: ClusterLayout
    microbatches: int
    memory: DeviceMemory

    tp = property(lambda self: self.layout.tp)
    pp = property(lambda self: self.layout.pp)
    dp = property(lambda self: self.layout.dp)
    zero = property(lambda self: self.layout.zero)
    recompute = property(lambda self: self.layout.recompute)

    @property
    def model_parallel(self) -> int:
        """GPUs that share one copy of the model: tp x pp."""
        return self.tp * self.pp

    @property
    def bubble(self) -> float:
        """1F1B's idle share of a step, (pp - 1) / (m + pp - 1) (0 without stages)."""
        return bubble_theory("1f1b", self.pp, self.microbatches)


def rule_key(c: Candidate) -> tuple:
    """The rule as a sort key, smallest first: tp x pp, then pp (TP inside a node before
    PP across nodes), then the bubble, then no recomputation, then the ZeRO stage."""
    return (c.model_parallel, c.pp, c.bubble, c.recompute, c.zero)


def search_key(c: Candidate) -> tuple:
    """:func:`rule_key`, then the smallest ``ep`` (1 without experts)."""
    return (*rule_key(c), c.layout.ep)


@dataclass(frozen=True)
class Search:
    """All the layouts tried for one model on one cluster."""

    model: str
    gpus: int
    gpu_bytes: int
    tried: tuple[Candidate, ...]

    @property
    def fitting(self) -> list[Candidate]:
        """The layouts whose fullest GPU fits the card, in the rule's order."""
        return sorted((c for c in self.tried if c.memory.total <= self.gpu_bytes), key=search_key)

    @property
    def chosen(self) -> Candidate | None:
        """The rule's choice, or None when nothing fits."""
        fitting = self.fitting
        return fitting[0] if fitting else None

    @property
    def least(self) -> Candidate:
        """The layout whose fullest GPU holds the least (the closest when nothing fits)."""
        return min(self.tried, key=lambda c: (c.memory.total, search_key(c)))


def valid_tp(shape: TransformerShape, per_node: int = GPUS_PER_NODE) -> list[int]:
    """Tensor-parallel sizes inside one node that divide the heads, the kv heads and the MLP
    (and the experts' and shared experts' widths)."""
    widths = [shape.heads, shape.kv, shape.ffn]
    if isinstance(shape, MoETransformerShape):
        widths += [shape.moe_ffn, shape.shared_width]
    return _divisors(math.gcd(per_node, *widths))


def search_layouts(shape: TransformerShape, gpus: int, *, model: str = "", seq: int = 4096,
                   global_batch: int = 1024, micro_batch: int = 1, gpu_bytes: int = CARD,
                   per_node: int = GPUS_PER_NODE, tp: tuple[int, ...] | None = None,
                   zero: tuple[int, ...] = ZERO_STAGES,
                   recompute: tuple[bool, ...] = (False, True),
                   ep: tuple[int, ...] | None = None) -> Search:
    """Every layout of ``gpus`` GPUs for mixed-precision Adam, the fitting ones in the rule's
    order. ``tp``, ``zero``, ``recompute``, ``ep`` narrow the choices tried (``ep``: the
    divisors of the experts that divide ``dp``; 1 without experts); tensor-parallel layouts
    use sequence parallelism, and a pipeline runs at least one micro-batch per stage."""
    if not isinstance(shape, TransformerShape):
        raise ValueError(f"shape={shape!r}; valid: a TransformerShape, e.g. LLAMA_70B_SHAPE")
    for name, value in (("gpus", gpus), ("seq", seq), ("global_batch", global_batch),
                        ("micro_batch", micro_batch), ("gpu_bytes", gpu_bytes),
                        ("per_node", per_node)):
        _positive(name, value)
    if global_batch % micro_batch:
        raise ValueError(f"global_batch={global_batch} is not a whole number of micro-batches "
                         f"of {micro_batch}; valid micro_batch: {_divisors(global_batch)}")
    tps = valid_tp(shape, per_node)
    for t in tp or ():
        if t not in tps or gpus % t:
            raise ValueError(f"tp={t!r}; valid for this model on {gpus} GPUs: "
                             f"{[d for d in tps if gpus % d == 0]}")
    for stage in zero:
        validate_zero(stage)
    for flag in recompute:
        validate_recompute(flag)
    experts = shape.experts if isinstance(shape, MoETransformerShape) else 1
    for e in ep or ():
        if type(e) is not int or experts % e:
            why = f"the divisors of its {experts} experts" if experts > 1 else "no experts"
            raise ValueError(f"ep={e!r}; valid for this model: {_divisors(experts)} ({why})")
    tried = []
    for t in tp or [d for d in tps if gpus % d == 0]:
        for p in [d for d in _divisors(gpus // t) if d <= shape.blocks]:
            d = gpus // (t * p)
            if global_batch % (d * micro_batch) or global_batch // (d * micro_batch) < p:
                continue
            m = global_batch // (d * micro_batch)
            eps = [e for e in ep or _divisors(math.gcd(d, experts)) if d % e == 0]
            for z, r, e in itertools.product([s for s in zero if d > 1 or s == 0], recompute,
                                             eps):
                layout = ClusterLayout("", tp=t, pp=p, dp=d, zero=z, recompute=r, ep=e)
                memory = per_gpu(shape, layout, seq=seq, micro_batch=micro_batch,
                                 microbatches=m, sequence_parallel=t > 1)
                tried.append(Candidate(layout, m, memory))
    if not tried:
        raise ValueError(f"no layout of {gpus} GPUs runs a global batch of {global_batch} in "
                         f"micro-batches of {micro_batch}; valid: a global batch that dp "
                         f"x micro_batch divides")
    return Search(model, gpus, gpu_bytes, tuple(tried))


def describe(c: Candidate) -> str:
    """A layout in words, e.g. 'TP 8 x PP 2 x ZeRO-1 4 + recompute', or with experts split
    over 8 of the data-parallel ranks 'PP 4 x ZeRO-1 16 (EP 8)'."""
    parts = [f"TP {c.tp}" if c.tp > 1 else "", f"PP {c.pp}" if c.pp > 1 else "",
             f"{SHARDING[c.zero]} {c.dp}" + (f" (EP {c.layout.ep})" if c.layout.ep > 1 else "")
             if c.dp > 1 else ""]
    text = " x ".join(filter(None, parts)) or "one GPU"
    return text + (" + recompute" if c.recompute else "")


def format_search(searches: list[Search]) -> str:
    """One row per search: the chosen layout and its fullest GPU (or, when nothing fits,
    the layout that comes closest)."""
    head = (f"{'model':<10}{'GPUs':>5}{'fit/tried':>10}  {'chosen layout':<31}{'tp':>3}{'pp':>4}"
            f"{'dp':>5}{'m':>6}{'bubble':>8}  {'fullest GPU':>11}")
    lines = [head]
    for s in searches:
        c = s.chosen or s.least
        name = describe(c) if s.chosen else f"none; closest {describe(c)}"
        lines.append(f"{s.model:<10}{s.gpus:>5}{f'{len(s.fitting)}/{len(s.tried)}':>10}  "
                     f"{name:<31}{c.tp:>3}{c.pp:>4}{c.dp:>5}{c.microbatches:>6}"
                     f"{c.bubble:>8.1%}  {format_bytes(c.memory.total):>11}")
    return "\n".join(lines)


def search_chart(searches: list[Search], path: str | Path, *, title: str | None = None) -> Path:
    """Stacked bars in GiB of each chosen layout's fullest GPU (the closest layout where
    nothing fits, hatched), one panel per model on one scale, one bar per cluster with its
    layout above it, the card dashed."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from helpers.core.plotting import save_figure
    from helpers.memory.ledger import KINDS
    from helpers.memory.plots import LABELS

    models = list(dict.fromkeys(s.model for s in searches))
    if not models or len({s.gpu_bytes for s in searches}) != 1:
        raise ValueError("searches: valid: a non-empty list of searches against one card")
    card = searches[0].gpu_bytes / 2**30
    rows = [len([s for s in searches if s.model == m]) for m in models]
    fig, axes = plt.subplots(len(models), 1, figsize=(7.5, 1.2 + 0.75 * sum(rows)),
                             sharex=True, squeeze=False, height_ratios=rows)
    most = max(card, *((s.chosen or s.least).memory.total / 2**30 for s in searches))
    for ax, model in zip(axes[:, 0], models, strict=True):
        mine = [s for s in searches if s.model == model]
        shown = [s.chosen or s.least for s in mine]
        y = list(range(len(mine)))
        left = [0.0] * len(mine)
        for k, kind in enumerate(KINDS):
            widths = [getattr(c.memory, kind) / 2**30 for c in shown]
            ax.barh(y, widths, 0.45, left=left, color=f"C{k}",
                    hatch=["" if s.chosen else "//" for s in mine])
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.axvline(card, color="red", linestyle="--")
        for row, (s, c) in enumerate(zip(mine, shown, strict=True)):
            ax.annotate(describe(c) if s.chosen else f"none fits; closest: {describe(c)}",
                        (0, row - 0.25), xytext=(2, 1), textcoords="offset points",
                        va="bottom", fontsize=8)
        ax.set_yticks(y, [f"{s.gpus} GPUs" for s in mine])
        ax.set_ylim(len(mine) - 0.5, -0.85)  # the first cluster on top, room for its label
        ax.set_xlim(0, 1.05 * most)
        ax.set_title(model, fontsize=10)
        ax.xaxis.grid(True)
        ax.set_axisbelow(True)
    axes[-1, 0].set_xlabel(f"GiB on the fullest GPU ({card:g} GiB cards)")
    handles = [Patch(color=f"C{k}", label=LABELS[kind]) for k, kind in enumerate(KINDS)]
    handles += [Patch(facecolor="white", edgecolor="black", hatch="//", label="nothing fits"),
                Line2D([], [], color="red", linestyle="--", label=f"{card:g} GiB card")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return save_figure(fig, path)
