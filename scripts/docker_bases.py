"""Local stand-ins for the Dockerfile's base images, made from Debian's packages (no registry needed).

    debian (minbase)  debootstrap --variant=minbase from the Debian mirror apt already uses, without docs,
                      man pages or locales (as Debian's slim images), saved as a tar and imported
    python:3.11-slim  ->  debian + python3.11, a venv at /opt/venv first on PATH (`python`, `pip`)
    node:20-slim      ->  debian + nodejs and npm
The two stand-ins are built FROM debian with podman (apt-get resolves their dependencies, which
debootstrap's --include does not for npm) and saved as tars too. They trust the certificate authorities this
machine adds to Debian's (/usr/local/share/ca-certificates), and pip and npm use that system store, so that
`pip install` and `npm ci` in the build reach their registries wherever this machine's own clients do. Later runs find them in podman's storage,
or load the cached tars; nothing is bootstrapped again until a recipe's version changes.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEBIAN_IMAGE = f"localhost/decoding-playground-base/debian:{SUITE}-1"
# dpkg leaves these out of every package installed later, as Debian's slim images do (copyright files stay)
DPKG_EXCLUDES = """path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
"""
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
SYSTEM_CA_FILE = "/etc/ssl/certs/ca-certificates.crt"
TRUST_LOCAL_CAS = (f"COPY local-ca/ {LOCAL_CA_DIR}/\n"
                   f"RUN printf '[global]\\ncert = {SYSTEM_CA_FILE}\\n' > /etc/pip.conf && "
                   f"echo 'cafile={SYSTEM_CA_FILE}' > /etc/npmrc")
APT_INSTALL = ("RUN apt-get update && apt-get install -y --no-install-recommends {} "
               "&& rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*")


@dataclass(frozen=True)
class Base:
    name: str
    build_arg: str                  # the Dockerfile's ARG it stands in for
    containerfile: str              # built FROM the debian minbase image
    version: int = 2                # bump when the recipe changes: the image and its cached tar are remade

    @property
    def image(self) -> str:
        return f"localhost/decoding-playground-base/{self.name}:{SUITE}-{self.version}"


BASES = (
    Base("python", "PYTHON_IMAGE", "\n".join([
        APT_INSTALL.format("python3.11 python3.11-venv ca-certificates"),
        "RUN python3.11 -m venv /opt/venv",
        "ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])),
    Base("node", "NODE_IMAGE", APT_INSTALL.format("nodejs npm ca-certificates")),
)


def apt_mirror(suite: str = SUITE, etc_apt: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt already uses for `suite` (sources.list and sources.list.d, both formats)."""
    files = [etc_apt / "sources.list", *sorted((etc_apt / "sources.list.d").glob("*.list")),
             *sorted((etc_apt / "sources.list.d").glob("*.sources"))]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        if f.suffix == ".sources":               # deb822 stanzas: Types / URIs / Suites / Components
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
                if "deb" in fields.get("Types", "").split() and suite in fields.get("Suites", "").split() \
                        and "main" in fields.get("Components", "").split() and fields.get("URIs"):
                    return fields["URIs"].split()[0]
        else:                                     # one line each: deb [options] URI suite components...
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 4 and words[0] == "deb" and words[2] == suite and "main" in words[3:]:
                    return words[1]
    return DEFAULT_MIRROR


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def image_exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image]).returncode == 0


def bootstrap_debian(tar: Path, cache_dir: Path, mirror: str) -> None:
    """debootstrap a minbase root filesystem, slim it, save it as `tar`."""
    debs = cache_dir / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="base-debian-", dir=cache_dir) as tmp:
        root = Path(tmp) / "root"
        log = cache_dir / "logs" / "debootstrap.log"
        with open(log, "w") as out:
            done = subprocess.run(["debootstrap", "--variant=minbase", f"--cache-dir={debs}", SUITE, str(root),
                                   mirror], stdout=out, stderr=subprocess.STDOUT)
        if done.returncode:
            raise RuntimeError(f"debootstrap failed ({mirror}); its log: {log}")
        for rel in ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"):
            shutil.rmtree(root / rel, ignore_errors=True)
        for rel in ("var/cache/apt", "var/lib/apt/lists", "var/cache/apt/archives"):    # the dirs apt needs stay
            for f in (root / rel).iterdir():
                if f.is_file():
                    f.unlink()
        (root / "etc/dpkg/dpkg.cfg.d/slim").write_text(DPKG_EXCLUDES)
        partial = tar.with_suffix(".partial")
        run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."])
        partial.rename(tar)                       # complete or absent: a killed run leaves no half tar


def ensure_debian(cache_dir: Path, mirror: str) -> str:
    if image_exists(DEBIAN_IMAGE):
        return "podman storage"
    tar = cache_dir / f"{DEBIAN_IMAGE.rsplit('/', 1)[-1].replace(':', '-')}.tar"
    source = f"cached {tar}"
    if not tar.exists():
        bootstrap_debian(tar, cache_dir, mirror)
        source = f"debootstrap from {mirror}"
    run(["podman", "import", "--quiet", "--change", f"ENV PATH={BASE_PATH}", str(tar), DEBIAN_IMAGE],
        stdout=subprocess.DEVNULL)
    return source


def ensure(base: Base, cache_dir: Path, mirror: str) -> str:
    """The base's image in podman's storage; returns where it came from (storage, cached tar, built)."""
    if image_exists(base.image):
        return "podman storage"
    tar = cache_dir / f"{base.image.rsplit('/', 1)[-1].replace(':', '-')}.tar"
    if tar.exists():
        run(["podman", "load", "--quiet", "--input", str(tar)], stdout=subprocess.DEVNULL)
        return f"cached {tar}"
    debian = ensure_debian(cache_dir, mirror)
    log = cache_dir / "logs" / f"base-{base.name}.log"
    with open(log, "w") as out, tempfile.TemporaryDirectory() as context:
        (Path(context) / "Containerfile").write_text(f"FROM {DEBIAN_IMAGE}\n{TRUST_LOCAL_CAS}\n{base.containerfile}\n")
        (Path(context) / "local-ca").mkdir()
        if LOCAL_CA_DIR.is_dir():
            shutil.copytree(LOCAL_CA_DIR, Path(context) / "local-ca", dirs_exist_ok=True)
        done = subprocess.run(["podman", "build", "--isolation=chroot", "--cgroup-manager=cgroupfs",
                               "-t", base.image, context], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"building the {base.name} base failed; its log: {log}")
    partial = tar.with_suffix(".partial")
    run(["podman", "save", "--quiet", "--output", str(partial), base.image])
    partial.rename(tar)
    return f"built FROM {DEBIAN_IMAGE} (from {debian}) with apt-get"
