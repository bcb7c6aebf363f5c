"""The README's screenshot: the playground page mid-run, from a real server, in Debian's Chromium.

    .venv/bin/python scripts/screenshot.py [--out docs/screenshot.png] [--round 20]     (or: make screenshot)

Starts `decoding-playground serve` on a free port of 127.0.0.1, opens the page (1280x720) with a code prompt,
speculative decoding (the draft model, γ = 4) and 5 rounds a second, presses play, waits until round
`--round` has been drawn (the run is still going: 128 tokens take about 30 rounds), and saves a PNG. Needs
/usr/bin/chromium (`make browser`); Playwright's own browsers are not used (they would be downloaded).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CHROMIUM = "/usr/bin/chromium"
PROMPT = "def fibonacci(n):\n    "


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshot.png"))
    ap.add_argument("--round", type=int, default=20, help="take it once this round is on the page (default 20)")
    args = ap.parse_args()

    from playwright.sync_api import sync_playwright

    from cli.bench.served import Server  # `decoding-playground serve` on a free port, stopped afterwards

    query = urlencode({"prompt": PROMPT, "method": "draft_model", "num_speculative_tokens": 4, "max_tokens": 128,
                       "speed": 5, "autoplay": 1})
    with Server("--max-sessions", "8") as srv, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--disable-gpu", "--no-sandbox", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.goto(f"{srv.base}/?{query}", wait_until="networkidle")
            page.wait_for_function(
                "r => { const s = document.getElementById('run-status');"
                " return s && s.dataset.state === 'running' && Number(s.dataset.round) >= r; }",
                arg=args.round, timeout=60_000)
            page.wait_for_timeout(150)         # let the last swap's animation frame be drawn
            page.screenshot(path=args.out)
        finally:
            browser.close()
    print(f"{args.out}: {Path(args.out).stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
