"""Every pytest run (``make test``, ``pytest tests/``, ``pytest notebooks/``) compares
against outputs stored in the small profile on the CPU, so it forces both, whatever the
caller's environment says. Set here, before any notebook kernel starts, they reach the
kernels too."""

import os

os.environ["TUTORIAL_PROFILE"] = "small"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["TUTORIAL_PROGRESS"] = "final"  # no progress bars, as in the stored runs

# a learner's own copies of the lessons (README: "Working in JupyterLab") are not compared
collect_ignore_glob = ["notebooks/*.mine.ipynb"]
