"""One page of the site in headless Chromium: console, requests, images, math, folds, screenshot.

The site is served by a local HTTP server on 127.0.0.1 (a free port), rooted at the site
folder: every request to another origin leaves the folder, is recorded and aborted (so
nothing is fetched from outside even when the network is up). Server and browser are
stopped when the ``with`` block ends, whatever happened in it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from course_tools.website import SiteError

CHROMIUM_ENV = "CHROMIUM"  # path of the browser; default /usr/bin/chromium (Debian's)
DEFAULT_CHROMIUM = "/usr/bin/chromium"
RAW_MATH = ("$$", "\\(", "\\)", "\\[", "\\]", "\\begin{")
# Run in the page by visit(): wait for images and MathJax, then report what is left.
SETTLE_JS = r"""
async (rawMath) => {
  const timeout = (ms) => new Promise((resolve) => setTimeout(resolve, ms, "timeout"));
  const imgs = Array.from(document.images);
  imgs.forEach((img) => { if (img.loading === "lazy") img.loading = "eager"; });
  await Promise.race([Promise.all(imgs.map((img) => img.decode().catch(() => null))), timeout(20000)]);
  const broken = imgs.filter((img) => !img.complete || img.naturalWidth === 0)
    .map((img) => `<img src="${img.getAttribute("src")}">`);
  let mathState = "none";
  const mj = window.MathJax;
  if (mj && mj.Hub && mj.Hub.Register) {  // MathJax 2: the initial typeset has ended
    mathState = await Promise.race([
      new Promise((resolve) => mj.Hub.Register.StartupHook("End", () => resolve("done"))),
      timeout(30000)]);
  } else if (mj && mj.startup && mj.startup.promise) {  // MathJax 3
    mathState = await Promise.race([mj.startup.promise.then(() => "done"), timeout(30000)]);
  }
  const mathErrors = [];
  if (mathState === "timeout") mathErrors.push("MathJax did not finish within 30 s");
  document.querySelectorAll(".MathJax_Error, .merror, mjx-merror").forEach((el) =>
    mathErrors.push(`math error: ${el.textContent.slice(0, 80)}`));
  const skip = "pre, code, script, style, textarea, noscript, .highlight";
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.parentElement && node.parentElement.closest(skip)) continue;
    const text = node.textContent;
    const found = rawMath.find((token) => text.includes(token));
    if (found) {
      const at = text.indexOf(found);
      mathErrors.push(`raw math ${JSON.stringify(found)} left in the text: "${text.slice(Math.max(0, at - 30), at + 40).trim()}"`);
    }
  }
  const math = document.querySelectorAll('script[type^="math/tex"], mjx-container').length;
  return { images: imgs.length, broken, math, mathErrors };
}
"""

# Run in the page by visit(): open every fold (a <details> box, or a hidden cell output's
# toggle, which myst-nb renders as <details class="hide">) by clicking its summary, and
# report any that stays shut or shows nothing once open.
FOLDS_JS = r"""
async () => {
  const folds = Array.from(document.querySelectorAll("details"));
  const shut = [];
  let toggles = 0;
  for (const [i, fold] of folds.entries()) {
    const hidden = fold.classList.contains("hide");
    toggles += hidden ? 1 : 0;
    const summary = fold.querySelector(":scope > summary");
    const name = `<details #${i + 1}${hidden ? " (hidden output)" : ""}: ` +
      `${(summary ? summary.textContent : "").trim().replace(/\s+/g, " ").slice(0, 40)}>`;
    if (!summary) { shut.push(`${name} has no summary to click`); continue; }
    if (fold.open) { shut.push(`${name} is open before any click`); continue; }
    summary.scrollIntoView();
    summary.click();
    await new Promise((resolve) => requestAnimationFrame(() => resolve()));
    const shown = Array.from(fold.children).filter((el) => el !== summary)
      .some((el) => el.getBoundingClientRect().height > 0);
    if (!fold.open || !shown) shut.push(`${name} shows nothing when clicked`);
  }
  return { folds: folds.length, toggles, shut };
}
"""


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the browser closing a connection early is not the site's fault


@contextmanager
def serve(root: Path) -> Iterator[str]:
    """Serve ``root`` on 127.0.0.1 at a free port; yields the base URL, ending in '/'."""
    server = _QuietServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, name="site-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def chromium_path() -> str:
    """The Chromium to drive: $CHROMIUM, else Debian's /usr/bin/chromium."""
    path = os.environ.get(CHROMIUM_ENV) or DEFAULT_CHROMIUM
    found = shutil.which(path)
    if found is None:
        raise SiteError(
            f"no Chromium at {path}; install Debian's: apt-get install chromium "
            f"(or set {CHROMIUM_ENV} to a Chromium executable)"
        )
    return found


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driven by Playwright, closed (with its driver) on exit."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        raise SiteError("playwright is not installed; `make site-check` installs it") from error
    executable = chromium_path()
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=executable, headless=True)
        except Exception as error:  # noqa: BLE001 (Playwright's Error: say it in one line)
            first = (
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            )
            raise SiteError(f"Chromium at {executable} did not start: {first}") from error
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class PageReport:
    """What the browser saw on one page."""

    page: str
    requests: int = 0
    outside: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    images: int = 0
    broken_images: list[str] = field(default_factory=list)
    math: int = 0
    math_errors: list[str] = field(default_factory=list)
    folds: int = 0  # <details> boxes, hidden outputs' toggles included
    toggles: int = 0  # of those, hidden cell outputs
    shut_folds: list[str] = field(default_factory=list)
    seconds: float = 0.0


