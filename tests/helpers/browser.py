"""Open a page in headless Chromium and report what a reader's browser would see.

Chromium is driven through its DevTools protocol over a pipe
(--remote-debugging-pipe: JSON messages separated by NUL on file descriptors
3 and 4), so no websocket client, no Playwright and no downloaded browser are
needed: Debian's `chromium` package and the standard library suffice.
"""

from __future__ import annotations

import base64
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

# Screenshots the browser tests keep, for a person to look at.
ARTIFACTS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "test-artifacts"
)

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-pipe",
]

# Every <svg> in a <figure>: its drawn size and how many shapes it holds.
FIGURES_JS = """JSON.stringify(Array.from(document.querySelectorAll('figure svg')).map(svg => {
  const box = svg.getBoundingClientRect();
  return {width: box.width, height: box.height, shapes: svg.querySelectorAll('path, rect, image, text, use').length};
}))"""  # noqa: E501

# Does the page fit its viewport? The page's and the viewport's widths; every table cell whose
# content is wider than the cell (clipped), with the start of its text; and in a study view's
# tables, every cell holding a sentence (6 words or more, over 30 characters) squeezed narrower than
# CRAMPED_PX, a word a line, and every short word (up to 20 characters, no space) broken across
# lines.
CRAMPED_PX = 160
LAYOUT_JS = """(() => {
  const cells = Array.from(document.querySelectorAll('.view-table td'));  // a study view's tables
  const text = c => c.textContent.trim();
  const wraps = c => {  // do the cell's text boxes start on more than one line?
    const walk = document.createTreeWalker(c, NodeFilter.SHOW_TEXT), boxes = [];
    for (let node; (node = walk.nextNode());) {
      const r = document.createRange(); r.selectNodeContents(node);
      boxes.push(...Array.from(r.getClientRects()).filter(b => b.width > 0));
    }
    const tops = boxes.map(b => b.top);
    return boxes.length > 1 && Math.max(...tops) - Math.min(...tops) > Math.min(...boxes.map(b => b.height)) / 2;
  };
  return JSON.stringify({
    scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth,
    clipped: Array.from(document.querySelectorAll('td, th')).filter(c => c.scrollWidth > c.clientWidth + 1)
               .map(c => text(c).slice(0, 80)),
    cramped: cells.filter(c => (text(c).match(/ /g) || []).length >= 5 && text(c).length > 30
                               && c.getBoundingClientRect().width < CRAMPED)
               .map(c => `${Math.round(c.getBoundingClientRect().width)} px: ${text(c).slice(0, 60)}`),
    broken: cells.filter(c => text(c) && !/\\s/.test(text(c)) && text(c).length <= 20 && wraps(c)).map(text),
  });
})()""".replace("CRAMPED", str(CRAMPED_PX))  # noqa: E501


def find_chromium() -> str | None:
    for candidate in (
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass
class PageReport:
    requests: list[str] = field(default_factory=list)
    failed_loads: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    figures: list[dict] = field(default_factory=list)
    layout: dict = field(default_factory=dict)
    screenshot: str | None = None
    # what each of `inspect`'s `evaluate` expressions returned
    found: dict = field(default_factory=dict)


class DevTools:
    """A Chromium process and its DevTools pipe: send a command, wait for its answer, keep the
    events."""

    def __init__(self, binary: str, timeout_s: float = 60):
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="feedbench-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # bash moves our pipe ends to the descriptors Chromium expects, 3 (commands) and 4
        # (answers); not sh: dash only redirects single-digit descriptors.
        self.process = subprocess.Popen(
            [
                "bash",
                "-c",
                f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}',
                binary,
                *FLAGS,
                f"--user-data-dir={self.profile}",
                "about:blank",
            ],
            pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(
                    f"Chromium closed its DevTools pipe (exit code {self.process.poll()})"
                )
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, method: str) -> dict:
        deadline = time.monotonic() + self.timeout_s
        seen = 0
        while True:
            for event in self.events[seen:]:
                if event.get("method") == method:
                    return event
            seen = len(self.events)
            self.events.append(self._read(deadline))

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)


