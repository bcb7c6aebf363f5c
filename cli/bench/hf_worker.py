"""Hugging Face transformers generating on request, for `bench engines` only (cli/bench/engines.py): run in its own
virtual environment with torch and transformers (`make transformers`; neither is a project dependency) on the
checkpoint fetch-model converted, as `python cli/bench/hf_worker.py MODEL_DIR THREADS`, then one JSON request a line.
A request {"input_ids": [...], "max_new_tokens": n} is answered with the new ids and the time of every step (a
StoppingCriteria is called once per token, after its forward). Greedy; imports nothing of this project.
"""
from __future__ import annotations

import json
import sys
import time


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


if __name__ == "__main__":
    sys.exit(main())
