"""What the clients of `bench serve --workload NAME` ask (cli/bench/serve.py sends it, to our engine or to vLLM).

- `code` (the default): the beginnings of short programs, one per client (cli/bench/served.py's PROMPTS).
- `workshop`: a room drawing from ten questions (engine/experiments/workshop.py's, `bench suffix`'s): request r
  of a run asks question r mod 10, in its first words the first two times round and in another phrasing the
  third, so that every question comes back in the same words and in other words. Suffix decoding's best case
  (an answer it has seen) beside one it can hardly help (a paraphrase's answer parts from the first early).
- `agentic`: each session sends its previous answer back with an instruction to revise it (an agent's loop: the
  output of one call is the input of the next), its first turn a question. Most of an answer's revision repeats
  its prompt, which suffix decoding's per-request tree drafts from.

A workload is a small object: `prompts(n)` the n clients' prompts of the next run, `answered(texts)` their
answers (None: a failed client). Both are pure: the same answers give the same prompts.
"""
from __future__ import annotations

from .workshop import QUESTIONS

WORKLOADS = ("code", "workshop", "agentic")
PHRASINGS = ("words", "words", "paraphrase")     # how the k-th time round asks a question (k mod 3)
REVISE = "Revise the following answer: make it clearer and more precise, and keep it about as long.\n\n"


def workshop_prompt(request: int, questions=QUESTIONS) -> str:
    """The prompt of request number `request` (0, 1, ...) of a workshop run."""
    question = questions[request % len(questions)]
    return question[1] if PHRASINGS[request // len(questions) % len(PHRASINGS)] == "paraphrase" else question[0]


def revision_prompt(answer: str) -> str:
    """An agent's next call: its previous answer with the instruction to revise it."""
    return REVISE + answer.strip()


class Workshop:
    """Request numbers count on across runs: run t's client i asks request t·n + i."""
    name, chat = "workshop", True

    def __init__(self):
        self.asked = 0

    def prompts(self, n: int) -> list[str]:
        return [workshop_prompt(self.asked + i) for i in range(n)]

    def answered(self, texts: list) -> None:
        self.asked += len(texts)


class Agentic:
    """Session i's first prompt is question i mod 10; each later one revises session i's last answer (a failed
    turn asks again what it asked)."""
    name, chat = "agentic", True

    def __init__(self):
        self.answers: dict[int, str] = {}    # session -> its last answer

    def prompts(self, n: int) -> list[str]:
        return [revision_prompt(self.answers[i]) if i in self.answers else QUESTIONS[i % len(QUESTIONS)][0]
                for i in range(n)]

    def answered(self, texts: list) -> None:
        self.answers.update({i: t for i, t in enumerate(texts) if t})


def make_workload(name: str):
    """A fresh workload of `name` (one of WORKLOADS); None for `code`, whose prompts the clients pick themselves."""
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, got {name!r}")
    return {"workshop": Workshop, "agentic": Agentic}.get(name, lambda: None)()
