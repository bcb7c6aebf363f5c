# syntax=docker/dockerfile:1
# Decoding Playground: one server process (sessions live in it), non-root, listening on 0.0.0.0:8000.
#   docker build -t decoding-playground .
#   docker run --rm -p 8000:8000 decoding-playground
#   docker run --rm -p 8000:8000 -e DECODING_PLAYGROUND_TOKEN=some-shared-secret \
#              -e DECODING_PLAYGROUND_MAX_SESSIONS=32 decoding-playground        # a workshop room
# Configuration is read from DECODING_PLAYGROUND_* variables (app/config.py); the websocket Origin check is
# always on (the page's own origin, plus DECODING_PLAYGROUND_ALLOWED_ORIGINS).
#
# Build arguments:
#   NODE_IMAGE, PYTHON_IMAGE  the base images (Docker Hub's by default; `make docker-check` builds this file
#                             on local stand-ins made from Debian's packages, scripts/docker_bases.py)
#   SMOLLM2                   1: bake in the converted SmolLM2 checkpoint from docker-models/smollm2-135m
#                             (README: Docker); empty (the default): the image has no SmolLM2
ARG NODE_IMAGE=node:20-slim
ARG PYTHON_IMAGE=python:3.11-slim

# --- front-end packages, exactly as pinned in package-lock.json --------------------------------------------
FROM ${NODE_IMAGE} AS frontend
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund

# --- our code as one wheel: the runtime stage installs it without the sources or build tools ---------------
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app app
COPY cli cli
COPY engine engine
RUN pip wheel --no-deps --wheel-dir /wheels .

# --- SmolLM2, only with SMOLLM2=1: the converted checkpoint the builder put in docker-models/ (README: Docker)
FROM ${PYTHON_IMAGE} AS smollm2
ARG SMOLLM2=
COPY docker-models /context
# chmod: checkpoints converted before 2026-12-01 have a 0600 model.safetensors, unreadable by the image's user
RUN mkdir -p /cache/models && if [ -n "$SMOLLM2" ]; then \
        test -f /context/smollm2-135m/fetched.json || \
            { echo "SMOLLM2=$SMOLLM2: no converted checkpoint in docker-models/smollm2-135m (README: Docker)" >&2; \
              exit 1; }; \
        mv /context/smollm2-135m /cache/models/smollm2-135m; \
    fi && chmod -R a+rX /cache

# --- runtime: slim Python, the installed app, its templates, static files and shipped models ---------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OPENBLAS_NUM_THREADS=1 \
    OMP_NUM_THREADS=1 \
    DECODING_PLAYGROUND_HOME=/app \
    DECODING_PLAYGROUND_CACHE=/app/cache
WORKDIR /app

COPY --from=wheel /wheels /tmp/wheels
RUN pip install /tmp/wheels/*.whl && rm -rf /tmp/wheels
COPY templates templates
COPY static static
COPY models models
# Only the two files the app serves (app/paths.py VENDOR_FILES), at the paths it serves them from.
COPY --from=frontend /src/node_modules/htmx.org/dist/htmx.min.js node_modules/htmx.org/dist/htmx.min.js
COPY --from=frontend /src/node_modules/htmx-ext-ws/dist/ws.js node_modules/htmx-ext-ws/dist/ws.js
COPY --from=smollm2 /cache cache

RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin playground
USER playground

EXPOSE 8000
# Python, not curl (slim images have none); /healthz stays open in workshop (token) mode.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"]
# Exec form: uvicorn gets SIGTERM directly and frees every session's blocks on the way out.
CMD ["decoding-playground", "serve", "--host", "0.0.0.0", "--port", "8000", "--log-format", "json"]
