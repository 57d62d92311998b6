"""Processes that end with the process that started them, however it ends.

The launcher kills its torchrun job on a timeout, an error or an interrupt, but it cannot
act once it is dead itself: a kernel killed hard (SIGKILL, a crash) leaves the torchrun
agent and its ranks re-parented to init, running unsupervised. Linux offers a cure: a
process may ask for a signal when its parent dies (``prctl(PR_SET_PDEATHSIG)``). The
launcher asks it for the torchrun agent, and every rank asks it for itself, so the
death of the launching process reaches the agent, and the agent's death every rank.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# Resolved here, in the parent: the child between fork and exec (``preexec_fn``) then only
# makes the call, without loading anything while other threads may hold the loader's lock.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies.

    ``parent``: the pid the caller expects as parent; if the parent is already gone
    (re-parented before the request took effect), ``sig`` is sent at once. Returns False
    where the request is not available (not Linux), True otherwise.
    """
    if _PRCTL is None or not sys.platform.startswith("linux"):
        return False
    if _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def child_of_this_process() -> Callable[[], bool]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child dies (SIGKILL) with this process."""
    me = os.getpid()
    return lambda: die_with_parent(signal.SIGKILL, parent=me)
