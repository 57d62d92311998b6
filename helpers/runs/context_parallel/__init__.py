"""The context-parallel lesson's run: one attention layer split over the sequence, proven."""
