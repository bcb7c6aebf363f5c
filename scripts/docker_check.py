"""`make docker-check`: the Dockerfile built and its image started here, without a Docker daemon or registry.

1. Local stand-ins for the base images from Debian's packages (scripts/docker_bases.py), cached.
2. `podman build` of the project's own Dockerfile, with --build-arg pointing at them.
3. The image inspected: fails if it runs as root, has no HEALTHCHECK, or its CMD is not exec form; or if
   its files hold test packages, pip or npm caches, more of node_modules than the two files served, or
   the sources (tests, docs, scripts, the packages' source folders) next to the installed app.
4. The image's own ENTRYPOINT/CMD started as its own user, in its own filesystem (a podman container's
   writable root, unshare --root), with its environment and working directory, as PID 1 of new PID, mount,
   network, IPC and UTS namespaces: the network namespace has only loopback, as a container without
   published ports. /healthz, / and an /api/ws generation are checked from outside (scripts/docker_probe.py,
   nsenter into that network namespace); the image's HEALTHCHECK command is run inside it, as
   `docker exec` would; then SIGTERM, as `docker stop`, must stop it within 10 s with exit code 0.
5. With SmolLM2 fetched on this machine, the same again for an image built with it (SMOLLM2=1)
   and a generation with it.

Not covered (no daemon here): a real runtime's cgroups and resource limits, seccomp and capabilities
profiles, and its networking (bridge, published ports, DNS).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import docker_bases
from docker_bases import BASES

REPO = Path(__file__).resolve().parent.parent
IMAGE = "localhost/decoding-playground:check"
SMOLLM2 = "smollm2-135m"
SMOLLM2_CONTEXT = REPO / "docker-models" / SMOLLM2     # where the Dockerfile takes it from (SMOLLM2=1)
STOP_TIMEOUT_S = 10.0                              # `docker stop`'s default before SIGKILL
# Run as PID 1 of the new namespaces (`sh -c SETUP root command...`): loopback up, then /proc, a minimal /dev
# and a fresh /tmp in the container's root, as a container runtime gives them; then exec the command.
SETUP = """set -e
ip link set lo up
root=$1; shift
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t tmpfs -o nosuid,mode=755 dev "$root/dev"
for d in null zero full random urandom tty; do touch "$root/dev/$d"; mount --bind "/dev/$d" "$root/dev/$d"; done
mkdir "$root/dev/shm" && mount -t tmpfs -o nosuid,nodev,mode=1777 shm "$root/dev/shm"
mount -t tmpfs -o nosuid,nodev,mode=1777 tmp "$root/tmp"
exec "$@"
"""


def say(text: str) -> None:
    print(f"docker-check: {text}", flush=True)


class Timings:
    def __init__(self):
        self.rows: list[tuple[str, float]] = []

    @contextmanager
    def step(self, name: str):
        say(f"{name} ...")
        t0 = time.monotonic()
        yield
        self.rows.append((name, time.monotonic() - t0))
        say(f"{name}: {self.rows[-1][1]:.1f} s")

    def table(self) -> str:
        total = sum(s for _, s in self.rows)
        return "\n".join([f"  {name:<44} {s:7.1f} s" for name, s in self.rows] + [f"  {'total':<44} {total:7.1f} s"])


def podman(*args: str, **kw) -> str:
    return subprocess.run(["podman", *args], check=True, capture_output=True, text=True, **kw).stdout.strip()


def build(image: str, logs: Path, build_args: dict[str, str]) -> None:
    cmd = ["podman", "build", "--isolation=chroot", "--cgroup-manager=cgroupfs", "--format=docker",
           *(a for k, v in build_args.items() for a in ("--build-arg", f"{k}={v}")), "-t", image, str(REPO)]
    log = logs / f"build-{image.rsplit(':', 1)[-1]}.log"
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    if done.returncode:
        print(log.read_text()[-6000:], file=sys.stderr)
        raise SystemExit(f"docker-check: FAIL podman build (exit {done.returncode}); full log: {log}")


def passwd_entry(root: Path, user: str) -> tuple[int, int, str]:
    """uid, gid and home of `user` (a name, a uid, or user:group) in the image's own /etc/passwd."""
    name, _, group = user.partition(":")
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if len(fields) >= 6 and name in (fields[0], fields[2]):
            uid, gid, home = int(fields[2]), int(fields[3]), fields[5]
            break
    else:
        if not name.isdigit():
            raise SystemExit(f"docker-check: FAIL the image's user {name!r} is not in its /etc/passwd")
        uid, gid, home = int(name), int(name), "/"
    if group:
        entries = [g.split(":") for g in (root / "etc/group").read_text().splitlines()]
        gid = int(group) if group.isdigit() else next(int(g[2]) for g in entries if g[0] == group)
    return uid, gid, home


def healthcheck(info: dict) -> dict:
    """The image's HEALTHCHECK: Docker keeps it in the config, podman's inspect also at the top level."""
    return info["Config"].get("Healthcheck") or info.get("Healthcheck") or {}


