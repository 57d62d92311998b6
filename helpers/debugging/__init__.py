"""Seeing and debugging a distributed run: traces, overlap, hangs, FLOPs.

- ``intervals``: time as sets of intervals (union, intersection, difference)
- ``trace``: each rank's ``torch.profiler`` trace read, checked and merged into one
  timeline; what in it is computing and what is communicating
- ``overlap``: a rank's time split into computing, communicating, both and idle, and the
  overlap share
- ``hangs``: four ways a job hangs, and the diagnosis from the ranks' Flight Recorder
  dumps (and from ``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s and ``monitored_barrier``'s errors)
- ``flops``: a training step's FLOPs from the shapes and from ``FlopCounterMode``; this
  CPU's measured peak; MFU and HFU; GPUs' published peaks
- ``plan_counts``: the collectives the tensor-parallel plan issues, predicted per module
  (what ``CommDebugMode`` counts)
- ``diagrams``: the lesson's pictures
"""

TAUGHT = ("diagrams", "flops", "hangs", "intervals", "overlap", "plan_counts", "trace")
