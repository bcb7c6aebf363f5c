"""The one Jinja2 environment. Templates are named `.html` so that autoescaping is on."""

from fastapi.templating import Jinja2Templates

from app.paths import TEMPLATES_DIR

templates = Jinja2Templates(directory=TEMPLATES_DIR)