def inspect(image: str, root: Path) -> dict:
    """The image's config; fails on a root user, a missing HEALTHCHECK or a shell-form CMD."""
    info = json.loads(podman("image", "inspect", image))[0]
    config = info["Config"]
    user = config.get("User") or "root"
    problems = []
    if passwd_entry(root, user)[0] == 0:
        problems.append(f"runs as root (USER {user!r})")
    health = healthcheck(info)
    if not health.get("Test") or health["Test"][0] == "NONE":
        problems.append("has no HEALTHCHECK")
    command = (config.get("Entrypoint") or []) + (config.get("Cmd") or [])
    if not command or command[:2] == ["/bin/sh", "-c"]:
        problems.append(f"CMD is not exec form: {command}")
    if problems:
        raise SystemExit(f"docker-check: FAIL the image {'; '.join(problems)}")
    say(f"inspected: USER {user}, HEALTHCHECK {health['Test']}, CMD {command}, "
        f"WORKDIR {config.get('WorkingDir') or '/'}, {info['Size'] / 1e6:.0f} MB")
    return info


TEST_PACKAGES = ("pytest", "_pytest", "hypothesis", "playwright")


def check_lean(root: Path, workdir: str) -> None:
    """No test packages, pip or npm caches, and of node_modules only the two files the app serves."""
    found = [str(p.relative_to(root)) for top in ("usr", "opt") for name in TEST_PACKAGES
             for p in (root / top).glob(f"**/site-packages/{name}")]
    found += [str(p.relative_to(root)) for p in (root / "root/.cache", root / "root/.npm", root / "tmp")
              if p.is_dir() and any(p.iterdir())]
    app = root / workdir.lstrip("/")
    vendored = sorted(str(p.relative_to(app)) for p in (app / "node_modules").rglob("*") if p.is_file())
    if vendored != ["node_modules/htmx-ext-ws/dist/ws.js", "node_modules/htmx.org/dist/htmx.min.js"]:
        found.append(f"node_modules has {len(vendored)} files: {vendored[:5]}")
    found += [d for d in ("tests", "docs", "scripts", "app", "engine", ".git") if (app / d).exists()]
    if found:
        raise SystemExit(f"docker-check: FAIL the runtime stage is not lean: {found}")
    say(f"lean: no {', '.join(TEST_PACKAGES)}, no caches, node_modules holds only {', '.join(vendored)}")


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def exec_env(root: Path, config: dict, home: str) -> dict[str, str]:
    env = dict(e.split("=", 1) for e in config.get("Env") or [])
    env.setdefault("HOME", home if (root / home.lstrip("/")).is_dir() else "/")
    env.setdefault("HOSTNAME", "docker-check")
    return env


def start_and_probe(image: str, info: dict, root: Path, logs: Path, models: list[str]) -> None:
    config = info["Config"]
    uid, gid, home = passwd_entry(root, config.get("User") or "root")
    env = exec_env(root, config, home)
    workdir = config.get("WorkingDir") or "/"
    command = (config.get("Entrypoint") or []) + config["Cmd"]
    port = int(next(iter(config.get("ExposedPorts") or {"8000/tcp": {}})).split("/")[0])
    in_container = ["unshare", f"--root={root}", f"--wd={workdir}", f"--setgid={gid}", f"--setuid={uid}", "--"]
    log = logs / f"server-{image.rsplit(':', 1)[-1]}.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            ["unshare", "--mount", "--propagation=private", "--net", "--pid", "--fork", "--ipc", "--uts",
             "sh", "-c", SETUP, "setup", str(root), "env", "-i", *(f"{k}={v}" for k, v in env.items()),
             *in_container, *command], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not (pid1 := children(server.pid)) and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if not pid1:
            raise SystemExit(f"docker-check: FAIL the image's command did not start:\n{log.read_text()[-3000:]}")
        pid1 = pid1[0]
        say(f"started {command} as uid {uid} gid {gid} in {workdir}, PID 1 of its namespaces (here {pid1})")
        probe = subprocess.run(["nsenter", f"--target={server.pid}", "--net", "--", sys.executable,
                                str(REPO / "scripts/docker_probe.py"), f"http://127.0.0.1:{port}",
                                *(a for m in models for a in ("--model", m))])
        if probe.returncode:
            state = "running" if server.poll() is None else f"exited with {server.returncode}"
            raise SystemExit(f"docker-check: FAIL the probe; the server ({state}), its log:\n{log.read_text()[-4000:]}")
        test = healthcheck(info)["Test"]
        argv = test[1:] if test[0] == "CMD" else ["/bin/sh", "-c", test[1]]
        checked = subprocess.run([shutil.which("nsenter"), f"--target={pid1}", "--mount", "--net", "--pid", "--ipc", "--uts",
                                  "--root", "--wd", f"--setgid={gid}", f"--setuid={uid}", "--", *argv],
                                 env=env, capture_output=True, text=True, timeout=30)
        if checked.returncode:
            raise SystemExit(f"docker-check: FAIL the image's HEALTHCHECK exited {checked.returncode}: "
                             f"{checked.stdout}{checked.stderr}")
        say("ok   the image's own HEALTHCHECK command, run inside it: exit 0")
        t0 = time.monotonic()
        os.kill(pid1, signal.SIGTERM)
        try:
            code = server.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"docker-check: FAIL still running {STOP_TIMEOUT_S:.0f} s after SIGTERM "
                             "(docker stop would SIGKILL it)") from None
        if code:
            raise SystemExit(f"docker-check: FAIL exit code {code} after SIGTERM:\n{log.read_text()[-3000:]}")
        say(f"ok   stopped by SIGTERM in {time.monotonic() - t0:.1f} s, exit code 0 "
            f"({len(log.read_text().splitlines())} log lines in {log})")
    finally:
        if server.poll() is None:
            for pid in children(server.pid):
                os.kill(pid, signal.SIGKILL)       # PID 1: the kernel ends its namespace with it
            server.wait(timeout=10)


