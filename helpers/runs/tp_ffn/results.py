"""Lesson 08's contract with its torchrun workers: a ``DemoConfig`` in, a typed result out.

Every worker decides each proof's verdict once, on the ranks, as a ``Proof`` whose
tolerance comes from :func:`helpers.tensor_parallel.proofs.output_tolerance`; rank 0
writes the result as JSON (``as_dict``) and the lesson reads it back (``from_dict``) into
the same object, whose reports are what the lesson prints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from helpers.core.checks import Proof
from helpers.profiles import FFNSizes
from helpers.core.timing import Timing
from helpers.memory.ledger import Ledger
from helpers.tensor_parallel.dtensor import DTensorRun
from helpers.tensor_parallel.proofs import checksum_tolerance, checksums_match


def _proofs(items: list[dict]) -> tuple[Proof, ...]:
    return tuple(Proof.from_dict(p) for p in items)


@dataclass(frozen=True)
class NativeRun:
    """``tp_demo``'s native mode: the whole FFN in one process, and ``tp_simulate`` against it."""

    dtype: str
    shape: tuple[int, ...]
    checksum: float
    abs_sum: float
    timing: Timing
    simulate: Proof  # the ranks as a loop in this one process, against the whole FFN

    def as_dict(self) -> dict:
        """The fields of ``tp_demo``'s native JSON that ``from_dict`` reads back."""
        return {
            "mode": "native",
            "dtype": self.dtype,
            "shape": list(self.shape),
            "checksum": self.checksum,
            "abs_sum": self.abs_sum,
            "checksum_tolerance": checksum_tolerance(self.abs_sum, self.dtype),
            "tp_simulate_max_diff": self.simulate.max_diff,
            "tp_simulate_tolerance": self.simulate.tolerance,
            "tp_simulate_agrees": self.simulate.ok,
            **self.timing.as_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> NativeRun:
        simulate = Proof("tp_simulate", d["tp_simulate_max_diff"], d["tp_simulate_tolerance"])
        return cls(
            d["dtype"],
            tuple(d["shape"]),
            d["checksum"],
            d["abs_sum"],
            Timing("native", d["times_s"]),
            simulate,
        )

    def sums_match(self, checksum: float) -> bool:
        """Whether another output's sum equals this one's within ``eps * sum|y|``."""
        return checksums_match(self.checksum, checksum, self.abs_sum, self.dtype)


@dataclass(frozen=True)
class TrainStep:
    """One float32 SGD step through f and g against the same step of the whole model."""

    activation: str
    lr: float
    loss: float
    proofs: tuple[Proof, ...]  # loss, output, input_grad, grads, weights

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.proofs)

    def as_dict(self) -> dict:
        return {
            "activation": self.activation,
            "lr": self.lr,
            "loss": self.loss,
            "proofs": [p.as_dict() for p in self.proofs],
            "agrees": self.ok,
        }

    @classmethod
    def from_dict(cls, d: dict) -> TrainStep:
        return cls(d["activation"], d["lr"], d["loss"], _proofs(d["proofs"]))


@dataclass(frozen=True)
class WideRun:
    """The forward at a second, wider size, cut in memory on the same ranks, timed and proven."""

    sizes: FFNSizes
    output: Proof  # rank 0's output against the whole FFN in one piece
    compute: Timing
    allreduce: Timing
    step: Timing

    def as_dict(self) -> dict:
        return {
            "sizes": asdict(self.sizes),
            "output": self.output.as_dict(),
            **{t.label: t.times for t in (self.compute, self.allreduce, self.step)},
        }

    @classmethod
    def from_dict(cls, d: dict) -> WideRun:
        times = (Timing(label, d[label]) for label in ("compute", "all-reduce", "step"))
        return cls(FFNSizes(**d["sizes"]), Proof.from_dict(d["output"]), *times)


