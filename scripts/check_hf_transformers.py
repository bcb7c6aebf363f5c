"""Check that the shipped checkpoints load unchanged in Hugging Face transformers.

For every model in models/ it loads the folder the way the model card's "Loading it elsewhere" snippet
does (`LlamaForCausalLM.from_pretrained(path, torch_dtype="float32")` and
`PreTrainedTokenizerFast(tokenizer_file=...)`) and compares with this project's own engine
(`engine.model.checkpoint.load_checkpoint` + `engine.model.llama.forward_no_cache`):
- token ids of a few prompts (and of a text with an unknown character and `<|endoftext|>`),
  and that decoding them gives the text back;
- the logits at every position of three Python prompts: max |delta logit| (float32 both ways);
- greedy generation of 64 tokens: transformers' `generate(do_sample=False)` against argmax
  decoding in the engine; the texts must be identical.

NOT part of `make test` or CI: transformers and torch are not project dependencies. It needs a
separate virtualenv, outside the repository, with them installed, e.g.

    python3.11 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch transformers safetensors tokenizers numpy
    /tmp/hfvenv/bin/python scripts/check_hf_transformers.py [--engine-python .venv/bin/python]

The engine half runs in the project's venv (this same file, `--engine-side DIR`, started as a
subprocess); the two halves exchange arrays as .npy files in a temporary folder. Exit status 0 when
every model agrees (max |delta logit| <= --tol, identical ids and greedy text), 1 otherwise.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["target-mha", "target-gqa", "target-mqa", "draft"]
PROMPTS = [
    "def __init__(self, name, value=None):\n        self.name = name\n",
    "import os\nimport sys\n\n\ndef main(argv):\n    for arg in argv[1:]:\n        print(arg)\n",
    "class Counter(dict):\n    def __missing__(self, key):\n        return 0\n\n    def most_common(self, n",
]
# tokenizer round trip only: a character outside the vocabulary (-> U+FFFD, id 1) and the EOS token
TOKENIZER_TEXTS = PROMPTS + ["x = 'caf\u00e9'  # \u00e9 is not in the vocabulary<|endoftext|>y = 1\n"]
NEW_TOKENS = 64


def engine_side(out: Path, models: list[str]) -> None:
    """In the project's venv: ids, logits and greedy continuations from the engine, as .npy files."""
    sys.path.insert(0, str(ROOT))
    from engine.model.checkpoint import load_checkpoint
    from engine.model.llama import Model, forward_no_cache

    for name in models:
        cfg, weights, tok = load_checkpoint(ROOT / "models" / name)
        model = Model(cfg, weights)
        for i, text in enumerate(TOKENIZER_TEXTS):
            ids = tok.encode(text)
            np.save(out / f"{name}.ids{i}.npy", np.array(ids, np.int64))
            (out / f"{name}.decoded{i}.txt").write_text(tok.decode(ids), encoding="utf-8")
        for i, text in enumerate(PROMPTS):
            ids = tok.encode(text)
            np.save(out / f"{name}.logits{i}.npy", forward_no_cache(model, ids))
            seq = list(ids)
            for _ in range(NEW_TOKENS):
                nxt = int(np.argmax(forward_no_cache(model, seq)[-1]))
                seq.append(nxt)
                if nxt == tok.eos_token_id:   # generate() stops there too
                    break
            np.save(out / f"{name}.greedy{i}.npy", np.array(seq, np.int64))
            (out / f"{name}.greedy{i}.txt").write_text(tok.decode(seq), encoding="utf-8")


def hf_side(work: Path, models: list[str], tol: float) -> bool:
    """In the transformers venv: the same from transformers, compared with the engine's files."""
    import tokenizers
    import torch
    import transformers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers "
          f"{tokenizers.__version__}, numpy {np.__version__}, Python {sys.version.split()[0]}, "
          f"{datetime.date.today().isoformat()}")
    ok = True
    for name in models:
        path = ROOT / "models" / name
        # exactly as in the model card (transformers 5 also accepts the newer name `dtype=`)
        model = LlamaForCausalLM.from_pretrained(str(path), torch_dtype="float32")
        assert model.dtype == torch.float32
        model.eval()
        tok = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), eos_token="<|endoftext|>",
                                      unk_token="\ufffd")
        ids_same = True
        for i, text in enumerate(TOKENIZER_TEXTS):
            hf_ids = tok(text).input_ids
            ours = np.load(work / f"{name}.ids{i}.npy").tolist()
            back = tok.decode(hf_ids)
            ours_back = (work / f"{name}.decoded{i}.txt").read_text(encoding="utf-8")
            if hf_ids != ours or back != ours_back:
                ids_same = False
                print(f"  {name}: tokenizer differs on text {i}: {hf_ids[:20]} vs {ours[:20]}; "
                      f"{back[:40]!r} vs {ours_back[:40]!r}")
        max_delta, greedy_same = 0.0, True
        for i, text in enumerate(PROMPTS):
            ids = tok(text, return_tensors="pt").input_ids
            with torch.no_grad():
                logits = model(ids).logits[0].numpy()
            ours = np.load(work / f"{name}.logits{i}.npy")
            max_delta = max(max_delta, float(np.abs(logits - ours).max()))
            with torch.no_grad():
                gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()
            ours_gen = np.load(work / f"{name}.greedy{i}.npy").tolist()
            if gen != ours_gen or tok.decode(gen) != (work / f"{name}.greedy{i}.txt").read_text(encoding="utf-8"):
                greedy_same = False
                print(f"  {name}: greedy text differs on prompt {i}:\n    hf:     {tok.decode(gen)!r}\n"
                      f"    engine: {(work / f'{name}.greedy{i}.txt').read_text(encoding='utf-8')!r}")
        agree = max_delta <= tol and ids_same and greedy_same
        ok &= agree
        print(f"{name:11s} max|dlogit| {max_delta:.2e}  tokenizer ids {'same' if ids_same else 'DIFFER'}  "
              f"greedy {NEW_TOKENS} tokens x {len(PROMPTS)} prompts {'identical' if greedy_same else 'DIFFER'}  "
              f"-> {'ok' if agree else 'MISMATCH'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-python", default=str(ROOT / ".venv" / "bin" / "python"),
                    help="the project's venv python, for the engine half (default: .venv/bin/python)")
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--tol", type=float, default=1e-3, help="largest |delta logit| accepted (default 1e-3)")
    ap.add_argument("--engine-side", metavar="DIR", help=argparse.SUPPRESS)  # the engine half, internal
    args = ap.parse_args()
    if args.engine_side:
        engine_side(Path(args.engine_side), args.models)
        return 0
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([args.engine_python, __file__, "--engine-side", d, "--models", *args.models], check=True)
        return 0 if hf_side(Path(d), args.models, args.tol) else 1


if __name__ == "__main__":
    sys.exit(main())