@contextmanager
def container_root(image: str):
    """A container's writable root filesystem (podman create + mount; nothing is run by podman)."""
    name = podman("create", "--name", f"decoding-playground-check-{os.getpid()}", image)
    try:
        yield Path(podman("mount", name))
    finally:
        subprocess.run(["podman", "umount", name], capture_output=True)
        subprocess.run(["podman", "rm", "--force", name], capture_output=True)


@contextmanager
def staged_smollm2(source: Path):
    """The converted checkpoint in docker-models/: hard links where the file system allows, else a copy;
    removed again after the build. One the builder put there is used as it is, and left."""
    if SMOLLM2_CONTEXT.exists():
        say(f"using the SmolLM2 checkpoint already in {SMOLLM2_CONTEXT}")
        yield
        return
    if subprocess.run(["cp", "-al", str(source), str(SMOLLM2_CONTEXT)], capture_output=True).returncode:
        shutil.copytree(source, SMOLLM2_CONTEXT)
    try:
        yield
    finally:
        shutil.rmtree(SMOLLM2_CONTEXT, ignore_errors=True)


def image_id(image: str) -> str | None:
    done = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def check_image(timings: Timings, image: str, build_args: dict, logs: Path, models: list[str]) -> dict:
    label = image.rsplit(":", 1)[-1]
    previous = image_id(image)
    with timings.step(f"build {label}"):
        build(image, logs, build_args)
    if previous and previous != image_id(image):
        # the last run's image, with the layers only it used (podman removes untagged parents with it):
        # podman's storage grows by what changed, not by a whole image per run
        subprocess.run(["podman", "rmi", previous], capture_output=True)
    with container_root(image) as root:
        with timings.step(f"inspect {label}"):
            info = inspect(image, root)
            check_lean(root, info["Config"].get("WorkingDir") or "/")
        with timings.step(f"start, probe, stop {label}"):
            start_and_probe(image, info, root, logs, models)
    return info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", type=Path, required=True, help="the bases' tars and debs, and logs")
    parser.add_argument("--smollm2-dir", type=Path, help="a converted SmolLM2 checkpoint to build in, if fetched")
    args = parser.parse_args(argv)
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    timings = Timings()

    mirror = docker_bases.apt_mirror()
    build_args = {}
    with timings.step("base debian"):
        say(f"{docker_bases.DEBIAN_IMAGE} (from {docker_bases.ensure_debian(args.cache_dir, mirror)})")
    for base in BASES:
        with timings.step(f"base {base.name}"):
            source = docker_bases.ensure(base, args.cache_dir, mirror)
            say(f"{base.build_arg}={base.image} (from {source})")
        build_args[base.build_arg] = base.image

    sizes = {}
    info = check_image(timings, IMAGE, build_args, logs, [])
    sizes[IMAGE] = info["Size"]
    if args.smollm2_dir and (args.smollm2_dir / "fetched.json").is_file():
        with staged_smollm2(args.smollm2_dir):
            info = check_image(timings, f"{IMAGE}-smollm2", {**build_args, "SMOLLM2": "1"}, logs, [SMOLLM2])
        sizes[f"{IMAGE}-smollm2"] = info["Size"]
    else:
        say(f"!!! SmolLM2 not fetched here ({args.smollm2_dir}): the image with SmolLM2 is NOT checked !!!")

    python_base = json.loads(podman("image", "inspect", build_args["PYTHON_IMAGE"]))[0]["Size"]
    for image, size in sizes.items():
        say(f"size of {image}: {size / 1e6:.0f} MB ({(size - python_base) / 1e6:.0f} MB on top of the "
            f"{python_base / 1e6:.0f} MB Python base)")
    say(f"timings\n{timings.table()}")
    say("PASSED: the image builds, runs as its own non-root user, serves the page and generates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
