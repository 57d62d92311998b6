"""Code shared by the lessons: one module per concept.

Foundation
- ``paths``, ``files``: where results go; atomic writes and checksums.
- ``profiles``: the ``small`` and ``full`` size profiles.
- ``devices``: what the machine has, and N devices for a lesson.
- ``timing``: warm, repeated, synchronised timings (mean, std, median).
- ``plotting``: bar charts (plain, grouped, stacked), always saved as PNG.
- ``show``: display a helper's source or a saved figure in a notebook.
- ``checks``: compare a parallel model's training step with the single-device one.
- ``launch``, ``distributed``: run ``torchrun`` safely; the ranks' side of it.
- ``optional``: import optional components with a clear error.
- ``run_notebooks``, ``bench``: ``make run`` / ``make refresh`` and ``make bench``.

Lessons
- 01 ``toy``, ``transfer``: the toy model on two devices; the cost of moving activations.
- 02 ``staging``, ``resnet``: a K-stage split of any layer list; ResNet50 and its loop.
- 03 ``pipeline``, ``pipeline_worker``, ``pipeline_bench``, ``pipeline_plots``.
- 04 ``device_map``, ``offload``, ``tiny_lm``: placement under memory budgets.
- 05 ``tp_ffn``, ``tp_comm``, ``tp_shards``, ``tp_demo``: the tensor-parallel FFN.
- 06 ``tp_runs``, ``tp_dtensor``, ``tp_2d``: torchrun launches, PyTorch's own tensor
  parallelism, and a (dp x tp) mesh.
"""