def inspect(
    page: str,
    screenshot: str | None = None,
    binary: str | None = None,
    width: int = 1280,
    selector: str | None = None,
    max_height: int | None = None,
    height: int = 900,
    evaluate: dict[str, str] | None = None,
) -> PageReport:
    """Load `page` (a file path) in a viewport `width` x `height`, wait for its load event, and
    collect requests, failures, console errors, figure sizes and the layout's fit, and what each
    JavaScript expression of `evaluate` returns (a JSON string, parsed into `found` under its name).
    The screenshot shows the whole page, or the element `selector` names, cut at `max_height` pixels
    when given."""
    browser = DevTools(binary or find_chromium())
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Network", "Runtime", "Log"):
            browser.send(f"{domain}.enable", session=session)
        browser.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
            session=session,
        )
        navigation = browser.send(
            "Page.navigate", {"url": "file://" + os.path.abspath(page)}, session=session
        )
        report = PageReport()
        if navigation.get("errorText"):
            report.failed_loads.append(f"{page}: {navigation['errorText']}")
        browser.wait_for("Page.loadEventFired")
        layout = browser.send(
            "Runtime.evaluate", {"expression": LAYOUT_JS, "returnByValue": True}, session=session
        )
        report.layout = json.loads(layout["result"]["value"])
        report.figures = json.loads(
            browser.send(
                "Runtime.evaluate",
                {"expression": FIGURES_JS, "returnByValue": True},
                session=session,
            )["result"]["value"]
        )
        for name, expression in (evaluate or {}).items():
            answer = browser.send(
                "Runtime.evaluate",
                {"expression": expression, "returnByValue": True},
                session=session,
            )
            report.found[name] = json.loads(answer["result"]["value"])
        if screenshot:
            size = browser.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
            clip = {"x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1}
            if selector:
                where = (
                    f"(b => ({{x: b.left + scrollX, y: b.top + scrollY, width: b.width, height: "
                    f"b.height}}))(document.querySelector({json.dumps(selector)}"
                    ").getBoundingClientRect())"
                )
                answer = browser.send(
                    "Runtime.evaluate",
                    {"returnByValue": True, "expression": f"JSON.stringify({where})"},
                    session=session,
                )
                box = json.loads(answer["result"]["value"])
                clip.update(
                    x=max(box["x"] - 16, 0),
                    y=max(box["y"] - 16, 0),
                    width=min(box["width"] + 32, width),
                    height=box["height"] + 32,
                )
            if max_height:
                clip["height"] = min(clip["height"], max_height)
            shot = browser.send(
                "Page.captureScreenshot",
                {"format": "png", "captureBeyondViewport": True, "clip": clip},
                session=session,
            )
            os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
            with open(screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
            report.screenshot = screenshot
        urls = {}
        for event in browser.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Network.requestWillBeSent":
                urls[params["requestId"]] = params["request"]["url"]
                report.requests.append(params["request"]["url"])
            elif method == "Network.loadingFailed":
                reason = params.get("blockedReason") or params.get("errorText")
                report.failed_loads.append(
                    f"{urls.get(params['requestId'], params['requestId'])}: {reason}"
                )
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                report.console_errors.append(
                    " ".join(
                        str(a.get("value", a.get("description", "")))
                        for a in params.get("args", [])
                    )
                )
            elif method == "Runtime.exceptionThrown":
                report.console_errors.append(params["exceptionDetails"].get("text", "exception"))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                report.console_errors.append(
                    f"{params['entry'].get('source')}: {params['entry'].get('text')}"
                )
        return report
    finally:
        browser.close()


def assert_fits(page, what: str, width: int) -> None:
    """The page fits; on a laptop no sentence is squeezed to a word a line (on a phone a wide
    table's sentences may be narrow: the table scrolls in its box); at no width is a short word
    broken."""
    layout = page.layout
    assert layout["scrollWidth"] <= layout["clientWidth"], (
        f"{what}: the page scrolls sideways {layout}"
    )
    assert layout["clipped"] == [], f"{what}: table cells clip their content"
    if width >= 1280:
        assert layout["cramped"] == [], f"{what}: sentences squeezed to a word a line"
    assert layout["broken"] == [], f"{what}: short words broken across lines"


def without_tags(html: str) -> str:
    """A part of a report as its reader reads it: the tags (the glossary's links among them) taken
    out."""
    return re.sub(r"<[^>]+>", "", html)


def paragraph_texts(page: str, css_class: str) -> list[str]:
    """The text of each `<p class="css_class">` of a report, its inline tags (the glossary's links)
    taken out."""
    return [
        without_tags(text) for text in re.findall(rf'<p class="{css_class}">(.*?)</p>', page, re.S)
    ]
