"""Lesson 04's run machinery: ``config`` in, ``worker`` (every schedule in one launch),
``results`` (proofs, idle shares, peaks) out, ``report`` (the timelines)."""
