"""`bench serve --sweep --workload ...` end to end: real clients asking a workload's prompts of a real server, every
cell of γ x concurrency measured, and the `batch` schedule's table made from them (not stored with --no-write); and
the workload's answers read from vLLM's own stream (`--engine vllm`)."""
import json
import os
import subprocess
import sys

import pytest

from engine.spec_decode.batch_schedule import TABLES_DIR, validated_table


@pytest.mark.parametrize("workload, method", [("workshop", "suffix"), ("agentic", "ngram")])
def test_a_sweep_of_a_workload_measures_every_cell_and_makes_a_table(models_dir, workload, method):
    stored = {f.name: f.read_text() for f in TABLES_DIR.glob("*.json")}
    env = {**os.environ, "DECODING_PLAYGROUND_CACHE": os.devnull, "OPENBLAS_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "cli.main", "bench", "serve", "--sweep", "--workload", workload,
                        "--method", method, "--repeats", "1", "--max-tokens", "6", "--models-dir", str(models_dir),
                        "--json", "--no-write"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert (out["workload"], out["method"], out["model"]) == (workload, method, "target-mha")
    assert {(x["gamma"], x["concurrency"]) for x in out["rows"]} == {
        (g, c) for g in ("none", 2, 4, 6, "acceptance", "batch") for c in (1, 4, 16)}
    assert all(x["errors"] == 0 and x["tokens_per_s"] > 0 for x in out["rows"])
    table = validated_table(out["table"])
    assert [e[:2] for e in table] == [(1, 3), (4, 15), (16, 16)] and all(e[2] in (0, 2, 4, 6) for e in table)
    assert out["kv_blocks_used_after"] == 0
    assert {f.name: f.read_text() for f in TABLES_DIR.glob("*.json")} == stored     # --no-write: nothing stored


def test_a_request_straight_to_vllm_keeps_its_answer_for_the_next_agentic_turn(monkeypatch):
    """`direct` (vLLM without the page) against an OpenAI-style stream (vLLM's chunks, served in this process): each
    client's answer is the chunks' text, and an agentic workload's next prompt revises it."""
    import httpx

    from cli.bench import serve
    from engine.external.openai_stream import run_coroutine
    from engine.experiments.serve_workloads import Agentic, revision_prompt
    from engine.experiments.workshop import QUESTIONS

    asked = []

    def vllm(request: httpx.Request) -> httpx.Response:
        question = json.loads(request.content)["messages"][0]["content"]
        asked.append(question)
        chunks = [{"choices": [{"delta": {"content": f"answer to {question[-12:]}"}, "token_ids": [1, 2]}]},
                  {"choices": [{"delta": {"content": "!"}, "token_ids": [3]}]}]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    real = httpx.AsyncClient
    monkeypatch.setattr(httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(vllm), **kw))
    workload = Agentic()
    first = run_coroutine(serve.direct("http://vllm/v1/chat/completions", "key", 2, 8, workload))
    run_coroutine(serve.direct("http://vllm/v1/chat/completions", "key", 2, 8, workload))
    assert first["errors"] == 0 and first["output_tokens"] == 6
    assert first["texts"] == [f"answer to {q[0][-12:]}!" for q in QUESTIONS[:2]]      # in the clients' order
    assert sorted(asked[2:]) == sorted(revision_prompt(t) for t in first["texts"])
