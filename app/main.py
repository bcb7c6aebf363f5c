"""Builds the FastAPI app: routers per concern, static files, security headers; models load once in the lifespan."""

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from app.config import AppConfig
from app.paths import STATIC_DIR
from app.routers import api, health, pages, vendor, ws
from app.security import SecurityHeadersMiddleware
from app.state import Playground


def create_app(config: AppConfig | None = None) -> FastAPI:
    config = config or AppConfig.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.playground = Playground.load(config)
        yield

    app = FastAPI(title="Decoding Playground", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.config = config
    app.add_middleware(SecurityHeadersMiddleware)

    app.include_router(health.router)
    app.include_router(pages.router)
    app.include_router(api.router)
    app.include_router(ws.router)
    # /static/vendor/* is routed before the /static mount so that it serves only the pinned htmx files.
    app.include_router(vendor.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


app = create_app()
