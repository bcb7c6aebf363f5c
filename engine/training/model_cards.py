"""Write the model cards (models/<name>/README.md), models/README.md and models/index.json from the
`training.json` each training run leaves, plus the draft's greedy acceptance against each target and its
cost c per step (measured here: run it on an otherwise idle machine).

    OPENBLAS_NUM_THREADS=1 python -m engine.training.model_cards [--models-dir models]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from ..model.checkpoint import load_checkpoint
from ..model.llama import Model, forward_no_cache
from .corpus import load_corpus
from .evaluate import acceptance, draft_cost, top1_agreement

TARGETS = ["target-mha", "target-gqa", "target-mqa"]
DRAFT = "draft"
ROLE = {"target-mha": "target", "target-gqa": "target", "target-mqa": "target", "draft": "draft"}

LOADING = """## Loading it elsewhere

The folder is a Hugging Face Llama checkpoint (`LlamaForCausalLM`, float16 safetensors) with a
`tokenizers` tokenizer, so it loads unchanged in other Llama tooling:

```python
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
model = LlamaForCausalLM.from_pretrained("models/{name}", torch_dtype="float32")
tok = PreTrainedTokenizerFast(tokenizer_file="models/{name}/tokenizer.json", eos_token="<|endoftext|>",
                              unk_token="\\ufffd")
ids = tok("def __init__(self", return_tensors="pt").input_ids
print(tok.decode(model.generate(ids, max_new_tokens=64, do_sample=False)[0]))
```

{verified}In this project: `engine.model.checkpoint.load_checkpoint("models/{name}")` -> (config, float32 weights,
tokenizer), then `engine.model.llama.Model(config, weights)`.
"""

# What scripts/check_hf_transformers.py reported on its last run (outside the tests, in a separate venv with torch
# and transformers): update these figures when re-running it, then regenerate the cards.
HF_CHECK = {"date": "2026-11-29", "torch": "2.13.0 (CPU build)", "transformers": "5.24.0", "tokenizers": "0.23.3",
            "max_delta_logit": {"target-mha": 9.54e-06, "target-gqa": 1.41e-05, "target-mqa": 1.55e-05,
                                "draft": 1.50e-05}}


def hf_verified(name) -> str:
    delta = HF_CHECK["max_delta_logit"].get(name)
    if delta is None:
        return ""
    return (f"Verified on {HF_CHECK['date']} with torch {HF_CHECK['torch']}, transformers {HF_CHECK['transformers']} "
            f"and tokenizers {HF_CHECK['tokenizers']} by `scripts/check_hf_transformers.py` (run in a separate venv "
            "with torch and transformers): on three Python prompts of 63-98 characters, the float32 logits of "
            "transformers and of this project's engine differ by at most "
            f"**{delta:.1e}** (max |delta logit| over every position), greedy generation of 64 tokens gives "
            "identical text both ways, and `PreTrainedTokenizerFast` gives the engine's token ids (an unknown "
            "character -> id 1, `<|endoftext|>` -> id 0) and decodes them back to the same text.\n\n")


def total_seconds(t):  # a run that continued an earlier stage (distillation) counts both
    return t["train_seconds"] + (t.get("previous_stage") or {}).get("train_seconds", 0)


def fmt_minutes(s):
    return f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def stage_rows(t: dict, tc: dict, prev: dict | None) -> list[str]:
    """The card's rows on how this model started: distilled after a first stage, or uptrained from a parent."""
    lines = []
    if prev and tc.get("distill_from") and t.get("val_loss_before_uptraining") is not None:
        lines.append(f"| before distillation | {t['val_loss_before_uptraining']:.4f} nats/char (same measure), "
                     f"after stage 1: {prev['steps']} steps x {prev['train_config']['batch_size']} x "
                     f"{prev['train_config']['seq_len']} tokens from scratch on the text, lr "
                     f"{prev['train_config']['lr']:g}, {fmt_minutes(prev['train_seconds'])} |" if prev else "")
        lines.append(f"| distillation (stage 2) | teacher `{Path(tc['distill_from']).name}`: loss = cross-entropy "
                     "against the teacher's next-token distribution on training windows |")
    elif t.get("val_loss_before_uptraining") is not None:
        lines.append(f"| before uptraining | {t['val_loss_before_uptraining']:.4f} nats/char right after "
                     f"mean-pooling the K/V heads of `{Path(tc['init_from']).name}` (same measure) |")
        if tc.get("distill_from"):
            parent = Path(tc["distill_from"]).name
            layers = (f" plus {tc['distill_hidden']:g} x the relative squared error between this model's residual "
                      f"stream and `{parent}`'s after every layer" if tc.get("distill_hidden") else "")
            lines.append(f"| uptraining loss | cross-entropy against `{parent}`'s next-token distribution{layers}, "
                         "on training windows (distillation from the MHA parent) |")
    return lines


