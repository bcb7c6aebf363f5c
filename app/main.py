"""Builds the FastAPI app: routers per concern, static files, security headers."""

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from app.paths import STATIC_DIR
from app.routers import health, pages, vendor
from app.security import SecurityHeadersMiddleware


def create_app() -> FastAPI:
    app = FastAPI(title="Decoding Playground", docs_url=None, redoc_url=None)
    app.add_middleware(SecurityHeadersMiddleware)

    app.include_router(health.router)
    app.include_router(pages.router)
    # /static/vendor/* is routed before the /static mount so that it serves only the pinned htmx files.
    app.include_router(vendor.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


app = create_app()
