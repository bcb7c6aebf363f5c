"""The one Jinja2 environment, with every filter and global the templates use (registered here, once, so
that any template renders whichever module was imported first). Templates are named `.html` so that
autoescaping is on."""
from __future__ import annotations

from fastapi.templating import Jinja2Templates

from app.paths import TEMPLATES_DIR
from app.views.fragments import age, iec, num, pct, piece, prompt_parts, shown, si_bytes, text_shown

templates = Jinja2Templates(directory=TEMPLATES_DIR)
templates.env.globals.update(piece=piece, prompt_parts=prompt_parts)     # for templates/_fragments.html
templates.env.filters.update(age=age, shown=shown, iec=iec, si_bytes=si_bytes, num=num, pct=pct, text_shown=text_shown)

_macros = None


def macros():
    """The fragment macros of templates/_fragments.html (autoescaped: it is an .html template)."""
    global _macros
    if _macros is None:
        _macros = templates.env.get_template("_fragments.html").module
    return _macros
