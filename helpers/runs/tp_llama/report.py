"""Lesson 09's tables and charts, read from the launches' typed results."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from helpers.core.checks import Proof, Verdict
from helpers.core.plotting import save_figure
from helpers.core.sizes import format_bytes
from helpers.runs.tp_ffn.wire import wire_line
from helpers.runs.tp_llama.results import LlamaTPResult, ModeRun, StepTimes

PROOFS_READ = ("each line: the largest difference over all ranks (weights: the tensor nearest "
               "its bound)")


def proof_lines(result: LlamaTPResult) -> str:
    """Each mode's proofs against one process (and PyTorch's split against the hand one);
    each line is read as :data:`PROOFS_READ` says."""
    lines = []
    for m in result.modes:
        lines.append(f"tp={result.world_size}, {m.name}, against one process:")
        lines += ["  " + p.line() for p in m.proofs]
        if m.native:
            lines.append("  parallelize_module + loss_parallel against the hand split:")
            lines += ["  " + p.line() for p in m.native]
    return "\n".join(lines)


def _columns(results: Sequence[LlamaTPResult]) -> list[tuple[str, ModeRun]]:
    return [(f"tp={r.world_size} {m.name}", m) for r in results for m in r.modes]


def kept_table(results: Sequence[LlamaTPResult]) -> str:
    """Bytes each rank keeps for backward, per part: measured, and whether the estimator's
    prediction is the same number."""
    one = results[0].one_process_kept
    cols = [("one process", one, one == results[0].predicted_one_process_kept),
            *[(name, m.kept, m.kept == m.predicted_kept) for name, m in _columns(results)]]
    return _parts_table(cols, "= predicted")


def native_kept_table(results: Sequence[LlamaTPResult]) -> str:
    """What PyTorch's split (``parallelize_module``) kept for backward per part, beside the
    hand split's, measured the same way, for each run that proved it: where the two keep
    the same bytes, "= hand" stands for PyTorch's number."""
    cols = [(name, m.kept, m.native_kept) for name, m in _columns(results) if m.native_kept]
    if not cols:
        return "PyTorch's split was not run"
    width = max(len(c[0]) for c in cols) + 7
    lines = [f"{'part':<12}" + "".join(f"{n + ' hand':>{width}}{'PyTorch':>14}" for n, _, _ in cols)]
    for part in [*cols[0][1], "total"]:
        row = f"{part:<12}"
        for _, hand, theirs in cols:
            mine, other = ((sum(hand.values()), sum(theirs.values())) if part == "total"
                           else (hand[part], theirs[part]))
            row += f"{format_bytes(mine):>{width}}{'= hand' if other == mine else format_bytes(other):>14}"
        lines.append(row)
    return "\n".join(lines)


def _parts_table(cols: list[tuple[str, dict[str, int], bool]], same: str) -> str:
    width = max(len(c[0]) for c in cols) + 2
    lines = [f"{'part':<12}" + "".join(f"{c[0]:>{width}}" for c in cols)]
    for part in cols[0][1]:
        lines.append(f"{part:<12}" + "".join(f"{format_bytes(c[1][part]):>{width}}" for c in cols))
    lines.append(f"{'total':<12}" + "".join(
        f"{format_bytes(sum(c[1].values())):>{width}}" for c in cols))
    lines.append(f"{same:<12}" + "".join(f"{'✓' if c[2] else 'NO':>{width}}" for c in cols))
    return "\n".join(lines)


def sent_table(results: Sequence[LlamaTPResult]) -> str:
    """The collectives one rank issued in a step, per collective: calls (against the plan),
    and their bytes by the ring formula (what NCCL's ring sends) and by gloo's algorithms
    (what this run's backend sends)."""
    lines = [f"{'run':<14}{'collective':<16}{'calls':>6}{'= plan':>8}{'ring formula':>15}"
             f"{'gloo':>13}"]
    for name, m in _columns(results):
        for k, collective in enumerate(sorted(m.calls)):
            same = (m.calls[collective] == len(m.planned.get(collective, []))
                    and m.ring[collective] == m.planned_ring.get(collective)
                    and m.gloo[collective] == m.planned_gloo.get(collective))
            lines.append(f"{name if k == 0 else '':<14}{collective:<16}{m.calls[collective]:>6}"
                         f"{'✓' if same else 'NO':>8}{format_bytes(m.ring[collective]):>15}"
                         f"{format_bytes(m.gloo[collective]):>13}")
    return "\n".join(lines)


