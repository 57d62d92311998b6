"""The learner's path in JupyterLab, checked in a real browser (``make lab-check``).

``server`` starts JupyterLab as ``make lab`` does (the repository as the server's root,
the course's settings), on a copy of the lessons; ``probes`` drive headless Chromium
through what a learner does; ``check`` runs them and first proves, on planted flaws, that
they can fail.
"""


class LabError(Exception):
    """The lab could not be started or driven (not a finding about the lessons)."""
