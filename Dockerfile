# syntax=docker/dockerfile:1

# Front-end packages, exactly as pinned in package-lock.json.
FROM node:20-slim AS frontend
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund

FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OPENBLAS_NUM_THREADS=1 \
    DECODING_PLAYGROUND_HOME=/app
WORKDIR /app

COPY . .
RUN pip install . && rm -rf build *.egg-info
# Only the two files the app serves (app/paths.py VENDOR_FILES), at the paths it serves them from.
COPY --from=frontend /src/node_modules/htmx.org/dist/htmx.min.js node_modules/htmx.org/dist/htmx.min.js
COPY --from=frontend /src/node_modules/htmx-ext-ws/dist/ws.js node_modules/htmx-ext-ws/dist/ws.js

RUN useradd --system --uid 10001 --no-create-home playground
USER playground

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"]
# One process per container: sessions live in it.
CMD ["decoding-playground", "serve", "--host", "0.0.0.0", "--port", "8000"]
