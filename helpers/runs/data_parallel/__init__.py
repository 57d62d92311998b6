"""Lesson 06's run machinery: ``config`` in, ``worker`` on the ranks, ``results`` (with
its ``measured`` pieces) back, ``report`` (the figures)."""
