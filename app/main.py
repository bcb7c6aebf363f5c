"""Builds the FastAPI app: routers per concern, static files, the Host check, security headers, workshop mode's token;
the models load once in the lifespan, which also runs the engine thread."""

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from app.body_limits import BodyLimitMiddleware
from app.config import AppConfig
from app.paths import STATIC_DIR
from app.routers import api, health, metrics, pages, vendor, watch, ws
from app.security import HostMiddleware, SecurityHeadersMiddleware, TokenMiddleware
from app.state import Playground


def create_app(config: AppConfig | None = None) -> FastAPI:
    config = config or AppConfig.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.playground = Playground.load(config)
        await app.state.playground.start()
        try:
            yield
        finally:
            await app.state.playground.stop()

    app = FastAPI(title="Decoding Playground", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.config = config
    app.add_middleware(TokenMiddleware, token=config.token)
    app.add_middleware(BodyLimitMiddleware)              # each route's body limit, before any route reads it
    app.add_middleware(SecurityHeadersMiddleware)        # also on the token middleware's 401 and the 413
    app.add_middleware(HostMiddleware, allowed_hosts=config.allowed_hosts, bind_host=config.bind_host)  # outermost

    app.include_router(health.router)
    app.include_router(pages.router)
    app.include_router(api.router)
    app.include_router(metrics.router)
    app.include_router(ws.router)
    app.include_router(watch.router)
    # /static/vendor/* is routed before the /static mount so that it serves only the pinned htmx files.
    app.include_router(vendor.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


app = create_app()
