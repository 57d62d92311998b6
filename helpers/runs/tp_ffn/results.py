"""Lesson 08's typed results, and where each verdict is taken.

Every worker decides each proof's verdict once, on the ranks, as a ``Proof`` whose
tolerance comes from :func:`helpers.tensor_parallel.proofs.output_tolerance` (a few units
in the last place per rank); rank 0 writes its result (``to_dict``) and the lesson reads
it back (``from_dict``) into the same object, whose reports are what the lesson prints.
A run's sum agrees with native's within ``eps * sum|y|`` (``checksums_match``), and the
bytes each rank's sockets sent for g's all-reduce lie within gloo's prediction
(``helpers.runs.tp_ffn.wire.WireCheck``: the payload, plus the headers its algorithm writes).
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.core.checks import Proof, Verdict
from helpers.core.timing import Timing
from helpers.memory.ledger import Ledger
from helpers.profiles import FFNSizes
from helpers.runs.contract import Record
from helpers.runs.tp_ffn.wire import WireCheck, wire_line
from helpers.tensor_parallel.dtensor import DTensorRun
from helpers.tensor_parallel.proofs import checksum_tolerance, checksums_match


@dataclass(frozen=True)
class NativeRun(Record):
    """The source's native mode: the whole FFN in one process, and ``tp_simulate`` against it."""

    dtype: str
    shape: tuple[int, ...]
    checksum: float
    abs_sum: float
    timing: Timing
    simulate: Proof  # the ranks as a loop in this one process, against the whole FFN

    def sums_match(self, checksum: float) -> bool:
        """Whether another output's sum equals this one's within ``eps * sum|y|``."""
        return checksums_match(self.checksum, checksum, self.abs_sum, self.dtype)


@dataclass(frozen=True)
class TrainStep(Record):
    """One float32 SGD step through f and g against the same step of the whole model."""

    activation: str
    lr: float
    loss: float
    proofs: tuple[Proof, ...]  # loss, output, input_grad, grads, weights

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.proofs)


@dataclass(frozen=True)
class WideRun(Record):
    """The forward at a second, wider size, cut in memory on the same ranks, timed and proven."""

    sizes: FFNSizes
    output: Proof  # rank 0's output against the whole FFN in one piece
    compute: Timing
    allreduce: Timing
    step: Timing


@dataclass(frozen=True)
class TPRun(Record):
    """Rank 0's result of one tensor-parallel run: the proof, the timings, the ledger, the step."""

    world_size: int
    backend: str
    device: str
    dtype: str
    shape: tuple[int, ...]
    checksum: float
    abs_sum: float
    output: Proof  # every rank's full output against the native FFN, worst over ranks
    compute: Timing
    allreduce: Timing
    step: Timing
    ring_bytes: float  # what a ring (NCCL's) sends per rank per all-reduce: 2(p-1)/p x output
    memory: Ledger  # rank 0's, one float32 SGD step, measured on the rank
    wire: tuple[WireCheck, ...] = ()  # each rank's sockets, one forward's all-reduce (g)
    train_step: TrainStep | None = None
    dtensor: DTensorRun | None = None  # parallelize_module on the same ranks, if asked
    wide: WideRun | None = None  # the forward at a wider size, if asked
    node_commands: tuple[str, ...] = ()  # as each node's operator types them, if on nodes

    def agrees(self, native: NativeRun) -> bool:
        """Element by element within the tolerance, and the same sum as native."""
        return self.output.ok and native.sums_match(self.checksum)

    @property
    def wire_ok(self) -> bool:
        """Every rank's sockets sent what gloo's algorithm predicts (or were not read)."""
        return all(w.ok for w in self.wire)

    BYTES_HEAD = (f"{'p':>2}{'ring formula':>14}{'gloo payload':>14}{'+ headers':>11}"
                  "  on the wire, each rank")

    def bytes_row(self) -> str:
        """One forward's all-reduce (g), per rank: the ring formula, gloo's algorithm
        (payload and headers) and what the sockets sent, under :attr:`BYTES_HEAD`."""
        head = f"{self.world_size:>2}{self.ring_bytes:>12,.0f} B"
        if not self.wire:
            return f"{head}{'':>25}  not read"
        w, line = self.wire[0], wire_line(self.wire)
        if not line.startswith(("=", "not measured")):
            line += ": within the prediction" if self.wire_ok else ": NOT within the prediction"
        return f"{head}{w.payload:>12,.0f} B{w.headers:>9,} B  {line}"

    def report(self, native: NativeRun) -> str:
        """One line: the worst difference from native over every rank and element, the sum."""
        o = self.output
        return (
            f"world size {self.world_size}: max |tp - native| ≈ {o.max_diff:.1e} over "
            f"{list(self.shape)}, tolerance ≈ {o.tolerance:.1e}; sum ≈ {self.checksum:.4f}"
            f"  {'OK' if self.agrees(native) else 'FAILED'}"
        )

    def step_report(self) -> str:
        """The training step's proofs, one line each (the run must have taken the step)."""
        s = self.train_step
        if s is None:
            raise ValueError("this run took no training step; launch it with train_step=True")
        lines = [f"p={self.world_size}: one SGD step (lr {s.lr}), activation {s.activation}"]
        return "\n".join(lines + ["  " + p.line(11) for p in s.proofs])


