"""The draft model's card (models/drafts/TARGET/README.md), from what `train-draft TARGET export` records in
training.json and the c table `train-draft TARGET measure` left in the data folder."""
from __future__ import annotations

import json
from pathlib import Path


def _acceptance_rows(held: dict) -> list[str]:
    names = {"full": "full (49,152 tokens)", "subset": "frequent subset + the context's tokens"}
    gammas = sorted(held["subset"]["mean_acceptance_length"], key=int)
    rows = ["| draft vocabulary | acceptance per position | " + " | ".join(f"L at γ={g}" for g in gammas)
            + f" | L at γ={gammas[-1]} in a run |", "|---" * (len(gammas) + 3) + "|"]
    for key, name in names.items():
        a = held[key]
        rows.append(f"| {name} | {' / '.join(f'{x:.2f}' for x in a['per_position'])} | "
                    + " | ".join(f"{a['mean_acceptance_length'][g]:.2f}" for g in gammas)
                    + f" | {a['run_acceptance_length'][gammas[-1]]:.2f} |")
    return rows


def _started(init: dict | None) -> str:  # a run that trained an earlier draft further says which, and how far it was
    if not init:
        return ""
    return (f"Started from the draft then in {init['from']}{_how_far(init)}"
            + ", with the same objective and a new schedule on the data below: ")


def _how_far(init: dict) -> str:  # " (4,500 steps, 1.6 h, on 6,684 conversations; before them, ...)", to the first run
    done = ", ".join(x for x in (f"{init['steps']:,} steps" if init.get("steps") else "",
                                 f"{init['train_s'] / 3600:.1f} h" if init.get("train_s") else "",
                                 f"on {init['conversations']:,} conversations" if init.get("conversations") else "")
                     if x)
    earlier = _how_far(init["earlier"])[2:-1] if init.get("earlier") else ""
    done += f"; before them, {earlier}" if earlier else ""
    return f" ({done})" if done else ""


def _grew(curve: list[dict]) -> str:  # a loss over data that grew while the run went on reads differently
    seen = [h["conversations"] for h in curve if h.get("conversations")]
    if not seen or seen[0] == seen[-1]:
        return ""
    return (f" The data grew from {seen[0]:,} to {seen[-1]:,} conversations during the run: a conversation the draft "
            "has not seen yet has a higher loss than one it has, so the loss rises as new ones arrive.")


def _run_config(tc: dict) -> str:  # the --config that reproduces the run: its length, and where it started
    return json.dumps({"steps": tc["steps"], **({"init": tc["init"], "lr": tc["lr"]} if tc.get("init") else {})})


C_HEADING = "## Shape: c, a draft step over a target step"


def shipped_c_table(readme) -> str | None:
    """The c measurement a card already shows (its table and what follows it up to the next section): the cache
    that `measure` writes to is not on every machine that trains the draft further."""
    text = Path(readme).read_text() if Path(readme).is_file() else ""
    if C_HEADING not in text:
        return None
    section = text.split(C_HEADING, 1)[1].split("\n## ", 1)[0]
    start = section.find("| draft | parameters |")
    return section[start:].strip() if start >= 0 else None


