"""`decoding-playground bench engines`: our numpy engine against llama.cpp, Hugging Face transformers and vLLM on the
same SmolLM2-135M weights at 1 .. N threads (vLLM's part: cli/bench/vllm_engines.py). Each engine as a user runs it,
a fresh chat generation each time, greedy, every engine and count taking turns: ours fresh `generate --threads T`
processes, llama.cpp a server per count, transformers a worker per count in its own virtual environment (`make
transformers`; cli/bench/hf_worker.py). Decode speed is 1 / time per token after the first, as each engine sees its
tokens; bytes per token against one thread's streaming bandwidth give the GB/s each reaches.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

import numpy as np

from cli.bench.lib import add_bench, machine, paired_rates, shown, table, take_turns, timer
from cli.bench.smollm2 import GENERATE_PROMPT as PROMPT
from cli.bench.smollm2 import NAME, generate_tokens_per_s
from cli.bench.vllm_engines import chat_summary, run_vllm
from cli.bench.vllm_engines import tables as vllm_tables
from engine.external.llamacpp_server import NGRAM, EmbeddedLlamaCpp, gguf_path, unavailable_reason
from engine.model.fetched import cache_dir, fetched_models, is_fetched, model_dir
from engine.model.thread_choice import request_threads
from engine.serving.registry import ModelRegistry

MAX_TOKENS = 64
# where speculation by n-gram lookup can pay: an answer that copies its prompt
COPY_PROMPT = ("Repeat this list exactly, one item a line: apples, bread, butter, cheese, eggs, flour, "
               "honey, milk, oats, pasta, rice, salt, sugar, tea, tomatoes, yoghurt.")
OURS_NGRAM = {"method": "ngram", "num_speculative_tokens": NGRAM[1], "prompt_lookup_min": NGRAM[0],
              "prompt_lookup_max": NGRAM[0]}
TRANSFORMERS_ENV = "DECODING_PLAYGROUND_TRANSFORMERS_VENV"
WORKER = Path(__file__).resolve().with_name("hf_worker.py")
LABELS = {"ours": "ours (numpy, float32)", "llama.cpp": "llama.cpp (xllamacpp, Q4_1)",
          "transformers": "transformers (torch, float32)"}


def streaming_bandwidth(repeats: int = 5) -> float:
    """Bytes per second one thread reads (median of `repeats`; numpy's own sum reads at about half that speed)."""
    a = np.ones(64 * 1024 * 1024, dtype=np.float32)
    return a.nbytes / statistics.median(timer(lambda: np.dot(a, a), repeats, warm=1)()) * 1e3


def llamacpp(server: EmbeddedLlamaCpp, max_tokens: int, prompt: str = PROMPT) -> dict:
    s = chat_summary(server.engine, prompt, max_tokens)
    return {"tokens_per_s": 1e3 / s["itl_ms"], "engine_tokens_per_s": s["engine_tokens_per_s"]}


class TransformersWorker:
    """cli/bench/hf_worker.py in the transformers environment (`make transformers`; $DECODING_PLAYGROUND_TRANSFORMERS_VENV
    overrides where) at a fixed thread count: a JSON request a line in, its answer a line out."""

    def __init__(self, threads: int):
        python = Path(os.environ.get(TRANSFORMERS_ENV) or cache_dir() / "transformers" / "venv") / "bin" / "python"
        if not python.is_file():
            raise FileNotFoundError(f"no transformers environment at {python.parent.parent} (make transformers)")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "OMP_", "MKL_"))}
        env.update(OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.proc = subprocess.Popen([str(python), str(WORKER), str(model_dir(NAME)), str(threads)], text=True, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.info = self.read()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the transformers worker ended (exit {self.proc.wait()})")
        return json.loads(line)

    def generate(self, ids: list[int], max_tokens: int, eos: int | None) -> dict:
        self.proc.stdin.write(json.dumps({"input_ids": ids, "max_new_tokens": max_tokens, "eos_token_id": eos}) + "\n")
        self.proc.stdin.flush()
        r = self.read()
        return {"tokens_per_s": len(r["step_s"]) / sum(r["step_s"]) if r["step_s"] else None, "ids": r["ids"]}

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def race(args, lm) -> tuple[dict, dict, dict]:
    """(every side's runs, what was left out and why, the transformers workers): each engine at 1 .. N threads, and
    ours and llama.cpp plain and with n-gram speculation on the copy prompt, taking turns."""
    counts, skipped, workers = list(range(1, max(1, args.threads) + 1)), {}, {}
    tok, eos = lm.tokenizer, lm.cfg.eos_token_id
    ids = tok.encode(tok.chat_template.prompt(PROMPT))
    servers = {t: EmbeddedLlamaCpp.start(gguf_path(), threads=t, parallel=1) for t in counts}
    plain, ngram = (EmbeddedLlamaCpp.start(gguf_path(), threads=args.llamacpp_threads, parallel=1, ngram=n)
                    for n in (None, NGRAM))
    try:
        if not args.no_transformers:
            try:
                workers = {t: TransformersWorker(t) for t in counts}
            except (FileNotFoundError, RuntimeError) as e:
                skipped["transformers"] = str(e)
        sides = {("ours", "plain"): lambda: generate_tokens_per_s(1, COPY_PROMPT, MAX_TOKENS),
                 ("ours", "n-gram"): lambda: generate_tokens_per_s(1, COPY_PROMPT, MAX_TOKENS, **OURS_NGRAM),
                 ("llama.cpp", "plain"): lambda: llamacpp(plain, MAX_TOKENS, COPY_PROMPT),
                 ("llama.cpp", "n-gram"): lambda: llamacpp(ngram, MAX_TOKENS, COPY_PROMPT)}
        for t in counts:
            sides["ours", t] = lambda t=t: generate_tokens_per_s(t, PROMPT, MAX_TOKENS)
            sides["llama.cpp", t] = lambda s=servers[t]: llamacpp(s, MAX_TOKENS)
            if t in workers:
                sides["transformers", t] = lambda w=workers[t]: w.generate(ids, MAX_TOKENS, eos)
        for s in (*servers.values(), plain, ngram):
            llamacpp(s, 8)                                                  # warm-up: first-call costs
        for w in workers.values():
            w.generate(ids, 8, eos)
        return take_turns(sides, args.repeats), skipped, workers
    finally:
        for s in (*servers.values(), plain, ngram):
            s.close()
        for w in workers.values():
            w.close()


def run_engines(args) -> dict:
    if not is_fetched(NAME):
        raise SystemExit(f"bench engines: {NAME} is not fetched; run `decoding-playground fetch-model {NAME}`")
    reason = unavailable_reason(gguf_path())
    if reason:
        raise SystemExit(f"bench engines: llama.cpp cannot run: {reason}")
    started = machine()
    request_threads(1)                   # SmolLM2 loaded here for its tokenizer and size: load-time choice skipped
    lm = ModelRegistry(fetched_models()).get(NAME)
    runs, skipped, workers = race(args, lm)
    tps = {k: statistics.median(x["tokens_per_s"] for x in v) for k, v in runs.items()}
    counts = sorted(k for e, k in tps if e == "ours" and isinstance(k, int))
    ours_text = runs["ours", 1][0]["text"]
    r = {"machine": started, "repeats": args.repeats, "max_tokens": MAX_TOKENS, "counts": counts,
         "llamacpp_threads": args.llamacpp_threads, "bandwidth_bytes_per_s": streaming_bandwidth(),
         "tokens_per_s": {e: {k: v for (e2, k), v in tps.items() if e2 == e} for e in LABELS},
         "bytes_per_token": {"ours": lm.model.num_parameters * 4, "llama.cpp": gguf_path().stat().st_size},
         "llamacpp_own_tokens_per_s": statistics.median(x["engine_tokens_per_s"] for x in runs["llama.cpp", 1]),
         "ngram": {e: paired_rates(runs[e, "plain"], runs[e, "n-gram"]) for e in ("ours", "llama.cpp")},
         "skipped": skipped, "transformers": next(iter(workers.values())).info if workers else None,
         "transformers_same_text": {t: lm.tokenizer.decode(runs["transformers", t][0]["ids"]).replace("<|im_end|>", "")
                                    in ours_text for t in counts if ("transformers", t) in runs}}
    if not args.no_vllm:
        r["vllm"] = run_vllm(args.repeats, PROMPT, COPY_PROMPT, MAX_TOKENS)
    return r


def tables(r: dict) -> list[str]:
    bw, tps, size, counts = r["bandwidth_bytes_per_s"], r["tokens_per_s"], r["bytes_per_token"], r["counts"]
    one = {e: tps[e][1] for e in size}
    top = counts[-1]
    rows = [[LABELS[e], *(v.get(t) for t in counts),
             f"{tps['ours'][top] / v[top]:.2f}x" if e != "ours" and top in v else None] for e, v in tps.items() if v]
    rows += [[f"{e}: not measured ({why})", *([None] * (len(counts) + 1))] for e, why in r["skipped"].items()]
    title = f"Decode tokens/s at equal threads ({r['repeats']} turns, medians)"
    if r["transformers"]:
        i, same = r["transformers"], r["transformers_same_text"]
        title += (f"; transformers {i['transformers']}, torch {i['torch']}, its text a prefix of ours: "
                  + ", ".join(f"{t}: {'yes' if v else 'no'}" for t, v in same.items()))
    return [table(["engine", "tokens/s", "ms/token", "bytes/token", "GB/s achieved", "share of streaming bandwidth",
                   "tokens/s predicted by bytes"],
                  [[LABELS[e], one[e], 1e3 / one[e], f"{size[e] / 1e6:.0f} MB", one[e] * size[e] / 1e9,
                    f"{one[e] * size[e] / bw:.0%}", one["ours"] * size["ours"] / size[e]] for e in size],
                  f"One thread each, streaming bandwidth {bw / 1e9:.1f} GB/s; llama.cpp's own clock "
                  f"{r['llamacpp_own_tokens_per_s']:.1f} tokens/s"),
            table(["engine", *(f"{t} thread{'s' * (t > 1)}" for t in counts), f"ours / it at {top}"], rows, title),
            table(["engine", "plain tok/s", "n-gram tok/s", "speed-up"],
                  [[e, tps[e]["plain"], tps[e]["n-gram"], shown(r["ngram"][e])] for e in ("ours", "llama.cpp")],
                  f"n-gram speculation ({NGRAM[0]}-gram lookup, up to {NGRAM[1]} draft tokens) on a prompt whose "
                  f"answer copies it; llama.cpp at {r['llamacpp_threads']} thread(s)")] + (
        vllm_tables(r["vllm"]) if "vllm" in r else [])


def add_parser(bsub) -> None:
    b = add_bench(bsub, "engines", "our numpy engine against llama.cpp, transformers and vLLM on SmolLM2", run_engines,
                  tables)
    b.add_argument("--repeats", type=int, default=5, help="turns of each engine (default 5)")
    b.add_argument("--no-vllm", action="store_true", help="leave vLLM out (it starts vLLM servers of about 3.6 GB each)")
    b.add_argument("-t", "--threads", type=int, default=2, metavar="N",
                   help="race every engine at 1 .. N threads, taking turns (default 2)")
    b.add_argument("--llamacpp-threads", type=int, default=1, metavar="N",
                   help="llama.cpp's threads in the n-gram part (default 1)")
    b.add_argument("--no-transformers", action="store_true",
                   help="leave Hugging Face transformers out of the thread race (it needs `make transformers`)")
