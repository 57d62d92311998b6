"""``make gpu-check``: every lesson's proof and measurement on a CUDA machine, in one run.

``cli`` reads the options, ``runner`` runs the steps within the budget, ``report`` writes
results/gpu_check.json and .md, ``context`` holds the shared types and sizes, and the
``steps_*`` modules hold one function per step, grouped by lesson.
"""
