"""``make site-check``: every page of the built site, opened in headless Chromium.

Per page: no console error, no failed request, no request leaving the site folder, every
image decoded, all math typeset (no raw ``$$`` or ``\\(`` left), every internal link
resolving (file and ``#anchor``), nothing loaded from outside (HTML and CSS read too), and
every fold opening on a click: the ``<details>`` boxes and the toggles of hidden cell outputs.
A lesson page must show at least the folds, hidden outputs and diagrams its notebook stores. A
full-page screenshot of every lesson goes to ``screens/`` inside the site. One line per
page, then the problems, each naming page and element; exit 1 if there is any.
``python -m course_tools.website.check [--site DIR] [--self-test]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from course_tools.teaching import measure
from course_tools.website import SiteError
from course_tools.website.browser import PageReport, chromium, search_hits, serve, visit
from course_tools.website.links import Problem, check_css, check_links, check_loads
from course_tools.website.selftest import run_self_test
from helpers.core.paths import NOTEBOOKS_DIR, RESULTS_DIR, display_path

SKIP = ("_static/", "_sources/", "_images/", "screens/")  # assets, not pages
SEARCH_QUERY = "parallel"
LEFT = "leaves the site folder"


def site_pages(site: Path) -> list[str]:
    """Every HTML page of the site, relative to it, landing page first."""
    if not (site / "index.html").is_file():
        raise SiteError(f"{display_path(site)} has no index.html; build it first with `make site`")
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    pages = [p for p in pages if not p.startswith(SKIP)]
    return sorted(pages, key=lambda p: (p != "index.html", p))


def is_lesson(page: str) -> bool:
    """A lesson page (one per notebook): it gets a screenshot."""
    return page.startswith("notebooks/")


def browser_problems(report: PageReport) -> list[Problem]:
    """The browser's findings on one page as problems naming page and element."""
    page = report.page
    return (
        [Problem(page, f"request {url}", LEFT) for url in report.outside]
        + [Problem(page, f"request {what}", "failed") for what in report.failed]
        + [Problem(page, "console", text) for text in report.console]
        + [Problem(page, element, "image not decoded (naturalWidth 0)") for element in report.broken_images]
        + [Problem(page, "math", text) for text in report.math_errors]
        + [Problem(page, text.split(":")[0] + ">", "fold: " + text.split(">", 1)[-1].strip()) for text in report.shut_folds]
    )  # fmt: skip


def lesson_problems(report: PageReport, notebooks: Path) -> list[Problem]:
    """A lesson page against its stored notebook: its folds, hidden outputs and diagrams shown."""
    source = notebooks / Path(report.page).with_suffix(".ipynb").name
    if not is_lesson(report.page) or not source.is_file():
        return []
    cells = json.loads(source.read_text(encoding="utf-8"))["cells"]
    boxes = sum("".join(c["source"]).lower().count("<details") for c in cells
                if c["cell_type"] == "markdown")
    hidden = sum("hide-output" in c.get("metadata", {}).get("tags", []) for c in cells)
    diagrams = measure(source).diagrams
    found = []
    if report.toggles < hidden:
        found.append(Problem(report.page, "hidden outputs", f"{report.toggles} toggles on the page, {hidden} hide-output cells in {source.name}"))  # fmt: skip
    if report.folds - report.toggles < boxes:
        found.append(Problem(report.page, "<details> boxes", f"{report.folds - report.toggles} on the page, {boxes} in {source.name}"))  # fmt: skip
    if report.images - len(report.broken_images) < diagrams:
        found.append(Problem(report.page, "diagrams", f"{report.images - len(report.broken_images)} images shown, {diagrams} diagrams in {source.name}"))  # fmt: skip
    return found


def summary_line(report: PageReport, links: int, problems: int, screen: str) -> str:
    """One line per page, as printed by ``make site-check``."""
    verdict = "ok  " if problems == 0 else "FAIL"
    shot = f", screenshot {screen}" if screen else ""
    return (
        f"{verdict} {report.page}: {report.requests} requests ({len(report.outside)} outside, "
        f"{len(report.failed)} failed), {len(report.console)} console errors, images "
        f"{report.images - len(report.broken_images)}/{report.images} decoded, {report.math} "
        f"math typeset, {report.folds - len(report.shut_folds)}/{report.folds} folds open "
        f"({report.toggles} hidden outputs), {links} internal links checked, {problems} problems, "
        f"{report.seconds:.1f} s{shot}"
    )


def check_site(site: Path, screens: Path | None = None, query: str = SEARCH_QUERY,
               notebooks: Path = NOTEBOOKS_DIR) -> list[Problem]:
    """Check every page of ``site``; print one line per page; return all problems found."""
    pages = site_pages(site)
    problems = check_css(site)
    with serve(site) as base, chromium() as browser:
        for page in pages:
            shot = screens / f"{Path(page).stem}.png" if screens and (is_lesson(page) or page == "index.html") else None  # fmt: skip
            report = visit(browser, base, page, shot)
            links, found = check_links(site, page)
            found = found + check_loads(site, page) + browser_problems(report)
            found += lesson_problems(report, notebooks)
            screen = display_path(shot) if shot else ""
            print(summary_line(report, links, len(found), screen), flush=True)
            problems += found
        if (site / "search.html").is_file():
            hits, errors = search_hits(browser, base, query)
            print(f"{'ok  ' if hits and not errors else 'FAIL'} search.html?q={query}: {hits} results, {len(errors)} console errors", flush=True)  # fmt: skip
            element = f"search for {query!r}"
            problems += [Problem("search.html", element, f"console: {text}") for text in errors]
            if not hits:
                problems.append(Problem("search.html", element, "found nothing"))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--site", type=Path, default=RESULTS_DIR / "site", help="the built site")
    parser.add_argument(
        "--self-test", action="store_true", help="first prove on a broken site that the check fails"
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        if args.self_test:
            run_self_test(check_site)
        problems = check_site(args.site, screens=args.site / "screens")
    except SiteError as error:
        print(f"make site-check: {error}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    pages = len(site_pages(args.site))
    outside = sum(p.detail == LEFT for p in problems)
    print(
        f"site-check {'FAILED' if problems else 'passed'}: {pages} pages of "
        f"{display_path(args.site)}, {len(problems)} problems, {outside or 'no'} request{'s' if outside > 1 else ''} "
        f"left the site folder ({time.perf_counter() - start:.0f} s)"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