def acceptance_lines(acc: dict) -> list[str]:
    """The card's section on greedy acceptance against each target (and by the number of draft tokens)."""
    lines = ["## Greedy acceptance against each target", "",
             "Speculative decoding at temperature 0 from prompts cut from the validation text "
             f"({acc['_setup']}). acceptance rate = accepted / proposed draft tokens; mean acceptance length = "
             "tokens emitted per target forward; top-1 agreement = teacher-forced argmax agreement on "
             "validation windows. Greedy decoding of small models drifts into repetitive text that both models "
             "predict easily, which flatters the acceptance rate; top-1 agreement on real text is the "
             "stricter number.", "",
             "alpha = accepted / (accepted + rejected), counting only proposals the target actually judged "
             "(Leviathan et al.'s per-token acceptance, the seed article's number).", "",
             "| target | acceptance rate | alpha | mean acceptance length | top-1 agreement |",
             "|---|---|---|---|---|"]
    for tgt in TARGETS:
        if tgt in acc:
            a = acc[tgt]
            lines.append(f"| {tgt} | {a['acceptance_rate']:.3f} | {a['alpha']:.3f} | {a['mean_acceptance_length']:.2f} | "
                         f"{a['top1_agreement']:.3f} |")
    lines.append("")
    by_k = acc.get("_by_k")
    if by_k:
        lines += ["Against target-mha, by the number of speculative tokens per round (same prompts):", "",
                  "| speculative tokens | acceptance rate | alpha | mean acceptance length |", "|---|---|---|---|"]
        lines += [f"| {k} | {a['acceptance_rate']:.3f} | {a['alpha']:.3f} | {a['mean_acceptance_length']:.2f} |"
                  for k, a in by_k.items()]
        lines.append("")
    return lines


