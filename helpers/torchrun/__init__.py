"""Launching ranks from a notebook, and the ranks' side of the launch.

Taught in lesson 08: ``launcher`` (``torchrun`` as a subprocess: a free port, logs, the
first failing rank's message, no process left behind) and ``multinode`` (several nodes'
agents on one machine). Running every launch: ``ranks`` (joining the process group,
handing rank 0's result back) and ``lifeline`` (a launched job ends when the process that
launched it dies, however it dies). For the exercises' checkers: ``in_notebook`` (ranks of a
real gloo group as threads of this process).
"""
