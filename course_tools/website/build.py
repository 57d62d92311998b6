"""``make site``: the course as a static website in results/site/, from the stored notebooks.

Nothing is executed: every lesson is shown as stored (and checked by nbval), after a check
that it was executed and holds no error. Jupyter Book 1.x (Sphinx) builds the pages with
every warning an error; MathJax, fonts and scripts are served from the site itself.
``python -m course_tools.website.build [--fresh]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from course_tools.website import SiteError
from course_tools.website.notebooks import check_all, lesson_notebooks
from course_tools.website.sources import assemble
from helpers.core.paths import NOTEBOOKS_DIR, REPO_ROOT, RESULTS_DIR, display_path

SITE_DIR = RESULTS_DIR / "site"
WORK_DIR = RESULTS_DIR / ".site-build"  # the book's sources and Sphinx's cache
CONFIG = REPO_ROOT / "docs" / "site" / "_config.yml"
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Sphinx colours its warnings


def jupyter_book_command() -> list[str]:
    """The ``jupyter-book`` of this Python (the .venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "jupyter-book"
    found = str(beside) if beside.is_file() else shutil.which("jupyter-book")
    if found is None:
        raise SiteError("jupyter-book is not installed; `make site` installs requirements-site.txt")
    return [found]


def run_jupyter_book(src: Path, work: Path) -> None:
    """Build HTML with warnings as errors; a failure lists Sphinx's warnings, then raises."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    command = [*jupyter_book_command(), "build", str(src), "--path-output", str(work),
               "--builder", "html", "-W", "--keep-going", "-q"]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO_ROOT)
    if result.returncode == 0:
        return
    # Sphinx keeps what it read even when a warning fails the build; a rerun would then
    # skip those pages and pass silently, so the cache goes and the next run reads all again
    shutil.rmtree(work / "_build", ignore_errors=True)
    output = ANSI.sub("", result.stdout + result.stderr).splitlines()
    warnings = [line for line in output if "WARNING" in line or "ERROR" in line]
    print("\n".join(warnings or output[-40:]), file=sys.stderr)
    raise SiteError(
        f"Jupyter Book failed (exit {result.returncode}, {len(warnings)} warning(s) above); "
        f"{display_path(SITE_DIR)} was left as it was"
    )


def verify(html: Path, repo: Path, docs: list[str]) -> None:
    """Every document has its page, and every lesson's downloadable copy is the stored file."""
    for doc in docs:
        if not (html / f"{doc}.html").is_file():
            raise SiteError(f"the build made no page {doc}.html (for {doc})")
        if doc.startswith("notebooks/"):
            copy, stored = html / "_sources" / f"{doc}.ipynb", repo / f"{doc}.ipynb"
            if not copy.is_file() or copy.read_bytes() != stored.read_bytes():
                raise SiteError(f"_sources/{doc}.ipynb on the site is not the stored {doc}.ipynb")


def build(out: Path = SITE_DIR, work: Path = WORK_DIR, repo: Path = REPO_ROOT) -> list[str]:
    """Check the lessons, assemble the book, build it, and replace ``out``; returns its documents."""
    notebooks = lesson_notebooks(repo / NOTEBOOKS_DIR.name)
    check_all(notebooks)
    src = work / "src"
    docs = assemble(src, repo, notebooks, CONFIG)
    html = work / "_build" / "html"
    shutil.rmtree(html, ignore_errors=True)  # no page of a removed document survives
    run_jupyter_book(src, work)
    verify(html, repo, docs)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(html, out)
    return docs


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fresh", action="store_true", help="drop Sphinx's cache, rebuild all")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.fresh and WORK_DIR.exists():
        shutil.rmtree(WORK_DIR)
    try:
        docs = build()
    except SiteError as error:
        print(f"make site: {error}", file=sys.stderr)
        return 1
    lessons = sum(d.startswith("notebooks/") for d in docs)
    print(
        f"Site: {display_path(SITE_DIR)}/ ({lessons} lessons, {len(docs)} pages, "
        f"{_size(SITE_DIR) / 2**20:.1f} MiB) in {time.perf_counter() - start:.1f} s; "
        f"open {display_path(SITE_DIR / 'index.html')}, check it with `make site-check`"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
