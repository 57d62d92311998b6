"""What runs the course but is not taught: one module or package per command.

- ``run_notebooks``: ``make run`` / ``make refresh`` (execute the lessons).
- ``bench``: ``make bench`` (the lessons' measurements at larger sizes, results/bench.json).
- ``gpu_check``: ``make gpu-check`` (every lesson's proof and measurement on a CUDA machine).
- ``website``: ``make site`` / ``make site-check`` (the course as a checked static website).
- ``glossary``: the rules that keep docs/glossary.md and the lessons in step (tests).
- ``mutation_report``: ``make mutants``' summary.

The lessons import nothing from here; everything here may import ``helpers``.
"""