@dataclass(frozen=True)
class SweepRun(Record):
    """One launch of max(p) ranks (``sweep``): rank 0's native run, then for each world
    size p the tensor-parallel run of ranks 0 .. p-1, a group of their own."""

    native: NativeRun  # on rank 0, in the same kind of process as the runs
    runs: dict[int, TPRun]  # world size p -> the result of the group of ranks 0 .. p-1
    work_s: float = 0.0  # rank 0's wall time from native's start to the result: no start-up

    @property
    def ok(self) -> bool:
        """tp_simulate, and every world size's output, agree with native; every rank's
        sockets sent what gloo predicts."""
        return self.native.simulate.ok and all(r.agrees(self.native) and r.wire_ok
                                               for r in self.runs.values())

    def output_verdict(self) -> Verdict:
        """One line for every world size's output against native: element by element, the
        sum, and the one-process ``tp_simulate``."""
        native, proofs = self.native, [self.native.simulate]
        for p, run in self.runs.items():
            proofs.append(Proof(f"p={p} {run.output.what}", run.output.max_diff,
                                run.output.tolerance))
            proofs.append(Proof(f"p={p} sum", abs(run.checksum - native.checksum),
                                checksum_tolerance(native.abs_sum, native.dtype)))
        return Verdict("every world size computes the native output", proofs)

    def step_verdict(self) -> Verdict:
        """One line for the training step of every world size (each must have taken it)."""
        if any(r.train_step is None for r in self.runs.values()):
            raise ValueError("a run took no training step; launch it with train_step=True")
        return Verdict("one SGD step through f and g = one process's step",
                       [Proof(f"p={p} {q.what}", q.max_diff, q.tolerance)
                        for p, r in self.runs.items() for q in r.train_step.proofs])

    def wide_verdict(self) -> Verdict:
        """One line for the wide FFN's output at every world size (each must have run it)."""
        if any(r.wide is None for r in self.runs.values()):
            raise ValueError("a run timed no wide FFN; launch it with wide=...")
        return Verdict("the wide FFN's output = the whole FFN's at every p",
                       [Proof(f"p={p} output", r.wide.output.max_diff, r.wide.output.tolerance)
                        for p, r in self.runs.items()])


@dataclass(frozen=True)
class MeshRun(Record):
    """Rank 0's result: one step on a (dp x tp) mesh against one device."""

    world_size: int
    dp: int
    tp: int
    backend: str
    mesh: tuple[tuple[int, ...], ...]
    proofs: tuple[Proof, ...]  # outputs (each group's rows), updated weight shards
    node_commands: tuple[str, ...] = ()  # as each node's operator types them, if on nodes

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.proofs)

    def verdict(self) -> Verdict:
        """One line for the step on the mesh against one device."""
        return Verdict(f"the {self.dp} x {self.tp} mesh's step = one device's",
                       self.proofs)

    def report(self) -> str:
        head = (
            f"{self.world_size} ranks as a (dp={self.dp}) x (tp={self.tp}) mesh "
            f"{[list(r) for r in self.mesh]}, {self.backend}"
        )
        return "\n".join([head] + ["  " + p.line(22) for p in self.proofs])
