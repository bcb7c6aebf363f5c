"""The child process `bench engines`' thread race starts (cli/bench/engines.py): Hugging Face transformers in its own
virtual environment (`make transformers`), run by its path (`python transformers_process.py MODEL_DIR THREADS`), so it
imports nothing of this project. A JSON request a line {"input_ids": [...], "max_new_tokens": n} is answered with the
new ids and each step's time (a StoppingCriteria is called once per token, after its forward). Greedy.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    model_dir, threads = sys.argv[1], int(sys.argv[2])
    import torch
    from transformers import LlamaForCausalLM, StoppingCriteria, StoppingCriteriaList

    torch.set_num_threads(threads)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()

    class Stamps(StoppingCriteria):
        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    print(json.dumps({"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "transformers": __import__("transformers").__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        ids = torch.tensor([req["input_ids"]])
        stamps = Stamps()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=req["max_new_tokens"],
                                 do_sample=False, stopping_criteria=StoppingCriteriaList([stamps]),
                                 eos_token_id=req.get("eos_token_id"), pad_token_id=req.get("eos_token_id"))
        new = out[0, ids.shape[1]:].tolist()
        print(json.dumps({"ids": new, "ttft_ms": (stamps.times[0] - t0) * 1e3 if stamps.times else None,
                          "step_s": [b - a for a, b in zip(stamps.times, stamps.times[1:])]}), flush=True)
    return 0


class TransformersWorker:
    """This file run in the transformers environment `venv` at a fixed thread count, by the process that imports
    it: a JSON request a line in, its answer a line out."""

    def __init__(self, venv: Path, model_dir: Path, threads: int):
        python = venv / "bin" / "python"
        if not python.is_file():
            raise FileNotFoundError(f"no transformers environment at {python.parent.parent} (make transformers)")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "OMP_", "MKL_"))}
        env.update(OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.proc = subprocess.Popen([str(python), __file__, str(model_dir), str(threads)], text=True, env=env,
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


if __name__ == "__main__":
    sys.exit(main())
