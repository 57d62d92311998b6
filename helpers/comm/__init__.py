"""Collectives: what each computes, what a rank sends, and the instruments that count it.

Taught: ``collectives`` (all-reduce, reduce-scatter, all-gather and broadcast checked
against their definition, the bytes a rank sends in a ring and on gloo, the alpha-beta
fit; lesson 06), ``meter`` (``CommMeter``: calls, bytes and seconds per process group and
per collective, counted at the dispatcher in lessons 06 and 09, timed at each library's
door in lessons 09 and 11), ``wire`` (``WireMeter``: the bytes that left the process's
sockets, read from the kernel; lessons 04, 06, 08, 09 and 11), ``headers`` (gloo's
message headers, counted from its algorithms: what the wire carries beyond the payload) and
``diagrams`` (the ring all-reduce drawn step by step from a ring run on real tensors).
"""

TAUGHT = ("collectives", "diagrams", "headers", "meter", "wire")
