"""`bench engines`' thread part: ours, llama.cpp and Hugging Face transformers on SmolLM2 at 1 .. N threads.

Each engine as a user runs it, the same prompts (chat, greedy), every engine and thread count in turn within
each repeat, so that a shared machine's noise hits all alike:
- ours: a fresh `generate --threads N --json` process (its weight products on N threads, engine/model/threads.py);
- llama.cpp (xllamacpp, Q4_1): a server per thread count (`n_threads` = N), a chat request each run;
- transformers (float32, the same converted checkpoint): a worker process per thread count in its own virtual
  environment (`make transformers`: torch and transformers are not project dependencies; cli/bench/hf_worker.py),
  `torch.set_num_threads(N)`, fed our chat template's token ids. Benchmark only: the page never runs it.
Decode speed is 1 / time per token after the first, each engine's own way of seeing its tokens (ours: the
summary's TPOT; llama.cpp: chunk arrivals; transformers: one stamp per generated token). vLLM's CPU build
races in its own part when installed (another section of `bench engines`).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from cli.bench.smollm2_threads import cpu_seconds, generate_tokens_per_s, others_cores
from engine.external.llamacpp_server import EmbeddedLlamaCpp, gguf_path, unavailable_reason
from engine.model.fetched import cache_dir, model_dir

NAME = "smollm2-135m"
TRANSFORMERS_ENV = "DECODING_PLAYGROUND_TRANSFORMERS_VENV"
WORKER = Path(__file__).resolve().with_name("hf_worker.py")


def transformers_venv() -> Path:
    """Where `make transformers` installs torch and transformers ($DECODING_PLAYGROUND_TRANSFORMERS_VENV overrides)."""
    return Path(os.environ.get(TRANSFORMERS_ENV) or cache_dir() / "transformers" / "venv")


class TransformersWorker:
    """cli/bench/hf_worker.py in the transformers environment, at a fixed thread count."""

    def __init__(self, threads: int, venv: Path | None = None):
        python = (venv or transformers_venv()) / "bin" / "python"
        if not python.is_file():
            raise FileNotFoundError(f"no transformers environment at {python.parent.parent} (make transformers)")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "OMP_", "MKL_"))}
        env.update(OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.proc = subprocess.Popen([str(python), str(WORKER), str(model_dir(NAME)), str(threads)], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the transformers worker ended (exit {self.proc.wait()})")
        return json.loads(line)

    def generate(self, input_ids: list[int], max_new_tokens: int, eos_token_id: int | None) -> dict:
        self.proc.stdin.write(json.dumps({"input_ids": input_ids, "max_new_tokens": max_new_tokens,
                                          "eos_token_id": eos_token_id}) + "\n")
        self.proc.stdin.flush()
        r = self._read()
        steps = r["step_s"]
        return {"tokens_per_s": len(steps) / sum(steps) if steps else None, "ids": r["ids"], "ttft_ms": r["ttft_ms"]}

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def ours(threads: int, prompt: str, max_tokens: int) -> dict:
    return generate_tokens_per_s(threads, prompt, max_tokens)


def run_threads(counts, repeats: int, prompt: str, max_tokens: int, lm, llamacpp_chat,
                with_transformers: bool = True) -> dict:
    """Decode tokens/s per engine and thread count (medians of `repeats`), and what was left out and why.
    `llamacpp_chat(server, max_tokens, prompt)`: bench engines' llama.cpp run."""
    counts = sorted(set(counts) | {1})
    skipped, engines = {}, {"ours": {}}
    reason = unavailable_reason(gguf_path())
    servers = {} if reason else {t: EmbeddedLlamaCpp.start(gguf_path(), threads=t, parallel=1) for t in counts}
    if reason:
        skipped["llama.cpp"] = reason
    workers = {}
    if with_transformers:
        try:
            workers = {t: TransformersWorker(t) for t in counts}
        except (FileNotFoundError, RuntimeError) as e:
            skipped["transformers"] = str(e)
    tok = lm.tokenizer
    ids = tok.encode(tok.chat_template.prompt(prompt))
    eos = lm.cfg.eos_token_id
    runs: dict = {}
    start, t0 = cpu_seconds(), time.perf_counter()
    try:
        for s in servers.values():
            llamacpp_chat(s, 8, prompt)                                    # warm-up: first-call costs
        for w in workers.values():
            w.generate(ids, 8, eos)
        for _ in range(repeats):
            for t in counts:
                runs.setdefault(("ours", t), []).append(ours(t, prompt, max_tokens))
                if t in servers:
                    runs.setdefault(("llama.cpp", t), []).append(llamacpp_chat(servers[t], max_tokens, prompt))
                if t in workers:
                    runs.setdefault(("transformers", t), []).append(workers[t].generate(ids, max_tokens, eos))
    finally:
        for s in servers.values():
            s.close()
        for w in workers.values():
            w.close()
    others = others_cores(start, cpu_seconds(), time.perf_counter() - t0)
    for (engine, t), v in runs.items():
        engines.setdefault(engine, {})[t] = statistics.median(x["tokens_per_s"] for x in v)
    ours_text = runs[("ours", 1)][0]["text"]
    same = {t: tok.decode(runs[("transformers", t)][0]["ids"]).replace("<|im_end|>", "") in ours_text
            for t in counts if ("transformers", t) in runs}
    info = next(iter(workers.values())).info if workers else None
    return {"counts": counts, "repeats": repeats, "tokens_per_s": engines, "skipped": skipped,
            "transformers": info, "transformers_same_text": same, "others_cores": others,
            "loadavg": os.getloadavg()[0]}


def markdown(r: dict) -> list[str]:
    counts, tps = r["counts"], r["tokens_per_s"]
    lines = ["", f"At equal threads (engine/model/threads.py for ours; `bench engines --threads {max(counts)}`): "
             f"decode tokens/s, medians of {r['repeats']} interleaved runs, chat, greedy. Other processes kept "
             f"{r['others_cores']:.2f} cores busy meanwhile (load average {r['loadavg']:.1f}): on 2 cores, 2-thread "
             "figures mean little unless that is near 0.", "",
             "| engine | " + " | ".join(f"{t} thread{'s' * (t > 1)}" for t in counts) + " | ours / it at "
             f"{max(counts)} |", "|---|" + "---|" * (len(counts) + 1)]
    top = max(counts)
    labels = {"ours": "ours (numpy, float32)", "llama.cpp": "llama.cpp (Q4_1)",
              "transformers": "transformers (torch, float32)"}
    for engine, by in tps.items():
        cells = " | ".join(f"{by[t]:.1f}" if t in by else "–" for t in counts)
        ratio = f"{tps['ours'][top] / by[top]:.2f}x" if engine != "ours" and top in by and top in tps["ours"] else ""
        lines.append(f"| {labels.get(engine, engine)} | {cells} | {ratio} |")
    if r["transformers"]:
        i = r["transformers"]
        same = ", ".join(f"{t}: {'yes' if v else 'no'}" for t, v in r["transformers_same_text"].items())
        lines += ["", f"transformers {i['transformers']}, torch {i['torch']} (`make transformers`); its greedy text "
                  f"a prefix of ours: {same}."]
    for engine, why in r["skipped"].items():
        lines += ["", f"{engine}: not measured ({why})."]
    return lines