def card(name, t, acc=None, sample=None, flops=None, cost=None) -> str:
    c, tc, corpus = t["config"], t["train_config"], t["corpus"]
    notes = tc.get("notes", "")
    notes = notes[:1].upper() + notes[1:]
    lines = [f"# {name}", "",
             f"A character-level Llama ({t['attention_kind']}) trained in numpy with handwritten "
             f"backprop (`engine/training`) on Python {corpus['python_version']}'s standard-library sources. "
             f"Role in the playground: **{ROLE.get(name, 'model')}**. {notes}.", "",
             "| | |", "|---|---|",
             f"| parameters | {t['parameters']:,} |",
             f"| layers x width | {c['num_hidden_layers']} x {c['hidden_size']} (intermediate {c['intermediate_size']}) |",
             f"| heads | {c['num_attention_heads']} query, {c['num_key_value_heads']} key/value, head dim {c['head_dim']} |",
             f"| context | {c['max_position_embeddings']} tokens (trained on windows of {tc['seq_len']}) |",
             f"| vocabulary | {c['vocab_size']} characters (id 0 `<|endoftext|>`, id 1 U+FFFD for unknown) |",
             f"| validation loss | **{t['val_loss']:.4f} nats/char** over the whole validation split "
             f"({t['val_tokens']:,} tokens) |"]
    prev = t.get("previous_stage")
    lines += stage_rows(t, tc, prev)
    lines += [f"| training | {t['steps']} steps x {tc['batch_size']} windows x {tc['seq_len']} tokens = "
              f"{t['tokens_seen']:,} tokens; AdamW (lr {tc['lr']:g}, betas {tc['beta1']}/{tc['beta2']}, weight decay "
              f"{tc['weight_decay']}), warmup {tc['warmup_steps']} + cosine to {tc['min_lr_ratio']:g} x lr, "
              f"clip {tc['grad_clip']}, seed {tc['seed']} |",
              f"| training time | {fmt_minutes(total_seconds(t))}{' (both stages)' if prev else ''} on a VM with 2 shared cores (1 BLAS thread, "
              f"numpy {t['numpy']}, Python {t['python']}) |", ""]
    if flops:
        lines += [f"Cost per token: about {flops[0]:,} multiply-add FLOPs in the weight matrices, "
                  f"{flops[0] / flops[1]:.1%} of the MHA target's {flops[1]:,} (attention over the context "
                  "not counted). On a CPU, models this small are bound by numpy call overhead, so the wall-time "
                  "ratio of a decode step is larger:", ""]
    if cost:
        lines += [f"Measured cost per token (`engine.training.evaluate.draft_cost`, {cost['date']}, medians of "
                  f"interleaved loops of decode steps with the KV cache at a {cost['context']}-token context): one "
                  f"draft step {cost['draft_step_ms']:.3f} ms, one target-mha step {cost['target_step_ms']:.3f} ms, "
                  f"**c = {cost['c']:.3f}**. `decoding-playground bench engine` measures it again, in a loop and "
                  "inside generations.", ""]
    if sample:
        lines += ["## What it writes", "",
                  "Greedy continuation (temperature 0) of the prompt `" + sample[0] + "`, 200 characters:", "",
                  "```python", sample[0] + sample[1], "```", ""]
    if acc:
        lines += acceptance_lines(acc)
    lines += ["## Corpus", "",
              f"{corpus['selection']} in `{corpus['stdlib_dir']}` (Python {corpus['python_version']}): "
              f"{corpus['train_files']} training files ({corpus['train_chars']:,} characters), "
              f"{corpus['val_files']} validation files ({corpus['val_chars']:,} characters); "
              f"{corpus['unknown_chars']} characters outside printable ASCII + tab + newline became U+FFFD. "
              f"sha256 `{corpus['sha256']}` (over file names and contents; a different Python version gives "
              "a different corpus and a different hash).", "",
              "## Reproduce", "", "```sh",
              *([f"OPENBLAS_NUM_THREADS=1 decoding-playground train --preset {t['preset']}",
                 f"OPENBLAS_NUM_THREADS=1 decoding-playground train --preset {t['preset']}-distilled"
                 f"   # needs models/{Path(tc['distill_from']).name}"] if prev and tc.get("distill_from") else
                [f"OPENBLAS_NUM_THREADS=1 decoding-playground train --preset {t['preset']}"
                 + (f"   # needs models/{Path(tc['init_from']).name} first" if tc.get("init_from") else "")]),
              "```", "", "Validation loss during training (fixed windows):", "",
              " ".join(f"{h['step']}: {h['val_loss']:.3f}" for h in t["history"]), "",
              LOADING.format(name=name, verified=hf_verified(name))]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models-dir", default="models")
    ap.add_argument("--prompts", type=int, default=32)
    args = ap.parse_args(argv)
    root = Path(args.models_dir)
    names = [n for n in TARGETS + [DRAFT] if (root / n / "training.json").exists()]
    info = {n: json.loads((root / n / "training.json").read_text()) for n in names}
    acc, cost = {}, None
    if DRAFT in info:
        _, val_ids, _, _ = load_corpus()
        draft = Model(*load_checkpoint(root / DRAFT, with_tokenizer=False)[:2])
        targets = {}
        for tgt in [n for n in TARGETS if n in info]:
            t0 = time.perf_counter()
            target = targets[tgt] = Model(*load_checkpoint(root / tgt, with_tokenizer=False)[:2])
            a = acceptance(target, draft, val_ids, n_prompts=args.prompts)
            a["top1_agreement"] = top1_agreement(target, draft, val_ids)
            acc[tgt] = a
            print(f"draft vs {tgt}: {a} ({time.perf_counter() - t0:.0f} s)", flush=True)
        if acc:
            a = next(iter(acc.values()))
            acc["_setup"] = (f"{a['prompts']} prompts of {a['prompt_len']} characters, {a['max_tokens']} new tokens "
                             f"each, {a['num_speculative_tokens']} speculative tokens per round")
        if "target-mha" in targets:
            target, default_k = targets["target-mha"], acc["target-mha"]["num_speculative_tokens"]
            acc["_by_k"] = {k: acc["target-mha"] if k == default_k else
                            acceptance(target, draft, val_ids, n_prompts=args.prompts, k=k) for k in (1, 2, 3, 4, 6)}
            cost = dict(draft_cost(target, draft), date=time.strftime("%Y-%m-%d"))
            print(f"draft cost: c = {cost['c']:.3f} ({cost['draft_step_ms']:.4f} / {cost['target_step_ms']:.4f} ms)",
                  flush=True)
    index = []
    flop = {n: matmul_flops(info[n]["config"]) for n in names}
    for n in names:
        t = info[n]
        sample = greedy_sample(root / n) if ROLE[n] == "target" else None
        flops = (flop[n], flop["target-mha"]) if n == DRAFT and "target-mha" in flop else None
        (root / n / "README.md").write_text(card(n, t, acc if n == DRAFT else None, sample, flops,
                                                 cost if n == DRAFT else None))
        entry = dict(name=n, path=f"{root.name}/{n}", role=ROLE[n], attention_kind=t["attention_kind"],
                     parameters=t["parameters"], val_loss=t["val_loss"],
                     num_hidden_layers=t["config"]["num_hidden_layers"], hidden_size=t["config"]["hidden_size"],
                     num_attention_heads=t["config"]["num_attention_heads"],
                     num_key_value_heads=t["config"]["num_key_value_heads"],
                     max_position_embeddings=t["config"]["max_position_embeddings"],
                     train_seconds=round(total_seconds(t), 1), steps=t["steps"])
        if t["train_config"].get("distill_from"):
            entry["distilled_from"] = Path(t["train_config"]["distill_from"]).name
        if t.get("val_loss_before_uptraining") is not None:
            entry["val_loss_before_uptraining"] = t["val_loss_before_uptraining"]
        if n == DRAFT and acc:
            entry["acceptance_rate"] = {k: v["acceptance_rate"] for k, v in acc.items() if not k.startswith("_")}
        if n == DRAFT and cost:
            entry["draft_cost_c"] = round(cost["c"], 3)
        index.append(entry)
    (root / "index.json").write_text(json.dumps({"models": index}, indent=2) + "\n")
    write_overview(root, info, acc)
    print(f"wrote {len(names)} model cards, {root}/README.md and {root}/index.json")


