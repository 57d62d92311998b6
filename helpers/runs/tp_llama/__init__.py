"""Lesson 09's runs: ``config`` in, ``worker`` on every rank (``step``: what it is proven
against), ``results`` out, ``report`` (tables, charts)."""
