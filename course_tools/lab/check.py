"""``make lab-check``: the lessons in JupyterLab, in headless Chromium, as a learner meets them.

On a copy of the lessons and the glossary, served by JupyterLab as ``make lab`` serves
them, it checks that

- every lesson opens unmodified (no ● on its tab once its kernel is up);
- every link of every lesson to ``glossary.md#term`` names an anchor the glossary has in
  JupyterLab, and clicking one opens the glossary as rendered Markdown with the term in
  view;
- the first lesson runs clean with Run All (no error, no warning);
- a wrong answer to its first exercise gets "not right yet" and a hint.

With ``--self-test`` it first runs the same checks on a copy with planted flaws (a lesson
stored without its kernelspec, a link to a term that does not exist, a cell that raises)
and fails unless each is reported: proof that the check can fail. Screenshots go to
``results/lab/``. ``python -m course_tools.lab.check [--self-test] [--lessons 01 06]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from course_tools.glossary import glossary_links
from course_tools.lab import LabError
from course_tools.lab.probes import (
    Finding,
    follows_glossary_link,
    gives_a_hint,
    open_lab,
    opens_unmodified,
    runs_clean,
)
from course_tools.lab.server import jupyter_lab
from course_tools.run_notebooks import is_lesson
from course_tools.website import SiteError
from course_tools.website.browser import chromium
from helpers.core.paths import REPO_ROOT, RESULTS_DIR, display_path

FIRST = "01_toy_model_parallel.ipynb"  # run with Run All: the shortest lesson
EXERCISE = ("01.3", "def busy_share(forward",
            "def busy_share(forward, backward):\n    return [1 / len(forward)] * len(forward)")
PLANTED_FRAGMENT = "no-such-term"
COPIED = ("notebooks", "docs", "solutions", "README.md")


def copy_course(target: Path) -> Path:
    """What a learner's lab shows: the lessons, the docs, the solutions, the README."""
    for name in COPIED:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns(".ipynb_*"))
        elif source.is_file():
            shutil.copyfile(source, target / name)
    return target


def lesson_names(root: Path, only: list[str] | None = None) -> list[str]:
    """The lessons in ``root/notebooks``, optionally those whose names start with ``only``."""
    names = sorted(p.name for p in (root / "notebooks").glob("[0-9][0-9]_*.ipynb")
                   if is_lesson(p))
    return [n for n in names if not only or any(n.startswith(o) for o in only)]


def fragments(notebook: Path) -> list[str]:
    """The ``#term`` of every glossary link in a lesson, in order."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return [anchor for anchor in glossary_links(text) if anchor]


def check_lab(root: Path, lessons: list[str], screens: Path | None) -> list[Finding]:
    """Every probe on the course copied under ``root``; what is wrong, or nothing."""
    findings: list[Finding] = []
    with jupyter_lab(root) as lab, chromium() as browser:
        page = open_lab(browser, lab)
        for name in lessons:
            findings += opens_unmodified(page, name, screens)
        first_links = fragments(root / "notebooks" / FIRST)
        found, ids = follows_glossary_link(page, FIRST, first_links[0], screens)
        findings += found
        for name in lessons:
            for fragment in sorted(set(fragments(root / "notebooks" / name))):
                if ids and fragment not in ids:
                    findings.append(Finding(name, f"links to glossary.md#{fragment}, which "
                                                  "the glossary does not have in JupyterLab"))
        findings += runs_clean(page, FIRST, screens)
        exercise, stub, wrong = EXERCISE
        findings += gives_a_hint(page, FIRST, stub, wrong, exercise, screens)
    return findings


def plant_flaws(root: Path) -> list[str]:
    """Break the copy's first lesson three ways; return what the check must report."""
    path = root / "notebooks" / FIRST
    notebook = json.loads(path.read_text(encoding="utf-8"))
    notebook["metadata"].pop("kernelspec", None)
    first = notebook["cells"][0]
    source = "".join(first["source"])
    link = fragments(path)[0]
    first["source"] = source.replace(f"glossary.md#{link}", f"glossary.md#{PLANTED_FRAGMENT}", 1)
    notebook["cells"].append({"cell_type": "code", "execution_count": None, "id": "planted",
                              "metadata": {}, "outputs": [],
                              "source": "raise RuntimeError('planted flaw')"})
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False), encoding="utf-8")
    return ["marked modified as soon as it was opened",
            f"no anchor #{PLANTED_FRAGMENT}",
            "a cell ended in an error: RuntimeError: planted flaw"]


def self_test() -> list[str]:
    """The check on planted flaws: the expected findings it missed (empty: it can fail)."""
    with tempfile.TemporaryDirectory(prefix="lab-flawed-") as tmp:
        root = copy_course(Path(tmp))
        expected = plant_flaws(root)
        found = [str(f) for f in check_lab(root, [FIRST], None)]
    print("  planted flaws reported:")
    for line in found:
        print(f"    {line}")
    return [e for e in expected if not any(e in line for line in found)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--self-test", action="store_true",
                        help="first prove on planted flaws that the check fails")
    parser.add_argument("--lessons", nargs="*", metavar="PREFIX",
                        help="only the lessons whose names start with these (default: all)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        if args.self_test:
            print("self-test: the lab check on a copy with planted flaws")
            missed = self_test()
            if missed:
                print("FAILED: the check missed " + "; ".join(missed))
                return 1
            print("  every planted flaw was reported")
        screens = RESULTS_DIR / "lab"
        screens.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="lab-course-") as tmp:
            root = copy_course(Path(tmp))
            lessons = lesson_names(root, args.lessons)
            if not lessons:
                parser.error(f"no lesson starts with {args.lessons}")
            findings = check_lab(root, lessons, screens)
    except (LabError, SiteError) as error:
        print(f"lab check could not run: {error}", file=sys.stderr)
        return 2
    for finding in findings:
        print(f"  {finding}")
    verdict = "FAILED" if findings else "OK"
    print(f"{verdict}: {len(lessons)} lesson(s) opened, glossary links followed, {FIRST} run "
          f"and its exercise {EXERCISE[0]} answered wrong, in {time.perf_counter() - start:.0f} s;"
          f" screenshots in {display_path(screens)}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