def wire_table(results: Sequence[LlamaTPResult]) -> str:
    """Per run, the step's bytes per rank: ring formula, gloo's algorithms (payload and
    headers), and what each rank's sockets sent ("= payload + headers ✓" where every rank
    sent exactly that)."""
    lines = [f"{'run':<14}{'ring formula':>14}{'gloo payload':>14}{'+ headers':>11}"
             "  on the wire, each rank"]
    for name, m in _columns(results):
        w, shown = m.wire[0], wire_line(tuple(m.wire))
        if not shown.startswith(("=", "not measured")):
            ok = all(c.ok for c in m.wire)
            shown += ": within the prediction" if ok else ": NOT within the prediction"
        lines.append(f"{name:<14}{sum(m.ring.values()):>12,.0f} B{w.payload:>12,.0f} B"
                     f"{w.headers:>9,} B  {shown}")
    return "\n".join(lines)


def _times(result: LlamaTPResult) -> list[tuple[str, StepTimes]]:
    timing = result.timing or {}
    out = [(f"tp={result.world_size} {m.name}", timing[str(m.sequence_parallel)])
           for m in result.modes if str(m.sequence_parallel) in timing]
    if "one process" in timing:
        out.insert(0, ("one process", timing["one process"]))
    return out


def timing_rows(results: Sequence[LlamaTPResult]) -> list[tuple[str, StepTimes]]:
    """(run, its step times), the one-process run first."""
    return [row for r in results for row in _times(r)]


def timing_table(results: Sequence[LlamaTPResult]) -> str:
    """Mean +- std of a step, of its collectives and of the rest (computation), rank 0."""
    lines = [f"{'run':<14}{'step (ms)':>18}{'collectives (ms)':>20}{'compute (ms)':>18}"]
    for name, t in timing_rows(results):
        cells = [StepTimes.mean_std(v) for v in (t.step_s, t.comm_s, t.compute_s)]
        lines.append(f"{name:<14}" + "".join(
            f"{1e3 * m:>{w - 8}.1f} +- {1e3 * s:>4.1f}"
            for (m, s), w in zip(cells, (18, 20, 18), strict=True)))
    return "\n".join(lines)


def timing_chart(results: Sequence[LlamaTPResult], path: Path, title: str, xlabel: str = ""
                 ) -> Path:
    """Stacked bars per run: computation below, time in collectives above, mean +- std."""
    import matplotlib.pyplot as plt

    rows = timing_rows(results)
    names = [n for n, _ in rows]
    compute = [StepTimes.mean_std(t.compute_s) for _, t in rows]
    comm = [StepTimes.mean_std(t.comm_s) for _, t in rows]
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    xs = range(len(rows))
    ax.bar(xs, [1e3 * m for m, _ in compute], yerr=[1e3 * s for _, s in compute],
           color="#4c72b0", capsize=3, label="computation (step minus collectives)")
    ax.bar(xs, [1e3 * m for m, _ in comm], bottom=[1e3 * m for m, _ in compute],
           yerr=[1e3 * s for _, s in comm], color="#dd8452", capsize=3,
           label="inside collectives (incl. waiting for other ranks)")
    ax.set_xticks(list(xs), names, rotation=15)
    ax.set_ylabel("time per training step on rank 0 (ms)")
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.27), ncol=2, frameon=False)
    return save_figure(fig, path)


