"""Install ArcticInference's suffix decoding, and only it, into vLLM's virtual environment.

    ~/.cache/decoding-playground/vllm/venv/bin/python scripts/build_arctic_suffix.py DOWNLOAD_DIR

vLLM's `"method": "suffix"` imports `arctic_inference.suffix_decoding.SuffixDecodingCache` (its Python
wrapper over a C++ `SuffixTree` bound with nanobind) and refuses to start without it ("Install via
`pip install arctic-inference==0.1.1`"). PyPI has only a source archive of that version, whose build wants
torch 2.7.0, grpc code generation and CUDA-minded options, and which registers a vLLM plugin
(entry point `vllm.general_plugins`) written for vLLM 0.9 that patches vLLM's classes when loaded. This script
takes that same archive (pinned by version and hash) and builds a wheel of the three files and the one C++
extension suffix decoding needs: no torch, no plugin entry point. The wheel is named
`arctic-inference==0.1.1+suffix` so that `pip list` says what it is.

Resumable and offline once done: the archive and the wheel stay in DOWNLOAD_DIR; a second run reinstalls the
wheel it built. Build needs a C++20 compiler; scikit-build-core fetches CMake from PyPI where the system's
is missing or too old.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST = "arctic_inference-0.1.1.tar.gz"
SDIST_SHA256 = "36857e2fbe3ead34821a04be98dfab95086050c1e38199c8fdfe308234fdcf63"
ROOT = "arctic_inference-0.1.1/"
MEMBERS = ("arctic_inference/__init__.py", "arctic_inference/suffix_decoding/__init__.py",
           "arctic_inference/suffix_decoding/cache.py", "csrc/suffix_decoding/CMakeLists.txt",
           "csrc/suffix_decoding/bindings.cc", "csrc/suffix_decoding/suffix_tree.cc",
           "csrc/suffix_decoding/suffix_tree.h", "csrc/suffix_decoding/int32_map.h", "LICENSE")
WHEEL_VERSION = "0.1.1+suffix"

PYPROJECT = f"""\
[build-system]
requires = ["scikit-build-core==1.1.2", "nanobind==2.9.2"]
build-backend = "scikit_build_core.build"

[project]
name = "arctic-inference"
version = "{WHEEL_VERSION}"
description = "ArcticInference 0.1.1's suffix decoding only (SuffixDecodingCache and its C++ SuffixTree)"
license = {{text = "Apache-2.0"}}
dependencies = ["numpy"]

[tool.scikit-build]
wheel.packages = ["arctic_inference"]
cmake.build-type = "Release"
"""

# The archive's own CMakeLists builds the extension `_C`; this places it where cache.py imports it from.
CMAKELISTS = """\
cmake_minimum_required(VERSION 3.18)
project(arctic_inference_suffix_decoding LANGUAGES CXX)
add_subdirectory(csrc/suffix_decoding)
install(TARGETS _C LIBRARY DESTINATION arctic_inference/suffix_decoding)
"""


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def fetch_sdist(folder: Path) -> Path:
    """The source archive from PyPI, downloaded once and checked against its pinned hash. pip reads its
    metadata by running its setup.py, which imports torch: without build isolation, vLLM's torch does."""
    sdist = folder / SDIST
    if not sdist.is_file():
        pip("download", "--no-deps", "--no-build-isolation", "--no-binary", ":all:", "-d", str(folder),
            "arctic-inference==0.1.1")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        sdist.unlink()
        raise SystemExit(f"{sdist}: sha256 {digest}, expected {SDIST_SHA256} (removed; run again)")
    return sdist


def source_tree(sdist: Path, into: Path) -> Path:
    """The members suffix decoding needs, with a build description of their own."""
    with tarfile.open(sdist) as archive:
        for name in MEMBERS:
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.extractfile(ROOT + name).read())
    (into / "pyproject.toml").write_text(PYPROJECT)
    (into / "CMakeLists.txt").write_text(CMAKELISTS)
    return into


def main(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    wheels = folder / "wheels"
    pattern = f"arctic_inference-{WHEEL_VERSION}-cp{sys.version_info.major}{sys.version_info.minor}-*.whl"
    built = sorted(wheels.glob(pattern))                # this Python's: a venv made anew may have another
    if not built:
        sdist = fetch_sdist(folder)
        with tempfile.TemporaryDirectory(prefix="arctic-suffix-") as tmp:
            pip("wheel", "--no-deps", "-w", str(wheels), str(source_tree(sdist, Path(tmp))))
        built = sorted(wheels.glob(pattern))
    pip("install", "--no-deps", "--force-reinstall", str(built[-1]))
    subprocess.run([sys.executable, "-c", "from arctic_inference.suffix_decoding import SuffixDecodingCache"],
                   check=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
