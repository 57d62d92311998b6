"""The series' own failures share one base class, so a learner can ``except`` one thing.

Bad arguments raise ``ValueError`` (or ``TypeError``) naming the bad value and the valid
choices. What goes wrong *outside* the arguments (files on disk, launched processes, a
model that does not fit its budgets) raises a subclass of :class:`TutorialError`.
"""

from __future__ import annotations


class TutorialError(Exception):
    """Base class of every failure the series itself reports."""


class FolderError(TutorialError):
    """A verified folder (shards, offloaded weights) that is incomplete or was changed."""


class ShardError(FolderError):
    """Shard files that are missing, corrupt, or written for another configuration."""


class DoesNotFitError(TutorialError):
    """A module fits on none of the devices left in a memory budget."""


class LaunchError(TutorialError):
    """A ``torchrun`` launch failed or timed out; ``rank`` is the failing rank when known."""

    def __init__(self, message: str, rank: int | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.log_tail = log_tail
        self.port_clash = False  # torchrun's rendezvous port was taken: a retry may succeed


class LaunchStopped(KeyboardInterrupt):
    """A launch stopped by the learner (Stop in Jupyter, Ctrl-C): its ranks were ended.

    A ``KeyboardInterrupt``, so a script still stops; in Jupyter (IPython) it shows as its
    one line instead of a traceback through the launcher."""

    def _render_traceback_(self) -> list[str]:  # IPython's hook for how to show an error
        return [f"{type(self).__name__}: {self}"]


class NotUnderTorchrunError(TutorialError):
    """A rank's code was started as a plain process instead of by ``torchrun``."""
