"""Collectives: what each computes, what a rank sends, and the instrument that counts them.

Taught: ``collectives`` (all-reduce, reduce-scatter, all-gather and broadcast checked
against their definition, the bytes a rank sends in a ring, the alpha-beta fit; lesson 06)
and ``meter`` (``CommMeter``: calls, bytes and seconds per process group and per
collective, counted at the dispatcher in lessons 06 and 09, timed at each library's door
in lessons 09 and 10, with the bytes each call sends by the ring formula and by gloo's
algorithms, and what the sockets sent, read by ``wire``).
"""

TAUGHT = ("collectives", "meter")
