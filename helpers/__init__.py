"""Code shared by the lessons: one module per concept.

- ``paths``: where results go, and how paths are shown to a learner.
- ``files``: atomic writes and checksums.
- ``profiles``: the ``small`` and ``full`` size profiles.
- ``devices``: what the machine has, and N devices for a lesson.
- ``timing``: repeated, warm, synchronised timings (mean, std, median).
- ``plotting``: the bar chart with error bars, saved as PNG.
- ``show``: display a helper's source in a notebook.
- ``checks``: compare a parallel model's training step with the single-device one.
- ``toy``: lesson 01's two-device toy model.
"""