def kept_chart(results: Sequence[LlamaTPResult], path: Path, title: str) -> Path:
    """Bytes a rank keeps for backward, per run: the blocks, and the rest."""
    import matplotlib.pyplot as plt

    one = results[0].one_process_kept
    runs = [("one process", one), *[(n, m.kept) for n, m in _columns(results)]]
    blocks = [sum(v for k, v in kept.items() if k.startswith("block")) for _, kept in runs]
    rest = [sum(kept.values()) - b for (_, kept), b in zip(runs, blocks, strict=True)]
    fig, ax = plt.subplots(figsize=(7.5, 3.5))
    xs = range(len(runs))
    ax.bar(xs, [b / 2**20 for b in blocks], color="#4c72b0", label="blocks")
    ax.bar(xs, [r / 2**20 for r in rest], bottom=[b / 2**20 for b in blocks], color="#937860",
           label="embedding, final norm, head and loss")
    ax.set_xticks(list(xs), [n for n, _ in runs], rotation=15)
    ax.set_ylabel("kept for backward per rank (MiB)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def step_verdict(results: Sequence[LlamaTPResult]) -> Verdict:
    """Every launch's modes against one process: one claim, the rigor in ``table()``."""
    sizes = " and ".join(str(r.world_size) for r in results)
    claim = f"tp={sizes}: TP and TP + SP steps = one process's"
    return Verdict(claim, [p for r in results for p in r.verdict().proofs])


def native_verdict(results: Sequence[LlamaTPResult]) -> Verdict:
    """PyTorch's split against the hand split, in every launch that ran it."""
    found = [v for r in results if (v := r.native_verdict()) is not None]
    if not found:
        raise ValueError("no launch ran parallelize_module; valid: a launch with native=True")
    return Verdict(found[0].claim, [p for v in found for p in v.proofs])


def _exact(what: str, got: float, want: float) -> Proof:
    return Proof(what, abs(float(got) - float(want)), 0.0)


def kept_verdict(results: Sequence[LlamaTPResult]) -> Verdict:
    """Bytes kept for backward, per part and run, against the estimator (exact)."""
    one = results[0]
    proofs = [_exact(f"one process {part}", one.one_process_kept[part], want)
              for part, want in one.predicted_one_process_kept.items()]
    proofs += [_exact(f"{name} {part}", m.kept[part], want)
               for name, m in _columns(results) for part, want in m.predicted_kept.items()]
    return Verdict("bytes kept for backward = the estimator's, per part", proofs)


def native_kept_verdict(results: Sequence[LlamaTPResult]) -> Verdict:
    """PyTorch's blocks keep what the hand split's blocks keep (exact), where it ran."""
    proofs = [_exact(f"{name} {part}", m.native_kept[part], m.kept[part])
              for name, m in _columns(results) if m.native_kept
              for part in m.kept if part.startswith("block")]
    return Verdict("PyTorch's blocks keep what the hand split's keep", proofs)


def plan_verdict(results: Sequence[LlamaTPResult]) -> Verdict:
    """Per run and collective: the calls issued, and their bytes by either formula, are the
    plan's (exact)."""
    proofs = []
    for name, m in _columns(results):
        for c in sorted({*m.calls, *m.planned}):
            proofs += [_exact(f"{name} {c} calls", m.calls.get(c, 0), len(m.planned.get(c, []))),
                       _exact(f"{name} {c} ring", m.ring.get(c, 0), m.planned_ring.get(c, 0)),
                       _exact(f"{name} {c} gloo", m.gloo.get(c, 0), m.planned_gloo.get(c, 0))]
    return Verdict("every collective's calls and bytes = the plan's", proofs)


def wire_summary(results: Sequence[LlamaTPResult]) -> str:
    """One line: what every rank's sockets sent against gloo's payload and headers."""
    checks = [w for _, m in _columns(results) for w in m.wire]
    runs = len(_columns(results))
    if any(w.sent is None for w in checks):
        return f"on the wire: not measured ({checks[0].reason})"
    if all(w.sent == w.payload + w.headers for w in checks):
        return (f"✓ on the wire, every rank of all {runs} runs sent exactly gloo's payload + "
                "its headers")
    mark = "✓" if all(w.ok for w in checks) else "✗"
    return f"{mark} on the wire, every rank of all {runs} runs within gloo's payload + headers"


def placement_groups(placements: dict[str, str]) -> dict[str, list[str]]:
    """Each placement (``S(0)``, ``S(1)``, ``R``), the weights that have it, named without
    their block and ``.weight``, each once."""
    groups: dict[str, list[str]] = {}
    for name, placement in placements.items():
        short = name.removesuffix(".weight").split(".")[-1]
        if short not in groups.setdefault(placement, []):
            groups[placement].append(short)
    return groups