def matmul_flops(c) -> int:  # 2 x the weights a token multiplies (embedding lookup excluded)
    hd = c["head_dim"]
    attn = c["hidden_size"] * hd * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    mlp = 3 * c["hidden_size"] * c["intermediate_size"]
    return 2 * (c["num_hidden_layers"] * (attn + mlp) + c["vocab_size"] * c["hidden_size"])


PROMPT = "    def __init__(self"


def greedy_sample(path, prompt=PROMPT, n=200):
    cfg, w, tok = load_checkpoint(path)
    model = Model(cfg, w)
    ids = tok.encode(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(forward_no_cache(model, ids)[-1])))
    return prompt, tok.decode(ids[len(tok.encode(prompt)):])


# The same 180 uptraining steps with plain distillation (the parent's next-token distribution only, no layer
# term: engine/training/cli.py's RECIPES without `distill_hidden`): whole-split validation loss, for the cards.
PLAIN_DISTILLATION_RUNS = {"date": "2026-11-29", "val_loss": {"target-gqa": 1.2694, "target-mqa": 1.3597}}


def uptraining_text(info) -> str:
    """How GQA and MQA were made, with the figures of their runs and of plain distillation for comparison."""
    text = ("GQA and MQA were made from the MHA checkpoint as Ainslie et al. (2023) do: mean-pool the K and V "
            "projection heads, then uptrain (here by distillation from the MHA parent: its next-token "
            "distribution and its residual stream after every layer).")
    mha = info.get("target-mha")
    if not mha:
        return text
    parts = []
    for n in ("target-gqa", "target-mqa"):
        t = info.get(n)
        if not t:
            continue
        plain = PLAIN_DISTILLATION_RUNS["val_loss"].get(n)
        parts.append(f"{n} {t['steps']} steps ({t['steps'] / mha['steps']:.0%} of the MHA's {mha['steps']}), "
                     f"{t['val_loss']:.4f} nats/char ({t['val_loss'] - mha['val_loss']:+.3f} vs MHA)"
                     + (f"; plain distillation over the same steps ({PLAIN_DISTILLATION_RUNS['date']}) reached "
                        f"{plain:.4f} ({plain - mha['val_loss']:+.3f})" if plain is not None else ""))
    return (text + " " + "; ".join(parts) + ". Quality bars: GQA within 0.05, MQA within 0.10 of the MHA.") \
        if parts else text


