"""The 3-D run's typed results, what the shapes predict, and every verdict.

Tolerances, named once, both in units of the run's floating-point epsilon (float32's
or float64's): the layouts compute the same products and add them in another order (a
micro-batch's mean, then the mean over micro-batches and data-parallel shards; the
vocabulary's softmax in slices), and each reordering costs a few epsilons.

- ``EPSILONS`` (4) epsilons of a step's loss: how far its loss may be from the one
  process's. Chosen, not derived (a rounding-error bound through the whole model is not
  worked out here), and confirmed: the lesson prints the largest share of it any layout
  used, and shows that a halved gradient moves the losses by up to billions of times more.
- The final weights: AdamW moves a weight by ``lr * m / (sqrt(v) + eps_adam)``. Where a
  gradient is near zero that quotient's slope is at most ``1 / eps_adam`` (1e8), so a
  difference ``delta`` in a gradient moves the weight by at most ``lr * delta / eps_adam``
  per step. With ``delta`` taken as ``EPSILONS`` epsilons of the largest gradient, G (an
  assumption, like the loss's tolerance), the bound is ``steps * lr * EPSILONS * eps * G /
  eps_adam``; it leaves out how a weight's difference feeds the later gradients. In
  float64 it is far below the updates, and far above the differences seen (printed); in
  float32 it exceeds all the run's updates together (``steps * lr``) and proves nothing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from helpers.comm.headers import wire_within
from helpers.composed.experts import layout_name
from helpers.composed.layout import Layout
from helpers.core.checks import Proof
from helpers.memory.ledger import KINDS, DeviceMemory
from helpers.runs.contract import Record
from helpers.runs.llama_3d.config import THREE_D, SuiteConfig

EPSILONS = 4
ACTIVATION_TOLERANCE = 0.01  # see ``ledger``: index tensors and the like, a few hundred bytes
ADAM_EPS = 1e-8  # torch.optim.AdamW's default
DIMS = ("dp", "cp", "tp", "pp")  # "dp": fully_shard's ranks, dp x cp when cp > 1
# gloo's headers, in bytes per call on a group of 2 ranks. gloo's TCP transport announces
# each send with a 48-byte NOTIFY_SEND_READY and prefixes its data with a 48-byte preamble
# (96 B a send), and answers each posted receive with a 48-byte NOTIFY_RECV_READY
# (gloo/transport/tcp/pair.cc). A ring all-reduce of a tensor below its 1 MiB segment cuts
# it into 2N segments: 4(N - 1) sends and receives, 576 B on 2 ranks (a reduce-scatter is
# an all-reduce on gloo); an all-gather was measured at 288 B (2 sends, 2 receives); a
# pipeline batch posts at most a send and a receive per neighbour, two neighbours: 288 B;
# an all-to-all one piece to and from each other rank, even empty: 144 B. On N ranks a
# collective's headers are N - 1 times these (tests/composed/test_wire_headers.py).
HEADER_BYTES = {"all_reduce": 576, "reduce_scatter": 576, "all_gather": 288, "p2p": 288,
                "all_to_all": 144}


@dataclass
class Traffic(Record):
    """What one rank sent in a timed step (the mean over them): per mesh dimension, the
    calls and their bytes by the ring formula (NCCL's ring) and by gloo's algorithms; for
    the process, the bytes its sockets carried (``wire``; None where not read, as
    ``wire_note`` says), not split by dimension (a socket is named by its ports)."""

    calls: dict[str, float]  # per dimension: collectives, and the pipeline's batches of sends
    ring: dict[str, float]
    gloo: dict[str, float]
    kinds: dict[str, float]  # calls per collective ("p2p": the pipeline's), every dimension
    wire: float | None
    wire_note: str = ""
    largest_group: int = 2  # ranks in the largest dp or tp group (headers grow with it)

    @property
    def total_gloo(self) -> float:
        return float(sum(self.gloo.values()))

    @property
    def headers(self) -> float:
        """The most gloo's headers can add to a step (``HEADER_BYTES``)."""
        scale = {k: 1 if k == "p2p" else self.largest_group - 1 for k in self.kinds}
        return float(sum(HEADER_BYTES.get(k, 0) * n * scale[k] for k, n in self.kinds.items()))


@dataclass
class RankRecord(Record):
    """One rank of one layout: where it sits, what it held, sent and spent."""

    rank: int
    coords: dict[str, int]  # its index along pp, dp, cp, tp
    measured: DeviceMemory  # activations: the peak of the last step, over what it began with
    predicted: DeviceMemory
    held_over: int  # saved-for-backward bytes still alive as the last step began
    traffic: Traffic  # per timed step
    predicted_ring: dict[str, float]  # bytes per step, per mesh dimension, from the shapes
    predicted_gloo: dict[str, float]
    comm_s: dict[str, float]  # seconds in communication per timed step, per mesh dimension
    step_s: list[float]  # each timed step (the first step, the warm-up, is left out)

    @property
    def stage(self) -> int:
        """Its pipeline stage."""
        return self.coords["pp"]

    @property
    def first_of_stage(self) -> bool:
        """The stage's rank at dp = cp = tp = 0 (its stage's ranks hold the same sizes)."""
        return self.coords["dp"] == self.coords.get("cp", 0) == self.coords["tp"] == 0

    @property
    def state_ok(self) -> bool:
        """Weights, gradients and optimizer state: measured = predicted, to the byte."""
        return all(getattr(self.measured, k) == getattr(self.predicted, k) for k in KINDS[:3])

    @property
    def activation_error(self) -> float:
        """(measured - predicted) / predicted activations."""
        return (self.measured.activations - self.predicted.activations) / self.predicted.activations

    @property
    def sizes_ok(self) -> bool:
        """The calls along each dimension add up to the bytes the plan predicts
        (``ledger.predicted_sent``), by the ring formula and by gloo's algorithms (which
        weighs reduce-scatters apart); the number of calls is not predicted."""
        return (self.traffic.ring == self.predicted_ring
                and self.traffic.gloo == self.predicted_gloo)

    @property
    def wire_ok(self) -> bool | None:
        """The bytes on this rank's sockets lie between gloo's payload for the calls issued
        and that payload plus ``HEADER_BYTES`` per call; None where the wire was not read."""
        t = self.traffic
        return wire_within(t.wire, t.total_gloo, t.headers)

    @property
    def sent_ok(self) -> bool:
        """What it sent is what the plan says: the sizes, and the wire where it was read."""
        return self.sizes_ok and self.wire_ok is not False

    @property
    def ledger_ok(self) -> bool:
        return self.state_ok and abs(self.activation_error) <= ACTIVATION_TOLERANCE

    def proofs(self) -> list[Proof]:
        """Its ledger against the prediction: weights, gradients and optimizer state in
        bytes (exact), then the activations' relative error (``ACTIVATION_TOLERANCE``)."""
        where = f"rank {self.rank} (stage {self.stage})"
        return [*(Proof(f"{where} {k}", abs(getattr(self.measured, k)
                                            - getattr(self.predicted, k)), 0)
                  for k in KINDS[:3]),
                Proof(f"{where} activations", abs(self.activation_error), ACTIVATION_TOLERANCE)]


@dataclass
class LayoutRun(Record):
    """One layout trained for ``steps`` steps, against the one-process run."""

    pp: int
    dp: int
    tp: int
    dtype: str
    lr: float
    losses: list[float]
    reference: list[float]
    weight_diff: float  # the largest |w - w_ref| over every parameter, after the last step
    grad_scale: float  # the largest |gradient| element of the one-process run, any step
    weights_compared: int  # parameters compared (each once), to be the model's count
    parameters: int
    weights_sha256: str  # the final weights' fingerprint (``digest``), whatever the layout
    ranks: list[RankRecord] = field(default_factory=list)
    resumed_from: int | None = None  # the checkpoint's step, when it started from one
    attempt: int = 0  # torchrun's restart count when this run finished
    loaded_ok: bool | None = None  # the loaded weights' fingerprint = the checkpoint's
    cp: int = 1
    experts: int = 0  # the MoE model's experts per block, each token's top_k (0: dense)
    top_k: int = 0

    @property
    def layout(self) -> Layout:
        return Layout(self.pp, self.dp, self.tp, self.cp)

    @property
    def name(self) -> str:  # the layout's, "ep=..." for the dp ranks of the MoE model
        return layout_name(self.layout, self.experts)

    @property
    def loss_diffs(self) -> list[float]:
        return [abs(a - b) for a, b in zip(self.losses, self.reference, strict=True)]

    @property
    def eps(self) -> float:
        return torch.finfo(getattr(torch, self.dtype)).eps

    @property
    def loss_tolerances(self) -> list[float]:
        return [EPSILONS * self.eps * abs(b) for b in self.reference]

    @property
    def loss_share(self) -> float:
        """The largest loss difference as a share of its tolerance (1: at the tolerance)."""
        return max(d / t for d, t in zip(self.loss_diffs, self.loss_tolerances, strict=True))

    @property
    def steps_run(self) -> int:
        """Steps this run trained (a resumed run starts after its checkpoint's step)."""
        return len(self.losses) - (0 if self.resumed_from is None else self.resumed_from + 1)

    @property
    def losses_ok(self) -> bool:
        return all(d <= t for d, t in zip(self.loss_diffs, self.loss_tolerances, strict=True))

    @property
    def weight_tolerance(self) -> float:
        steps = len(self.losses)
        return steps * self.lr * EPSILONS * self.eps * self.grad_scale / ADAM_EPS

    @property
    def weights_ok(self) -> bool:
        return (self.weight_diff <= self.weight_tolerance
                and self.weights_compared == self.parameters)

    @property
    def ok(self) -> bool:
        return self.losses_ok and self.weights_ok and self.loaded_ok is not False

    def proofs(self) -> list[Proof]:
        """Each step's loss and the final weights against the one-process run, with the
        tolerances above (``ok`` also needs every parameter compared)."""
        name = self.name
        return [*(Proof(f"{name}: loss, step {k}", d, t) for k, (d, t) in
                  enumerate(zip(self.loss_diffs, self.loss_tolerances, strict=True))),
                Proof(f"{name}: final weights", self.weight_diff, self.weight_tolerance)]

    def stage_ranks(self) -> list[RankRecord]:
        """One rank per pipeline stage (the others of a stage hold the same sizes)."""
        return [r for r in self.ranks if r.first_of_stage]

    def step_time(self, rank: int = 0) -> tuple[float, float]:
        """Mean and standard deviation of a rank's timed steps, seconds."""
        times = self.ranks[rank].step_s
        return statistics.mean(times), statistics.stdev(times) if len(times) > 1 else 0.0

    def report(self, indent: str = "  ") -> str:
        """Three short lines: the verdict, then the losses' and the weights' largest
        difference from the one-process run, each against its tolerance."""
        verdict = "equal to" if self.ok else "DIFFERENT from"
        return (f"{self.name}: {verdict} the one-process run\n"
                f"{indent}losses: largest |diff| {max(self.loss_diffs):.1e} "
                f"({self.loss_share:.2f} of the tolerance)\n"
                f"{indent}weights: largest |diff| {self.weight_diff:.1e} (tolerance "
                f"{self.weight_tolerance:.1e}); {self.weights_compared} of {self.parameters} "
                "parameters compared")


@dataclass
class SuiteResult(Record):
    """Every layout's run, and the three runs of the checkpoint round trip."""

    config: SuiteConfig
    runs: list[LayoutRun]  # the 3-D one saved a checkpoint after ``save_step``
    two_d: LayoutRun  # dp x tp, resumed from the 3-D checkpoint, saving after the next step
    back: LayoutRun  # 3-D again, resumed from the 2-D checkpoint

    @property
    def ok(self) -> bool:
        return all(r.ok for r in [*self.runs, self.two_d, self.back])

    def mesh_order(self) -> MeshOrder:
        """The counted traffic's case for tp innermost (:class:`MeshOrder`): dense layouts."""
        ranks = [r for run in self.runs if not run.experts for r in run.ranks]
        both = [r.traffic for r in ranks if {"dp", "tp"} <= set(r.traffic.ring)]
        with_tp = [r.traffic for r in ranks if "tp" in r.traffic.calls]
        return MeshOrder(
            fsdp_sends_more=all(t.ring["dp"] > t.ring["tp"] for t in both),
            tp_calls_most=all(t.calls["tp"] == max(t.calls.values()) for t in with_tp),
            full=next(r for r in self.runs
                      if r.layout == THREE_D and not r.experts).ranks[0].traffic)

    @property
    def moe(self) -> LayoutRun | None:  # the MoE layout's run (None when the suite ran none)
        return next((run for run in self.runs if run.experts), None)


@dataclass(frozen=True)
class MeshOrder:
    """Why tp is innermost, from the counted traffic: not its bytes (FSDP, over dp, sends
    more wherever both run) but its calls (tp makes the most on every rank that has it)."""

    fsdp_sends_more: bool
    tp_calls_most: bool
    full: Traffic  # the full 3-D layout's rank 0, per step

    @property
    def ok(self) -> bool:
        return self.fsdp_sends_more and self.tp_calls_most

    def __str__(self) -> str:
        from helpers.core.sizes import format_bytes

        full = self.full
        return "\n".join([
            "the dp x tp x pp layout's rank 0, per step, by gloo's algorithms:",
            "  " + "; ".join(f"{d} {full.calls[d]:.0f} calls, {format_bytes(full.gloo[d])}"
                             for d in ("tp", "dp", "pp")),
            f"  tp sends {full.gloo['tp'] / full.gloo['pp']:.0f} x the bytes of pp"])
