"""What a learner does in JupyterLab, done by headless Chromium: each probe returns what it
found wrong (an empty list when all is well) and saves a screenshot.

The window is the size the lessons are read at (1400 x 1000, the file browser open, as
JupyterLab starts). Selectors are JupyterLab 4's: a tab marked modified carries
``jp-mod-dirty``; the kernel's state is written in the status bar; a running cell's prompt
reads ``[*]``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_tools.lab.server import LANDING, Lab

WINDOW = {"width": 1400, "height": 1000}
_ERROR = re.compile(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b")  # "RuntimeError: ..."
SETTLE_S = 2.0  # after the kernel is idle: JupyterLab updates the model's metadata then


@dataclass(frozen=True)
class Finding:
    """One thing wrong, and where."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def open_lab(browser: Any, lab: Lab) -> Any:
    """A page with JupyterLab loaded where ``make lab`` lands (the lessons' folder)."""
    page = browser.new_page(viewport=WINDOW)
    page.goto(lab.url(LANDING), timeout=120_000)
    page.wait_for_selector(".jp-DirListing-item", timeout=120_000)
    return page


def _tab(page: Any, label: str) -> Any:
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=label).first


def _wait_idle(page: Any, timeout_s: float = 120.0) -> None:
    page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=timeout_s * 1000)


def open_lesson(page: Any, name: str) -> None:
    """Open ``notebooks/<name>`` from the file browser and wait for its kernel to be idle."""
    page.locator(".jp-DirListing-item", has_text=name).first.dblclick()
    _tab(page, name).wait_for(timeout=60_000)
    page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell", timeout=60_000)
    _wait_idle(page)
    time.sleep(SETTLE_S)


def close_current(page: Any) -> None:
    """Close the current tab, discarding changes if JupyterLab asks."""
    page.keyboard.press("Alt+w")
    discard = page.get_by_role("button", name="Discard")
    try:
        discard.click(timeout=2_000)
    except Exception:  # noqa: BLE001 (Playwright's TimeoutError: nothing asked)
        pass


def opens_unmodified(page: Any, name: str, screens: Path | None) -> list[Finding]:
    """Open a lesson and let its kernel start: its tab must not be marked modified."""
    open_lesson(page, name)
    classes = _tab(page, name).get_attribute("class") or ""
    if screens:
        page.screenshot(path=str(screens / f"open-{Path(name).stem}.png"))
    close_current(page)
    if "jp-mod-dirty" in classes:
        return [Finding(name, "marked modified as soon as it was opened (its stored metadata "
                              "differs from what JupyterLab writes: kernelspec, language_info)")]
    return []


def glossary_ids(page: Any) -> set[str]:
    """The anchors the glossary has as JupyterLab renders it (``data-jupyter-id``)."""
    page.wait_for_selector(".jp-MarkdownViewer .jp-RenderedMarkdown h2", timeout=60_000)
    return set(page.eval_on_selector_all(
        ".jp-MarkdownViewer [data-jupyter-id]",
        "els => els.map(e => e.getAttribute('data-jupyter-id'))"))


def follows_glossary_link(page: Any, name: str, fragment: str,
                          screens: Path | None) -> tuple[list[Finding], set[str]]:
    """Click the first link to ``glossary.md#<fragment>`` in a lesson: the glossary must
    open as rendered Markdown with that term in view. Returns the findings and the
    glossary's anchors as JupyterLab rendered them."""
    open_lesson(page, name)
    link = page.locator(f".jp-RenderedMarkdown a[href*='glossary.md'][href$='#{fragment}']").first
    link.click()
    _tab(page, "glossary.md").wait_for(timeout=30_000)
    try:
        ids = glossary_ids(page)
    except Exception:  # noqa: BLE001 (opened, but not as rendered Markdown)
        ids = set()
    time.sleep(1.0)  # the viewer scrolls once rendered
    box = page.evaluate(
        """(id) => { const el = document.querySelector(
             `.jp-MarkdownViewer [data-jupyter-id="${CSS.escape(id)}"]`);
           if (!el) return null; const r = el.getBoundingClientRect();
           return [r.top, r.bottom, window.innerHeight]; }""", fragment)
    if screens:
        page.screenshot(path=str(screens / "glossary-link.png"))
    findings = []
    if not ids:
        findings.append(Finding(name, "the glossary link did not open the glossary as "
                                      "rendered Markdown"))
    elif box is None:
        findings.append(Finding(name, f"the glossary has no anchor #{fragment} in JupyterLab"))
    elif not 0 <= box[0] < box[2]:
        findings.append(Finding(name, f"the glossary opened but #{fragment} is not in view "
                                      f"(its top at {box[0]:.0f} px of {box[2]})"))
    close_current(page)  # the glossary
    close_current(page)  # the lesson
    return findings, ids


def runs_clean(page: Any, name: str, screens: Path | None,
               timeout_s: float = 300.0) -> list[Finding]:
    """Run All Cells in a lesson: no cell may end in an error or print a warning."""
    open_lesson(page, name)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    deadline = time.monotonic() + timeout_s
    time.sleep(1.0)
    while page.locator(".jp-InputPrompt", has_text="[*]").count():
        if time.monotonic() > deadline:
            return [Finding(name, f"Run All did not finish within {timeout_s:g} s")]
        time.sleep(0.5)
    _wait_idle(page)
    texts = page.eval_on_selector_all(
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
        "els => els.map(e => e.innerText)")
    if screens:
        page.screenshot(path=str(screens / f"run-all-{Path(name).stem}.png"))
    findings = []
    for text in texts:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        error = next((line for line in reversed(lines) if _ERROR.match(line)), None)
        if error or "Traceback" in text:
            findings.append(Finding(name, f"a cell ended in an error: {(error or lines[0])[:160]}"))
        elif "Warning" in text:
            warning = next(line for line in lines if "Warning" in line)
            findings.append(Finding(name, f"a cell printed a warning: {warning[:160]}"))
    return findings


def gives_a_hint(page: Any, name: str, stub: str, wrong: str, exercise: str,
                 screens: Path | None) -> list[Finding]:
    """In the open lesson, replace the answer cell that starts with ``stub`` by a wrong
    answer, run it and its check: the check must say "not right yet" with a hint."""
    cell = page.locator(".jp-CodeCell", has=page.locator(".cm-content", has_text=stub)).first
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(wrong)
    page.keyboard.press("Shift+Enter")  # the answer; the check cell is the next one
    page.keyboard.press("Shift+Enter")
    time.sleep(1.0)
    _wait_idle(page)
    check = cell.locator("xpath=following-sibling::div[contains(@class,'jp-CodeCell')][1]")
    said = check.locator(".jp-OutputArea").inner_text()
    if screens:
        check.scroll_into_view_if_needed()
        page.screenshot(path=str(screens / f"hint-{exercise}.png"))
    close_current(page)
    if f"Exercise {exercise}: not right yet" not in said or "Hint:" not in said:
        return [Finding(name, f"a wrong answer to {exercise} got no hint; the check said: "
                              f"{' '.join(said.split())[:200]!r}")]
    return []
