"""Open the report in a real headless Chromium, offline, and list what a reader would find broken.

For the index and every notebook page: a JavaScript error, a link to a file or anchor that does not exist, an
image that does not load, raw TeX left in the text, and (at 420 px wide) a page that scrolls sideways outside
its table boxes. On a notebook page, every figure (a PNG output) must be a link that shows it at full size, and at
1280 px the page must show it at least as wide as the figures' text is sized for
(:data:`dynheads_tl.analysis.plots.INLINE_WIDTH_PX`, or its own width when narrower). The browser is driven over
the DevTools protocol on a pipe (``--remote-debugging-pipe``: no WebSocket library, no port), and the pages are
served by a localhost HTTP server started here, so links can be fetched the way a browser follows
them. Nothing is written into the report folder.

    python -m dynheads_tl.report.browser papers_figures [--screenshots DIR]
"""
from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from dynheads_tl.analysis.plots import INLINE_WIDTH_PX
from dynheads_tl.report.results import is_model_report, model_reports, preset_reports
from dynheads_tl.report.text import raw_tex

NARROW = 420  # px: the page must not scroll sideways at this width, except inside its table boxes
WIDE = 1280

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--mute-audio", "--hide-scrollbars"]


def find_chromium() -> str | None:
    """The Chromium executable ($CHROMIUM, else chromium / chromium-browser / google-chrome on PATH)."""
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class Browser:
    """A headless Chromium and one page, driven over the DevTools protocol on file descriptors 3 and 4."""

    def __init__(self, executable: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="dynheads-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def child_fds() -> None:  # the protocol's pipe: the browser reads fd 3 and writes fd 4
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=child_fds, pass_fds=(3, 4), start_new_session=True)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time.")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe (it exited).")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict[str, Any] | None = None, session: bool = False) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, event: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.timeout)
        while not any(e.get("method") == event for e in self.events):
            self.events.append(self._read_message(deadline))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                "returnByValue": True}, session=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluating a check failed: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def open(self, url: str, width: int) -> None:
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=True)
        self.events = []
        self.call("Page.navigate", {"url": url}, session=True)
        self.wait_for("Page.loadEventFired")

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except Exception:  # already gone
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # the browser's own process group, started above
            self.process.wait(timeout=10)
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # no request log on stderr
        pass


