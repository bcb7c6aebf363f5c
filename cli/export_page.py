"""`decoding-playground export-page RECORDING.json`: a recorded run (the page's "⤓ Export this run") as one HTML
file that plays it anywhere, with no server (app/views/one_file_page.py) — for decks built by script."""
from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("export-page", help="turn a recording into one HTML page that plays it with no server")
    p.add_argument("recording", help="a recording file (the page's JSON export), or - to read it from stdin")
    p.add_argument("-o", "--output", default=None,
                   help="the page to write (default: the recording's name with .html; - for stdout)")
    p.add_argument("--layout", default="", help="what it shows, as /embed's layout=: stream, kv or gauges "
                                                "(default: the whole run)")
    p.add_argument("--presenter", action="store_true", help="large type, as /embed's presenter=1")
    p.add_argument("--theme", default="light", help="light or dark")
    p.add_argument("--hide", default="", metavar="PARTS",
                   help="comma-separated parts to leave out: status, legend, stream, draft, kv, gauges, chart, notes")
    p.add_argument("--speed", default="5", help="rounds per second when played: 0.5, 1, 2, 5 (default), 10, 25, max")
    p.add_argument("--autoplay", action="store_true", help="play when opened")
    p.add_argument("--plain", action="store_true",
                   help="the frames as plain JSON (several times larger) instead of gzip, for browsers without "
                        "DecompressionStream")
    p.set_defaults(func=cmd_export_page)


def cmd_export_page(args) -> int:
    from app.views.recording import Recording, RecordingError
    from app.views.one_file_page import PageOptions, standalone_page

    source = "stdin" if args.recording == "-" else args.recording
    try:
        body = sys.stdin.buffer.read() if args.recording == "-" else Path(args.recording).read_bytes()
        recording = Recording.read(body, name=None if args.recording == "-" else Path(source).name)
        options = PageOptions(layout=args.layout, presenter=args.presenter, theme=args.theme, speed=args.speed,
                              hide=[h.strip() for h in args.hide.split(",") if h.strip()], autoplay=args.autoplay)
        html = standalone_page(recording, options, compress=not args.plain)
    except (OSError, ValueError, RecordingError) as e:
        print(f"decoding-playground export-page: error: {source}: {e}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, AttributeError) as e:       # events of the right names, wrong contents
        print(f"decoding-playground export-page: error: {source}: its events do not render ({type(e).__name__})",
              file=sys.stderr)
        return 2
    if args.output == "-":
        sys.stdout.write(html)
        return 0
    out = Path(args.output) if args.output else Path(source if source != "stdin" else "recording").with_suffix(".html")
    out.write_text(html, encoding="utf-8")
    print(f"{out}: {len(html.encode()):,} bytes, {recording.num_rounds} rounds; open it in a browser "
          "(no server needed)", file=sys.stderr)
    return 0
