"""The course's library: what the lessons teach, apart from what runs them.

Imports go one way, lowest first (``tests/test_layering.py`` checks it):

- ``core``: files and paths, errors, flags (a dataclass as a described command line),
  devices (the one device/backend/dtype decision), timing, checks (``Proof``), plotting,
  ``show_source``.
- ``memory`` (what a device holds: measured and predicted), ``comm`` (collectives and the
  bytes they send), ``torchrun`` (the launcher, the ranks' side, several nodes on one
  machine, the in-notebook gloo group).
- ``models``: the toy model, the MLP stack, the small Llama (``LMConfig``, its shape
  declared once) and its attention.
- ``profiles`` and ``profile_sizes``: every size of the series (smoke, small, full).
- the techniques, one package per topic, each holding what a lesson teaches
  (its ``TAUGHT`` list, checked against the notebooks by ``tests/test_taught.py``):
  ``model_parallel`` (01-02), ``pipeline`` (03-04), ``placement`` (05),
  ``data_parallel`` (06), ``tensor_parallel`` (07-09), ``context_parallel`` (10),
  ``expert_parallel`` (11), ``debugging`` (12), ``composed`` (13).
- ``runs``: each lesson's run machinery (config, worker, results, report) on one
  contract (``runs.contract``); ``tp_demo``: the source script's command line.
- ``exercises``: one checker module per topic, the verdicts, the solutions.

What runs the course without being taught (the notebook runner, the bench, the GPU check,
the website, the glossary rules) lives beside this package, in ``course_tools``.
"""