def write_overview(root, info, acc):
    lines = ["# Shipped models", "",
             "One family of character-level Llama models (Hugging Face layout), trained from scratch in numpy "
             "with handwritten backprop on Python's own standard-library sources (`engine/training`). "
             "Each folder has `config.json`, `model.safetensors` (float16), `tokenizer.json`, `training.json` "
             "(the run's full record) and a model card (`README.md`). `index.json` lists them for "
             "`decoding-playground models`.", "",
             "| name | role | attention | layers x width | heads (q/kv) | parameters | val loss (nats/char) | training time |",
             "|---|---|---|---|---|---|---|---|"]
    for n, t in info.items():
        c = t["config"]
        extra = (f" (before {'distillation' if t.get('previous_stage') else 'uptraining'} "
                 f"{t['val_loss_before_uptraining']:.3f})" if t.get("val_loss_before_uptraining") is not None else "")
        lines.append(f"| [{n}]({n}/README.md) | {ROLE[n]} | {t['attention_kind']} | {c['num_hidden_layers']} x "
                     f"{c['hidden_size']} | {c['num_attention_heads']}/{c['num_key_value_heads']} | "
                     f"{t['parameters']:,} | {t['val_loss']:.4f}{extra} | {fmt_minutes(total_seconds(t))} |")
    if acc:
        lines += ["", "Draft greedy acceptance rate (speculative decoding at temperature 0 on held-out text, "
                  f"{acc['_setup']}): " + ", ".join(f"{k} {v['acceptance_rate']:.3f}" for k, v in acc.items()
                                                     if not k.startswith("_")) + "."]
    lines += ["", uptraining_text(info), "",
              "Validation loss is the mean over the whole validation split (16 stdlib files never trained on) "
              "in consecutive 512-token windows. Training times are wall-clock times of each run on a 2-core "
              "machine shared with other work (some runs overlapped with another), so they are upper bounds.", "",
              "Retrain any of them with `decoding-playground train --preset NAME` (`--help` explains the presets; "
              "targets first, GQA/MQA start from `models/target-mha`). Set `OPENBLAS_NUM_THREADS=1`.", ""]
    (root / "README.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
