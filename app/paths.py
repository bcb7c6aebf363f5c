"""Where the app finds its templates, static files and vendored front-end assets.

NOTE: `pip install .` (as in the Dockerfile) puts `app/` in site-packages, away from `templates/`,
`static/` and `node_modules/`; set DECODING_PLAYGROUND_HOME to the project directory there.
From a checkout (editable install) the default, the directory above `app/`, is right.
"""

import os
from pathlib import Path

PROJECT_DIR = Path(os.environ.get("DECODING_PLAYGROUND_HOME", Path(__file__).resolve().parent.parent))
TEMPLATES_DIR = PROJECT_DIR / "templates"
STATIC_DIR = PROJECT_DIR / "static"
NODE_MODULES_DIR = PROJECT_DIR / "node_modules"

# The only files served from node_modules (pinned in package-lock.json; `npm ci` installs them).
VENDOR_FILES = {
    "htmx.min.js": NODE_MODULES_DIR / "htmx.org" / "dist" / "htmx.min.js",
    "ws.js": NODE_MODULES_DIR / "htmx-ext-ws" / "dist" / "ws.js",
}
