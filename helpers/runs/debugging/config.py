"""The launches of lesson 12, as typed configs (each flag described by ``--help``).

``torchrun --nproc-per-node=2 -m helpers.runs.debugging.worker --trace-dir results/traces``
profiles a DDP step (overlap on and off), a pipeline step and the tensor-parallel plan's
collectives; ``torchrun --nproc-per-node=3 -m helpers.runs.debugging.drill --out
results/drills`` runs the hang drills side by side, each in a process group of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from helpers.core.flags import option, require_ints
from helpers.debugging.hangs import DRILLS, validate_drills
from helpers.models.llama import LMConfig
from helpers.profiles import Profile
from helpers.runs.contract import RunConfig

TRACE_DEFAULT_MODEL = LMConfig(vocab=1024, hidden=128, blocks=4, ffn=512, heads=4, kv_heads=2,
                               rope=True)


@dataclass(frozen=True)
class TraceConfig(RunConfig):
    """Profile each rank: a DDP step with its all-reduces overlapped and not, a pipeline
    step, and the collectives of the tensor-parallel plan (CommDebugMode)."""

    WORKER: ClassVar[str] = "helpers.runs.debugging.worker"

    trace_dir: str = option(help="folder where each rank writes its Chrome traces")
    model: LMConfig = option(TRACE_DEFAULT_MODEL, "the small Llama that DDP trains and the "
                             "tensor-parallel plan splits")
    batch: int = option(4, "sequences per rank per step")
    seq: int = option(64, "tokens per sequence")
    bucket_cap_mb: float = option(0.5, "DDP's bucket size with overlap on (MiB)")
    pipe_width: int = option(256, "width of the pipeline's MLP blocks")
    pipe_blocks: int = option(8, "MLP blocks, split evenly over the ranks")
    pipe_batch: int = option(256, "samples per pipeline step")
    microbatches: int = option(4, "micro-batches per pipeline step")
    warmup: int = option(2, "steps before each profiled one (DDP rebuilds its buckets in "
                         "its second step, with two broadcasts; a pipeline stage infers its "
                         "shapes in its first)")
    device: Literal["auto", "cpu", "cuda"] = option(
        "auto", "cpu (gloo), cuda (NCCL, one GPU per rank), or auto")

    @classmethod
    def for_profile(cls, profile: Profile, **changes: object) -> TraceConfig:
        """The lesson's launch: the profile's ``debugging`` sizes, then ``changes``."""
        d = profile.debugging
        return cls(**{"model": d.model, "batch": d.batch, "seq": d.seq,
                      "bucket_cap_mb": d.bucket_cap_mb, "pipe_width": d.pipe_width,
                      "pipe_blocks": d.pipe_blocks, "pipe_batch": d.pipe_batch,
                      "microbatches": d.microbatches, **changes})

    def ranks(self) -> int:
        return 2

    def validate(self, world_size: int) -> TraceConfig:
        super().validate(world_size)
        require_ints(self, {"batch": 1, "seq": 1, "pipe_width": 1, "pipe_blocks": 1,
                            "pipe_batch": 1, "microbatches": 1, "warmup": 0})
        if not self.trace_dir:
            raise ValueError("--trace-dir is empty; valid: a folder for the traces")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device {self.device!r}; valid choices: auto, cpu, cuda")
        if self.bucket_cap_mb <= 0:
            raise ValueError(f"--bucket-cap-mb {self.bucket_cap_mb}; valid: a size > 0")
        if self.pipe_blocks % world_size:
            raise ValueError(f"--pipe-blocks {self.pipe_blocks} does not split over "
                             f"{world_size} ranks; valid: a multiple of {world_size}")
        if self.pipe_batch % self.microbatches:
            raise ValueError(f"--pipe-batch {self.pipe_batch} is not divisible by "
                             f"--microbatches {self.microbatches}")
        return self


@dataclass(frozen=True)
class DrillConfig(RunConfig):
    """Hang drills side by side, one process group each: every rank's watchdog dumps its
    Flight Recorder and its stacks after ``--hang-seconds`` and takes the process down
    (the launcher's timeout ends a launch whose watchdogs never fire)."""

    WORKER: ClassVar[str] = "helpers.runs.debugging.drill"

    out: str = option(help="folder for each rank's evidence (Flight Recorder dump, stacks)")
    drills: tuple[str, ...] = option(tuple(DRILLS), f"which drills: {', '.join(DRILLS)}")
    culprit: int = option(2, "the rank that misbehaves in skip, mismatch and straggler")
    hang_seconds: float = option(2.0, "how long the watchdog lets a collective wait before "
                                 "it dumps and ends the rank (NCCL's watchdog timeout)")
    tools: bool = option(False, "run the drills under the checks that turn a hang into an "
                         "error: process groups that time out after --hang-seconds, and a "
                         "monitored_barrier before the straggler's collective (launch with "
                         "TORCH_DISTRIBUTED_DEBUG=DETAIL)")

    def ranks(self) -> int:
        return 3

    def validate(self, world_size: int) -> DrillConfig:
        super().validate(world_size)
        validate_drills(self.drills)
        if not self.out:
            raise ValueError("--out is empty; valid: a folder for the evidence")
        if world_size < 3:
            raise ValueError(f"world size {world_size}: a drill names its culprit by majority; "
                             "valid: 3 ranks or more")
        if not isinstance(self.culprit, int) or not 0 <= self.culprit < world_size:
            raise ValueError(f"--culprit {self.culprit!r}: no such rank; valid: 0 .. "
                             f"{world_size - 1}")
        if self.culprit in (0, 1) and "wrong_order" in self.drills:
            raise ValueError(f"--culprit {self.culprit}: ranks 0 and 1 are wrong_order's pair; "
                             f"valid: 2 .. {world_size - 1} with wrong_order")
        if not 0.5 <= self.hang_seconds <= 600:
            raise ValueError(f"--hang-seconds {self.hang_seconds}; valid: 0.5 to 600")
        return self
