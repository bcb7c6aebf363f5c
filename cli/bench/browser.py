"""The page in headless Chromium for the benches: one tab reloaded per run, Chromium's own CPU time, and waiting
until the previous page has gone quiet."""
from __future__ import annotations

import os
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path

from cli.bench.lib import cpu_seconds

CHROMIUM = Path("/usr/bin/chromium")
PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
INIT_SCRIPT = """
    document.addEventListener('htmx:wsBeforeSend', function () {
      if (!window.__benchStart) window.__benchStart = performance.now()
    }, true)
    document.addEventListener('htmx:wsAfterMessage', function () {
      setTimeout(function () {      // after the page's own handler has noted the time
        var s = window.playgroundStats
        if (s && s.doneAt !== null && !window.__benchDone) {
          window.__benchDone = true
          console.info('bench:done')
        }
      }, 0)
    })"""


def chromium_pids() -> list[int]:
    """This process's Chromium (the browser Playwright launched and its children), from /proc; [] elsewhere."""
    parent: dict[int, int] = {}
    try:
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    pass
    except OSError:
        return []
    mine, pids = {os.getpid()}, []
    for _ in range(8):                       # this process > Playwright's driver > Chromium > its children
        mine |= {pid for pid, ppid in parent.items() if ppid in mine}
    for pid in mine:
        try:
            if "chromium" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace"):
                pids.append(pid)
        except OSError:
            pass
    return pids


def load_until_done(page, url: str, timeout_s: float = 120) -> float:
    """Load `url` after a blank page, once Chromium has gone quiet (under 5% of a core over 0.25 s, at most 5 s),
    and wait for its run's `done`; Chromium's CPU seconds meanwhile."""
    page.goto("about:blank")
    quiet_by = time.monotonic() + 5.0
    while time.monotonic() < quiet_by:
        pids = chromium_pids()
        before = cpu_seconds(pids)
        time.sleep(0.25)
        if not pids or cpu_seconds(pids) - before <= 0.05 * 0.25:
            break
    pids = chromium_pids()
    cpu_before = cpu_seconds(pids)
    with page.expect_console_message(lambda m: m.text == "bench:done", timeout=timeout_s * 1000):
        page.goto(url)
    return cpu_seconds(pids + [p for p in chromium_pids() if p not in pids]) - cpu_before


def browser_run(page, base_url: str, settings: dict, timeout_s: float = 120) -> dict:
    query = urllib.parse.urlencode({"autoplay": "1", "speed": "max", "prompt": PROMPT,
                                    **{k: str(v) for k, v in settings.items()}})
    cpu_s = load_until_done(page, f"{base_url}/?{query}", timeout_s)
    s = page.evaluate("""() => Object.assign({}, window.playgroundStats, {start: window.__benchStart,
                           statusText: document.getElementById('run-status').textContent})""")
    wall = (s["doneAt"] - s["start"]) / 1e3
    streaming = [t for t in s["longTasks"] if s["start"] <= t["start"] <= s["doneAt"]]
    times = s["tokenTimes"]
    return {"tokens": s["tokens"], "wall_s": wall, "tokens_per_s": s["tokens"] / wall, "messages": s["messages"],
            "token_gaps_ms": [b - a for a, b in zip(times, times[1:])],
            "first_token_ms": s["firstTokenAt"] - s["start"], "chromium_cpu_s": cpu_s,
            "long_tasks": len(streaming), "max_long_task_ms": max((t["duration"] for t in streaming), default=0.0)}


@contextmanager
def chromium_tab(bench: str):
    """Headless Chromium (Playwright with Debian's /usr/bin/chromium) and the one tab every run loads the page into."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        raise SystemExit(f"bench {bench} needs Chromium at {CHROMIUM} (make browser)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--disable-gpu", "--no-sandbox", "--disable-background-networking"])
        try:
            # one tab reloaded per run: a new tab is a new headless window, whose omnibox popup Chromium builds
            # for about a second after it opens, competing with the run for the cores
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            # the page says when it is done through the console: waiting costs the page nothing (polling from
            # here would, and wait_for_function evaluates strings in the page, which its CSP forbids)
            page.add_init_script(INIT_SCRIPT)
            yield page
        finally:
            browser.close()