def card(target: str, info: dict, c_table: str | None, status: str) -> str:
    tc, data = info["config"], info["data"]
    curve = ", ".join(f"{h['step']}: {h['loss']:.2f}" for h in info["loss_curve"])
    lines = [
        f"# A draft model for {target}",
        "",
        status,
        "",
        f"A Llama decoder (`LlamaForCausalLM`) with {target}'s tokenizer, chat template and full vocabulary, distilled "
        "from it in numpy (engine/training/draft_train.py, the handwritten backward of engine/training/llama.py, "
        "gradient-checked): "
        f"{tc['num_hidden_layers']} layers x {tc['hidden_size']}, {tc['num_attention_heads']} query heads sharing "
        f"{tc['num_key_value_heads']} KV heads (head dim {tc['head_dim']}), MLP {tc['intermediate_size']}, tied "
        f"embedding and LM head; {info['parameters']:,} parameters (float16 safetensors).",
        "",
        "## Files",
        "",
        "config.json and model.safetensors (the Hugging Face layout, float16), vocab_subset.json (the frequent-token "
        "subset S below), training.json (what this card states). No tokenizer: the draft reads and writes "
        f"{target}'s token ids, and the engine drafts with the target's tokenizer and chat template "
        "(engine/model/shipped_drafts.py). A tool that loads a model folder on its own needs the target's "
        f"tokenizer.json and tokenizer_config.json beside it: `decoding-playground train-draft {target} export "
        "--tokenizer --out DIR` writes them.",
        "",
        f"For llama.cpp, `decoding-playground fetch-model {target}` (`make fetch`, which `make run` and `make test` "
        f"run first) writes this draft as a GGUF into the cache, gguf/{target}-draft.F16.gguf "
        "(engine/model/gguf_export.py; not in the repository): float16, the target GGUF's tokenizer fields, and an "
        "LM head over the whole vocabulary whose rows outside S are the mean of S's rows, so that its greedy drafts "
        "are S's (docs/external-engines.md).",
        "",
        f"For vLLM's `draft_model`, `train-draft {target} export --format vllm` (and `serve --vllm`, into the cache) "
        "writes the folder vLLM loads (engine/training/vllm_draft_export.py): float32, the target's tokenizer files, "
        "and an untied LM head with the rows of S and zeros elsewhere, so that greedy, vLLM drafts our argmax over S "
        "(docs/external-engines.md, \"Our draft model in vLLM\": what stays inexact, and `bench heads`' step-by-step "
        "comparison with ours).",
        "",
        C_HEADING,
        "",
        "The LM head of a drafting engine can be the full vocabulary or, like the EAGLE head's, the "
        f"{info['vocab_subset']:,} most frequent tokens of the training answers (vocab_subset.json) plus the "
        "context's tokens: the table times both with the engine's own forward (random weights of each shape, "
        "interleaved with the target's decode steps; `decoding-playground train-draft "
        f"{target} measure`).",
        "",
        c_table or "(no measurement recorded: run `train-draft ... measure`)",
        "",
        "## Data",
        "",
        f"{target}'s own greedy answers (chat template) to the prompts of engine/training/head_prompts.py, and its "
        f"top-{data['topk']} next-token distribution at every position (engine/training/head_data.py): "
        f"{data['conversations']:,} conversations, {data['answer_tokens']:,} answer tokens, "
        f"{data['counted_positions']:,} positions with a teacher distribution (the prompt's after the system prompt "
        f"count too)" + (f", generated in {data['generation_s'] / 3600:.1f} h on a shared core" if data["generation_s"]
                         else "") + f". The subset covers {data['coverage_of_subset']:.1%} of the answers' tokens.",
        "",
        "## Training",
        "",
        _started(info.get("init"))
        + f"{info['steps']:,} of {tc['steps']:,} steps ({info['train_s'] / 3600:.1f} h on one shared core) of "
        f"{tc['batch_size']} windows of at most {tc['seq_len']} positions; the loss is the cross-entropy against "
        "the teacher's top-k renormalised, over a sampled vocabulary (the subset plus the step's teacher tokens); "
        f"AdamW (weight decay {tc['weight_decay']}), peak lr {tc['lr']}, {tc['warmup_steps']} warm-up steps then "
        "cosine" + ("." if info.get("init") else
                    "; the embedding starts as the target's projected onto its top principal directions."),
        "",
        f"Training loss (nats) by step: {curve}." + _grew(info["loss_curve"]),
        "",
    ]
    if "held_out" in info:
        held = info["held_out"]
        lines += ["## Held-out acceptance (offline, temperature 0)", "",
                  f"The target's greedy answers to {held['conversations']} held-out prompts (subjects, code tasks "
                  "and texts to summarise that no training prompt has); a chain started at every answer position, drafts from the float16 "
                  "weights (`train-draft ... eval --checkpoint models/drafts/...`). In a run, a round starts where the last "
                  "one ended, often right after a token the draft missed, so fewer of its chains start at easy "
                  "positions: the last column plays the greedy run's rounds over the same answers (the engine's "
                  "drafts in a run are these chains: tests/smollm2/test_smollm2_draft_model.py).", "",
                  *_acceptance_rows(held), ""]
    lines += ["## Reproduce / continue", "",
              f"`decoding-playground train-draft {target} data --prompts N` (resumable; `--held-out` for the held-out "
              f"answers), `... train --resume --config '{_run_config(tc)}'` (continues the state in "
              f"$DECODING_PLAYGROUND_CACHE/drafts/{target}/state), then `... export`.", ""]
    return "\n".join(lines)
