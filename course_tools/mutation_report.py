"""What ``make mutants`` found: every mutant the tests did not catch, and the score.

mutmut (pinned in the Makefile) keeps one ``mutants/<module>.py.meta`` per mutated module,
JSON with the exit code of each mutant's test run. This lists each mutant that was not
caught, with the lines it changes, then a table per module: the score is the share of
all mutants caught (killed, or timed out), so mutants no test reaches count against it.
Run from the repository root after ``mutmut run``: ``python -m course_tools.mutation_report``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

CAUGHT = ("killed", "timeout", "caught by type check")
COLUMNS = ("killed", "timeout", "survived", "no tests")


def statuses(meta: Path) -> dict[str, str]:
    """Mutant name -> mutmut's word for its result, read from one ``.meta`` file."""
    from mutmut.stats import status_by_exit_code

    codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
    return {name: status_by_exit_code[code] for name, code in codes.items()}


def changed_lines(name: str, source: str) -> str:
    """The lines mutant ``name`` of file ``source`` removes (-) and adds (+), on one line."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(name, path=source).splitlines()
    return " | ".join(x.strip() for x in diff if x[:1] in "+-" and x[:3] not in ("+++", "---"))


def score(counts: Counter) -> float:
    """Caught mutants as a percentage of all of them."""
    total = sum(counts.values())
    return 100.0 * sum(counts[c] for c in CAUGHT) / total if total else 0.0


def main(root: Path = Path("mutants"), part: str | None = None) -> int:
    """Print the mutants not caught, then the table; 1 when there are no results. ``part``:
    only the modules of ``helpers/<part>/`` (``make mutants PART=<part>``)."""
    metas = sorted(root.rglob("*.py.meta"))
    folder = ""
    if part:
        folder = f"helpers/{part.replace('.', '/')}/"
        metas = [m for m in metas if m.relative_to(root).as_posix().startswith(folder)]
    if not metas:
        where = f"{folder} under {root}/" if part else f"{root}/"
        print(f"no mutmut results for {where}; run `make mutants` first")
        return 1
    rows: list[tuple[str, Counter]] = []
    print("Mutants not caught (status, name: - original | + mutant):")
    for meta in metas:
        source = meta.relative_to(root).as_posix().removesuffix(".meta")
        found = statuses(meta)
        rows.append((source, Counter(found.values())))
        for name, status in found.items():
            if status not in CAUGHT:
                print(f"  {status:<9} {name.rsplit('.', 1)[-1]}: {changed_lines(name, source)}")
    overall = sum((counts for _, counts in rows), Counter())
    width = max(len(source) for source, _ in rows)
    head = "".join(f"{c:>10}" for c in (*COLUMNS, "other", "total"))
    print(f"\n{'module':<{width}}{head}{'score':>8}")
    for source, counts in [*rows, ("all modules", overall)]:
        other = sum(counts.values()) - sum(counts[c] for c in COLUMNS)
        cells = "".join(f"{n:>10}" for n in (*(counts[c] for c in COLUMNS), other))
        print(f"{source:<{width}}{cells}{sum(counts.values()):>10}{score(counts):>7.1f}%")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(part=sys.argv[1] if len(sys.argv) > 1 else None))
