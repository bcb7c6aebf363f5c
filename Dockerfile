# syntax=docker/dockerfile:1
# Decoding Playground: one server process (sessions live in it), non-root, listening on 0.0.0.0:8000.
#   docker build -t decoding-playground .
#   docker run --rm -p 8000:8000 decoding-playground
#   docker run --rm -p 8000:8000 -e DECODING_PLAYGROUND_TOKEN=some-shared-secret \
#              -e DECODING_PLAYGROUND_MAX_SESSIONS=32 decoding-playground        # a workshop room
# Configuration is read from DECODING_PLAYGROUND_* variables (app/config.py); the websocket Origin check is
# always on (the page's own origin, plus DECODING_PLAYGROUND_ALLOWED_ORIGINS).

# --- front-end packages, exactly as pinned in package-lock.json --------------------------------------------
FROM node:20-slim AS frontend
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund

# --- runtime: slim Python, the app, the shipped models ----------------------------------------------------
FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OPENBLAS_NUM_THREADS=1 \
    OMP_NUM_THREADS=1 \
    DECODING_PLAYGROUND_HOME=/app \
    DECODING_PLAYGROUND_CACHE=/app/cache
WORKDIR /app

COPY . .
RUN pip install . && rm -rf build *.egg-info
# Only the two files the app serves (app/paths.py VENDOR_FILES), at the paths it serves them from.
COPY --from=frontend /src/node_modules/htmx.org/dist/htmx.min.js node_modules/htmx.org/dist/htmx.min.js
COPY --from=frontend /src/node_modules/htmx-ext-ws/dist/ws.js node_modules/htmx-ext-ws/dist/ws.js

RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin playground
USER playground

EXPOSE 8000
# Python, not curl (slim images have none); /healthz stays open in workshop (token) mode.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"]
# Exec form: uvicorn gets SIGTERM directly and frees every session's blocks on the way out.
CMD ["decoding-playground", "serve", "--host", "0.0.0.0", "--port", "8000", "--log-format", "json"]