@dataclass(frozen=True)
class TPRun:
    """Rank 0's result of ``ffn_worker``: the proof, the timings, the ledger, the step."""

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
    allreduce_bytes_per_rank: float  # a ring's 2(p-1)/p of the output's bytes
    memory: Ledger  # rank 0's, one float32 SGD step, measured on the rank
    train_step: TrainStep | None = None
    dtensor: DTensorRun | None = None  # parallelize_module on the same ranks, if asked
    wide: WideRun | None = None  # the forward at a wider size, if asked
    node_commands: tuple[str, ...] = ()  # as each node's operator types them, if on nodes

    def as_dict(self) -> dict:
        """Flat JSON, as ``tp_demo --json`` has always written it in tp mode."""
        return {
            "mode": "tp",
            "world_size": self.world_size,
            "backend": self.backend,
            "device": self.device,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "checksum": self.checksum,
            "abs_sum": self.abs_sum,
            "checksum_tolerance": checksum_tolerance(self.abs_sum, self.dtype),
            "output_max_diff": self.output.max_diff,
            "output_tolerance": self.output.tolerance,
            "output_agrees": self.output.ok,
            "compute_times_s": self.compute.times,
            "allreduce_times_s": self.allreduce.times,
            "allreduce_bytes_per_rank": self.allreduce_bytes_per_rank,
            **self.step.as_dict(),
            "memory": self.memory.as_dict(),
            **{k: None if v is None else v.as_dict() for k, v in self._parts().items()},
        }

    def _parts(self) -> dict:
        return {"train_step": self.train_step, "dtensor": self.dtensor, "wide": self.wide}

    @classmethod
    def from_dict(cls, d: dict) -> TPRun:
        parts = {k: d.get(k) for k in ("train_step", "dtensor", "wide")}
        kinds = {"train_step": TrainStep, "dtensor": DTensorRun, "wide": WideRun}
        typed = {k: None if v is None else kinds[k].from_dict(v) for k, v in parts.items()}
        return cls(
            d["world_size"], d["backend"], d["device"], d["dtype"], tuple(d["shape"]),
            d["checksum"], d["abs_sum"],
            Proof("output", d["output_max_diff"], d["output_tolerance"]),
            Timing("compute", d["compute_times_s"]), Timing("all-reduce", d["allreduce_times_s"]),
            Timing("step", d["times_s"]), d["allreduce_bytes_per_rank"],
            Ledger.from_dict(d["memory"]), **typed,
            node_commands=tuple(d.get("node_commands", ())),
        )  # fmt: skip

    def agrees(self, native: NativeRun) -> bool:
        """Element by element within the tolerance, and the same sum as native."""
        return self.output.ok and native.sums_match(self.checksum)

    def report(self, native: NativeRun) -> str:
        """One line: the worst difference from native over every rank and element, the sum."""
        o = self.output
        return (
            f"world size {self.world_size}: max |tp - native| ≈ {o.max_diff:.1e} over "
            f"{list(self.shape)} on {self.world_size} rank(s), tolerance ≈ {o.tolerance:.1e};"
            f" sum ≈ {self.checksum:.4f}  {'OK' if self.agrees(native) else 'FAILED'}"
        )

    def step_report(self) -> str:
        """The training step's proofs, one line each (the run must have taken the step)."""
        s = self.train_step
        if s is None:
            raise ValueError("this run took no training step; launch it with train_step=True")
        lines = [f"p={self.world_size}: one SGD step (lr {s.lr}), activation {s.activation}"]
        return "\n".join(lines + ["  " + p.line(11) for p in s.proofs])


@dataclass(frozen=True)
class SweepRun:
    """One launch of max(p) ranks (``ffn_worker --sweep``): rank 0's native run, then for
    each world size p the tensor-parallel run of ranks 0 .. p-1, a group of their own."""

    native: NativeRun  # on rank 0, in the same kind of process as the runs
    runs: dict[int, TPRun]  # world size p -> the result of the group of ranks 0 .. p-1
    work_s: float = 0.0  # rank 0's wall time from native's start to the result: no start-up

    @property
    def ok(self) -> bool:
        """tp_simulate, and every world size's output, agree with native."""
        return self.native.simulate.ok and all(r.agrees(self.native) for r in self.runs.values())

    def as_dict(self) -> dict:
        return {
            "mode": "sweep",
            "world_sizes": list(self.runs),
            "native": self.native.as_dict(),
            "runs": {str(p): r.as_dict() for p, r in self.runs.items()},  # JSON keys are strings
            "work_s": self.work_s,
        }

    @classmethod
    def from_dict(cls, d: dict) -> SweepRun:
        runs = {int(p): TPRun.from_dict(r) for p, r in d["runs"].items()}
        return cls(NativeRun.from_dict(d["native"]), runs, d["work_s"])