class Server:
    """A localhost HTTP server of ``folder`` in a thread, for the lifetime of a ``with`` block."""

    def __init__(self, folder: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "Server":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


# Every same-origin link and image of the page: fetched (files), and anchors looked up in their page.
_LINK_CHECK = r"""
(async () => {
  const problems = [];
  const here = location.href.split('#')[0];
  const pages = {};
  const hasAnchor = (doc, fragment) => {
    if (!fragment) return true;
    let decoded = fragment; try { decoded = decodeURIComponent(fragment); } catch (e) {}
    return !!(doc.getElementById(fragment) || doc.getElementById(decoded) || doc.getElementsByName(decoded).length);
  };
  const targets = [...document.querySelectorAll('a[href], img[src], link[href], script[src]')].map(
    e => ({tag: e.tagName.toLowerCase(), url: e.href || e.src, raw: e.getAttribute('href') || e.getAttribute('src')}));
  for (const t of targets) {
    const u = new URL(t.url, location.href);
    if (u.origin !== location.origin) { if (u.protocol === 'file:') problems.push('file:// link ' + t.raw); continue; }
    const base = u.href.split('#')[0];
    const fragment = u.hash.slice(1);
    if (base === here) { if (!hasAnchor(document, fragment)) problems.push('no anchor #' + fragment + ' on this page'); continue; }
    if (!(base in pages)) {
      try {
        const r = await fetch(base);
        pages[base] = r.ok ? (fragment && base.endsWith('.html') ? await r.text() : '') : null;
      } catch (e) { pages[base] = null; }
    } else if (pages[base] === '' && fragment && base.endsWith('.html')) {
      const r = await fetch(base); pages[base] = await r.text();
    }
    if (pages[base] === null) { problems.push('broken ' + t.tag + ' link ' + t.raw); continue; }
    if (fragment && base.endsWith('.html')) {
      const doc = new DOMParser().parseFromString(pages[base], 'text/html');
      if (!hasAnchor(doc, fragment)) problems.push('link ' + t.raw + ': no such anchor in ' + base.split('/').pop());
    }
  }
  return [...new Set(problems)];
})()
"""

_IMAGE_CHECK = r"""
(async () => {
  const images = [...document.images];
  images.forEach(i => { i.loading = 'eager'; });
  const broken = await Promise.all(images.map(i => i.decode().then(() => null, () => i.getAttribute('src'))));
  return broken.filter(x => x).map(s => s.startsWith('data:') ? s.slice(0, 40) + '…' : s);
})()
"""

# Every figure of a notebook page (a PNG output): a link that shows it at full size (its PNG file, the same image; or
# its own id, which opens it over the page at its natural width), and shown at least `inline` px wide (or at its own
# width) at 1280 px.
_ENLARGE_CHECK = r"""
(async (inline) => {
  const problems = [];
  const frame = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const images = [...document.querySelectorAll('main.page .jp-RenderedImage img')];
  for (const [i, img] of images.entries()) {
    img.loading = 'eager';
    await img.decode().catch(() => null);
    const name = 'figure ' + (i + 1) + ' (' + (img.alt || '').slice(0, 50) + (img.alt.length > 50 ? '…' : '') + ')';
    const shown = img.getBoundingClientRect().width;
    if (shown + 1 < Math.min(img.naturalWidth, inline))
      problems.push(name + ' is shown ' + Math.round(shown) + ' px wide at ' + window.innerWidth + ' px, less than the '
                    + inline + ' px its text is sized for');
    const link = img.closest('a.enlarge');
    if (!link) { problems.push(name + ' is not a link to itself at full size'); continue; }
    const target = new URL(link.href, location.href);
    if (target.href.split('#')[0] === location.href.split('#')[0] && target.hash) {
      location.hash = target.hash;
      await frame();
      const box = img.getBoundingClientRect(), over = getComputedStyle(img.closest('.zoom') || img).position;
      const full = Math.abs(box.width - img.naturalWidth) <= 1 && over === 'fixed';
      location.hash = '';
      await frame();
      if (!full) problems.push(name + ': its link ' + link.getAttribute('href') + ' does not show it at full size ('
                               + Math.round(box.width) + ' of ' + img.naturalWidth + ' px)');
      continue;
    }
    const opened = new Image();
    opened.src = target.href;
    const loads = await opened.decode().then(() => true, () => false);
    if (!loads) problems.push(name + ': its link ' + link.getAttribute('href') + ' does not open an image');
    else if (opened.naturalWidth !== img.naturalWidth || opened.naturalHeight !== img.naturalHeight)
      problems.push(name + ': its link ' + link.getAttribute('href') + ' opens a ' + opened.naturalWidth + ' x '
                    + opened.naturalHeight + ' px image, not this ' + img.naturalWidth + ' x ' + img.naturalHeight
                    + ' one');
  }
  return problems;
})"""

# Elements whose right edge passes the viewport and that are not inside a box that scrolls on its own.
_OVERFLOW_CHECK = r"""
(() => {
  const width = document.documentElement.clientWidth;
  const scrolls = e => { for (let p = e.parentElement; p; p = p.parentElement) {
      const s = getComputedStyle(p); if (/(auto|scroll|hidden)/.test(s.overflowX) && p !== document.body
          && p !== document.documentElement) return true; } return false; };
  const wide = [];
  for (const e of document.body.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (r.width && r.right > width + 1 && !scrolls(e)) {
      wide.push(e.tagName.toLowerCase() + (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ')[0] : '')
                + ' (' + Math.round(r.right) + ' px)');
    }
  }
  return {scrollWidth: document.documentElement.scrollWidth, width: width, wide: [...new Set(wide)].slice(0, 5)};
})()
"""


def page_problems(browser: Browser, url: str, name: str, screenshot: Path | None = None) -> list[str]:
    """What is broken on one page: JavaScript errors, broken links, anchors and images, raw TeX, a figure that is no
    link to itself at full size or is shown narrower than its text is sized for (at :data:`WIDE` px), and sideways
    scrolling at :data:`NARROW` px (a screenshot at that width is written to ``screenshot`` when given)."""
    problems = []
    browser.open(url, WIDE)
    time.sleep(0.3)  # scripts that run after the load event (circuitsvis renders then)
    browser.evaluate("1")  # drain: events that arrived meanwhile are collected by the call
    for event in browser.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            problems.append(f"{name}: JavaScript error: {str(text).splitlines()[0][:200]}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            problems.append(f"{name}: console error: {args[:200]}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            problems.append(f"{name}: a resource failed to load ({params.get('errorText')})")
    problems += [f"{name}: {p}" for p in browser.evaluate(_LINK_CHECK)]
    problems += [f"{name}: image does not load: {p}" for p in browser.evaluate(_IMAGE_CHECK)]
    text = browser.evaluate("document.body.innerText")
    problems += [f"{name}: raw TeX in the text: {t}" for t in raw_tex(text)[:5]]
    problems += [f"{name}: {p}" for p in browser.evaluate(f"{_ENLARGE_CHECK}({INLINE_WIDTH_PX})")]
    browser.open(url, NARROW)
    time.sleep(0.3)
    overflow = browser.evaluate(_OVERFLOW_CHECK)
    metrics = browser.call("Page.getLayoutMetrics", session=True)
    content_width = metrics.get("cssContentSize", metrics.get("contentSize", {})).get("width", 0)
    if overflow["scrollWidth"] > overflow["width"] + 1 or content_width > NARROW + 1:
        problems.append(f"{name}: at {NARROW} px the page scrolls sideways ({overflow['scrollWidth']} px wide; "
                        f"outside a table box: {', '.join(overflow['wide']) or 'none found'})")
    if screenshot is not None:
        shot = browser.call("Page.captureScreenshot", {"format": "png"}, session=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
    return problems


def report_pages(report: Path) -> list[str]:
    """The pages to check, relative to the report folder: its index and, for a whole report, each preset's index, then
    one model's report (the folder itself, else the first of the first preset): its index and every notebook page.
    Every model's pages come from the same templates; the static checks (report/checks.py) read every link of every
    page."""
    report = Path(report)
    presets = [] if is_model_report(report) else preset_reports(report)
    sampled = next((model.folder for preset in presets for model in model_reports(preset.folder)), report)
    pages = ["index.html"] + [f"{preset.prefix}index.html" for preset in presets]
    if sampled != report:
        pages.append(f"{sampled.relative_to(report).as_posix()}/index.html")
    return pages + sorted(p.relative_to(report).as_posix() for p in (sampled / "executed").glob("*.html"))


def browser_problems(report: Path, executable: str | None = None, screenshots: Path | None = None) -> list[str]:
    """Every problem :func:`page_problems` finds on the report's pages; raises when Chromium is missing."""
    report = Path(report).resolve()
    executable = executable or find_chromium()
    if executable is None:
        raise FileNotFoundError("No Chromium found (apt-get install chromium, or set CHROMIUM=/path/to/chromium).")
    problems = []
    with Server(report) as server, Browser(executable) as browser:
        for page in report_pages(report):
            shot = screenshots / (page.replace("/", "_") + f".{NARROW}px.png") if screenshots else None
            problems += page_problems(browser, server.url + page, page, shot)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dynheads_tl.report.browser",
                                     description="Check a report's pages in headless Chromium, offline.")
    parser.add_argument("report", nargs="?", default="papers_figures")
    parser.add_argument("--screenshots", default=None, help="write a 420 px screenshot of each page here")
    args = parser.parse_args(argv)
    shots = Path(args.screenshots) if args.screenshots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    problems = browser_problems(Path(args.report), screenshots=shots)
    print("\n".join(problems) if problems else "No problems found.")
    return 1 if problems else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
