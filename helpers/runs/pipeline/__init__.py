"""Lesson 03's run machinery: ``config`` in, ``worker`` (one stage per process), ``results``
(every proof's verdict) out; ``timings`` and ``speedup`` (the same step in this process, like
for like) and ``report`` (the chart)."""
