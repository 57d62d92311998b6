"""What runs each lesson, kept apart from what it teaches: one folder per lesson.

``contract`` is the one contract with every ``torchrun`` worker: a typed config in
(``RunConfig``), one ``launch``, a typed result out (``Record``), and ``serve``, the one
way a worker starts, reports and exits. Each lesson's folder is laid out the same way:
``config`` (what a launch runs, one described flag per field), ``worker`` (the entry
point on every rank), ``results`` (the typed result, every verdict and its tolerance)
and ``report`` (tables and charts; ``tp_ffn``'s are in ``results`` and ``timings``),
plus the lesson's own instruments.

- ``pipeline`` (lesson 03), ``schedules`` (04), ``placement`` (05, reports only),
  ``data_parallel`` (06), ``tp_ffn`` (07-08), ``tp_llama`` (09), ``llama_3d`` (10).
"""
