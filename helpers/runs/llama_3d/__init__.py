"""Lesson 13's run machinery: ``config`` (one layout's launch, every layout's), the torchrun
entry points ``worker`` (one layout) and ``suite`` (every layout and the checkpoint round
trip, in one launch), ``instrumented`` (the taught loop with the lesson's instruments
attached from outside), ``measure`` (what a rank holds), ``digest`` (the weights'
fingerprint), ``reference`` (the one-process run), ``results`` (typed results and every
verdict), ``report`` (tables and charts), ``processes`` (what outlives a launch)."""
