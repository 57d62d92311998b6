"""The expert-parallel lesson's run: one mixture-of-experts layer, its experts split over
the ranks, proven equal to one process and its all-to-all bytes counted."""