def visit(browser: Any, base: str, page: str, screenshot: Path | None = None) -> PageReport:
    """Open ``base + page``, let it settle (images decoded, MathJax done), then report it."""
    report, start = PageReport(page), time.perf_counter()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        tab = context.new_page()

        def route(request_route: Any) -> None:
            url = request_route.request.url
            if url.startswith(base) or url.startswith(("data:", "blob:")):
                request_route.continue_()
            else:
                report.outside.append(f"{url} ({request_route.request.resource_type})")
                request_route.abort()

        def failed(request: Any) -> None:
            if request.url.startswith(base):
                report.failed.append(f"{request.url[len(base) :]} ({request.failure})")

        tab.route("**/*", route)
        tab.on("request", lambda _: setattr(report, "requests", report.requests + 1))
        tab.on("requestfailed", failed)
        tab.on("response", lambda r: r.status >= 400 and report.failed.append(f"{r.url[len(base):]} (HTTP {r.status})"))  # fmt: skip
        tab.on("console", lambda m: m.type == "error" and report.console.append(m.text))
        tab.on("pageerror", lambda e: report.console.append(f"uncaught: {e}"))
        try:
            tab.goto(base + page, wait_until="load", timeout=60_000)
        except Exception as error:  # noqa: BLE001 (Playwright's Error: reported, not raised)
            report.failed.append(f"{page} did not load: {str(error).strip().splitlines()[0]}")
            return report
        try:
            tab.wait_for_load_state("networkidle", timeout=20_000)
        except Exception:  # noqa: BLE001 (Playwright's TimeoutError; reported, not raised)
            report.failed.append("the page still had requests open after 20 s")
        seen = tab.evaluate(SETTLE_JS, list(RAW_MATH))
        report.images, report.broken_images = seen["images"], seen["broken"]
        report.math, report.math_errors = seen["math"], seen["mathErrors"]
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(screenshot), full_page=True)
        folds = tab.evaluate(FOLDS_JS)  # after the screenshot, which shows the folds shut
        report.folds, report.toggles, report.shut_folds = folds["folds"], folds["toggles"], folds["shut"]
    finally:
        context.close()
    report.seconds = time.perf_counter() - start
    return report


# Sphinx's searchtools.js declares ``const Search`` (not on window); its status line is
# filled when the search has finished
FINISHED_JS = (
    "() => typeof Search !== 'undefined' && !!(Search.status && Search.status.innerText.trim())"
)


def search_hits(browser: Any, base: str, query: str) -> tuple[int, list[str]]:
    """(results, console errors) of the site's own search page for ``query``, once the search
    has finished (it fetches every page it lists); no result after 30 s counts as 0."""
    context = browser.new_context()
    errors: list[str] = []
    try:
        tab = context.new_page()
        tab.on("console", lambda m: m.type == "error" and errors.append(m.text))
        tab.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
        tab.goto(f"{base}search.html?q={query}", wait_until="load", timeout=60_000)
        try:
            tab.wait_for_function(FINISHED_JS, timeout=30_000)
        except Exception:  # noqa: BLE001 (Playwright's TimeoutError: the search never finished)
            return 0, errors
        return tab.evaluate("document.querySelectorAll('#search-results li').length"), errors
    finally:
        context.close()
