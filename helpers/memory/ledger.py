"""A memory ledger: what each device holds to train a model, in bytes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from helpers.core.sizes import format_bytes

KINDS = ("weights", "grads", "optimizer_state", "activations")


@dataclass
class DeviceMemory:
    """Bytes one device (or one part of a model) holds during a training step.

    ``weights`` counts parameters and buffers (BatchNorm statistics); ``activations`` is
    the peak of the tensors autograd keeps for the backward pass; ``peak_allocated`` is
    the CUDA allocator's peak over the step (``None`` off CUDA).
    """

    weights: int = 0
    grads: int = 0
    optimizer_state: int = 0
    activations: int = 0
    peak_allocated: int | None = None

    @property
    def total(self) -> int:
        """weights + grads + optimizer state + activations."""
        return sum(getattr(self, k) for k in KINDS)


@dataclass
class Ledger:
    """One :class:`DeviceMemory` per device (or part), in the order the model uses them."""

    rows: dict[str, DeviceMemory] = field(default_factory=dict)
    note: str = ""

    def __getitem__(self, name: str) -> DeviceMemory:
        if name not in self.rows:
            raise KeyError(f"no row {name!r} in this ledger; valid: {list(self.rows)}")
        return self.rows[name]

    def sum(self) -> DeviceMemory:
        """All rows added up (``peak_allocated`` left out)."""
        return DeviceMemory(**{k: sum(getattr(r, k) for r in self.rows.values()) for k in KINDS})

    def matches(self, other: Ledger) -> bool:
        """Same rows, and every kind equal byte for byte (the CUDA peak left out)."""
        return list(self.rows) == list(other.rows) and all(
            getattr(self[n], k) == getattr(other[n], k) for n in self.rows for k in KINDS
        )

    def as_dict(self) -> dict[str, dict]:
        """Plain numbers per row, for JSON."""
        return {name: {**asdict(row), "total": row.total} for name, row in self.rows.items()}

    @classmethod
    def from_dict(cls, data: dict[str, dict], note: str = "") -> Ledger:
        """The inverse of :meth:`as_dict` (a ``total`` entry is recomputed, not read)."""
        rows = {n: DeviceMemory(**{k: r.get(k) or 0 for k in KINDS},
                                peak_allocated=r.get("peak_allocated")) for n, r in data.items()}
        return cls(rows, note)

    def table(self, title: str = "") -> str:
        """An aligned table: one line per row, one column per kind, and the total."""
        peaks = any(r.peak_allocated is not None for r in self.rows.values())
        heads = ["weights", "grads", "optimizer", "activations", "total"]
        heads += ["CUDA peak"] if peaks else []
        width = max([len(n) for n in self.rows] + [6])
        lines = [title] if title else []
        lines.append(f"{'':<{width}}" + "".join(f"{h:>13}" for h in heads))
        for name, r in self.rows.items():
            cells = [r.weights, r.grads, r.optimizer_state, r.activations, r.total]
            text = [format_bytes(c) for c in cells]
            if peaks:
                text.append(format_bytes(r.peak_allocated) if r.peak_allocated else "-")
            lines.append(f"{name:<{width}}" + "".join(f"{t:>13}" for t in text))
        return "\n".join(lines)

    def print(self, title: str = "") -> None:
        """Print :meth:`table`."""
        print(self.table(title))


def compare_ledgers(measured: Ledger, estimated: Ledger) -> list[dict]:
    """Row by row and kind by kind: measured, estimated and their ratio (estimate/measured)."""
    if list(measured.rows) != list(estimated.rows):
        raise ValueError(
            f"the ledgers have different rows: {list(measured.rows)} vs {list(estimated.rows)}; "
            "estimate with the same parts as measured"
        )
    out = []
    for name in measured.rows:
        for kind in KINDS:
            m, e = getattr(measured[name], kind), getattr(estimated[name], kind)
            out.append({"row": name, "kind": kind, "measured": m, "estimated": e,
                        "ratio": e / m if m else (1.0 if e == 0 else float("inf"))})
    return out


def comparison_table(measured: Ledger, estimated: Ledger) -> str:
    """:func:`compare_ledgers` as aligned text."""
    rows = compare_ledgers(measured, estimated)
    width = max(len(r["row"]) for r in rows)
    lines = [f"{'':<{width}} {'':<16}{'measured':>12}{'estimated':>12}{'est/meas':>10}"]
    for r in rows:
        lines.append(f"{r['row']:<{width}} {r['kind']:<16}{format_bytes(r['measured']):>12}"
                     f"{format_bytes(r['estimated']):>12}{r['ratio']:>10.3f}")
    return "\n".join(lines)


def agreement_table(measured: Ledger, predicted: Ledger, title: str = "") -> str:
    """The measured ledger, each cell marked ✓ where the prediction is the same number of
    bytes and ✗ where it is not; the predictions that differ are listed below the table."""
    rows = compare_ledgers(measured, predicted)
    width = max([len(n) for n in measured.rows] + [6])
    heads = ["weights", "grads", "optimizer", "activations", "total"]
    lines = [title] if title else []
    lines.append(f"{'':<{width}}" + "".join(f"{h:>15}" for h in heads))
    wrong = []
    for name in measured.rows:
        cells = [(r["kind"], r["measured"], r["estimated"]) for r in rows if r["row"] == name]
        cells.append(("total", measured[name].total, predicted[name].total))
        marks = [f"{format_bytes(m)} {'✓' if m == e else '✗'}" for _, m, e in cells]
        lines.append(f"{name:<{width}}" + "".join(f"{t:>15}" for t in marks))
        wrong += [f"  {name} {kind}: predicted {format_bytes(e)}"
                  for kind, m, e in cells if m != e]
    return "\n".join(lines + wrong)
