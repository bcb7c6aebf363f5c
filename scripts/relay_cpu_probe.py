"""What relaying vLLM through the page costs in CPU: our server's, and vLLM's API server's, per output token.

    python scripts/relay_cpu_probe.py [--sessions 1,4,16] [--repeats 3] [--max-tokens 128] [--py-spy BIN]

Starts `decoding-playground serve --vllm --vllm-variants plain` (no llama.cpp) as `bench serve --engine vllm`
does, then at each concurrency runs, alternated, `--repeats` times: N `/api/ws` clients on vLLM through the
page, and the same N requests straight to vLLM's port. Around each it reads the CPU seconds (user + system,
/proc/PID/stat) of our server's process and of vLLM's processes (its API server, its engine core), and
prints them per output token: CPU time is far less sensitive than wall time to what else runs on the machine.
With `--py-spy BIN`, the page runs are sampled (py-spy record, raw collapsed stacks) into
/tmp/relay-profile-N-REPEAT.txt (N: the sessions). Nothing here asserts: it measures.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.bench.serve import direct  # noqa: E402
from cli.bench.served import Server, many, wait_until_loaded  # noqa: E402
from engine.external.vllm_server import VARIANTS, free_port  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int, system_only: bool = False) -> float:
    """utime + stime (or stime alone: the kernel's part) of one process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[12]) + (0 if system_only else int(fields[11]))) / TICKS


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def vllm_processes(server_pid: int) -> dict[str, int]:
    """vLLM's API server (our server's child) and its engine core (the API server's child)."""
    out = {}
    for api in children(server_pid):
        out["vllm api"] = api
        for core in children(api):
            out["vllm core"] = core
    return out


def wait_ready(base: str) -> None:
    """`wait_until_loaded` for vLLM, patient with a server too busy to answer /api/models within its 5 s (a loaded machine)."""
    deadline = time.monotonic() + 900
    while True:
        try:
            wait_until_loaded(base, VARIANTS["plain"].label, 900)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2.0)


def measured(pids: dict[str, int], run) -> tuple[dict, dict]:
    def now() -> dict:
        return {**{k: cpu_s(p) for k, p in pids.items()}, "ours (kernel)": cpu_s(pids["ours"], system_only=True)}
    before = now()
    t0 = time.perf_counter()
    result = run()
    wall = time.perf_counter() - t0
    return result, {"wall_s": wall, **{k: v - before[k] for k, v in now().items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--py-spy", default=None, help="py-spy's binary: profile the page runs")
    args = ap.parse_args()
    sessions = [int(x) for x in args.sessions.split(",")]
    port, key = free_port(), secrets.token_urlsafe(24)
    os.environ["DECODING_PLAYGROUND_VLLM_API_KEY"] = key
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    settings = {"model": VARIANTS["plain"].label, "max_tokens": args.max_tokens}
    n_max = max(sessions)
    with Server("--vllm", "--vllm-variants", "plain", "--vllm-port", str(port), "--no-llamacpp", "--max-sessions",
                str(n_max), "--max-queue", str(n_max), start_timeout_s=120.0) as srv:
        wait_ready(srv.base)
        pids = {"ours": srv.proc.pid, **vllm_processes(srv.proc.pid)}
        print("processes:", pids, "load:", os.getloadavg(), flush=True)
        ws_base = srv.base.replace("http://", "ws://")
        asyncio.run(many(ws_base, 1, {**settings, "max_tokens": 8}))
        for n in sessions:
            rows = {"page": [], "direct": []}
            for _ in range(args.repeats):
                spy = None
                if args.py_spy:
                    spy = subprocess.Popen([args.py_spy, "record", "-p", str(srv.proc.pid), "-r", "200", "-f", "raw",
                                            "-o", f"/tmp/relay-profile-{n}-{len(rows['page'])}.txt", "--nonblocking"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(1.0)
                r, cpu = measured(pids, lambda: asyncio.run(many(ws_base, n, settings)))
                if spy is not None:
                    spy.send_signal(2)
                    spy.wait(30)
                rows["page"].append((r, cpu))
                r, cpu = measured(pids, lambda: asyncio.run(direct(url, key, n, args.max_tokens)))
                rows["direct"].append((r, cpu))
            for name, got in rows.items():
                tokens = sum(r["output_tokens"] for r, _ in got)
                errors = sum(r["errors"] for r, _ in got)
                per = {k: sum(c[k] for _, c in got) / tokens * 1e3 for k in got[0][1] if k != "wall_s"}
                tps = sorted(r["tokens_per_s"] or 0 for r, _ in got)[len(got) // 2]
                ttft = sorted(r["ttft_s"]["p50"] or 0 for r, _ in got)[len(got) // 2]
                print(f"N={n:2d} {name:6s} tokens={tokens:5d} errors={errors} tok/s(median)={tps:6.1f} "
                      f"ttft p50={ttft * 1e3:6.0f} ms  CPU ms/token: "
                      + "  ".join(f"{k}={v:.3f}" for k, v in per.items())
                      + f"  load={os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
