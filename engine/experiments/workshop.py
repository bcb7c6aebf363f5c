"""A workshop's questions, and how `bench suffix` measures suffix decoding on them (cli/bench/suffix.py runs it).

A presenter asks the same questions of every audience, and a room asks them again, in the same words or in its own.
Suffix decoding drafts from earlier answers (engine/spec_decode/suffix.py), so each question is asked three times,
in phases: the first asking (nothing cached: what suffix decoding costs where it cannot help), the same words again
(its best case: the first answer is in the global tree) and a paraphrase (an answer that parts from the first after
a few tokens). Plain decoding and n-gram lookup (which sees only the request itself) run beside it in every phase.
"""
from __future__ import annotations

import statistics

from .compare import speedup

# (question, a paraphrase of it): general questions a chat model answers in a paragraph or a list
QUESTIONS = [
    ("What is photosynthesis?", "Can you explain how plants make their food from sunlight?"),
    ("How do vaccines work?", "In what way does a vaccine protect the body from a disease?"),
    ("What causes the seasons on Earth?", "Why does the Earth have summer and winter?"),
    ("What is a black hole?", "Can you describe what a black hole is?"),
    ("How does the internet work?", "Explain how computers on the internet talk to each other."),
    ("What are the benefits of regular exercise?", "Why is it good to exercise often?"),
    ("What is machine learning?", "Can you explain what machine learning means?"),
    ("How do I write a good cover letter?", "What makes a cover letter good?"),
    ("What is inflation?", "Can you explain what inflation means in economics?"),
    ("Why is the sky blue?", "What makes the sky look blue during the day?"),
]
# the phases of a question, in the order asked, and how a table names them
PHASES = {"first": "first asking (nothing cached)", "again": "the same words again", "paraphrase": "a paraphrase"}
METHODS = ("plain", "ngram", "suffix")
DRAFTING = ("ngram", "suffix")          # the methods that draft: their mean acceptance length and identical text


def prompt_of(question: tuple[str, str], phase: str) -> str:
    return question[1] if phase == "paraphrase" else question[0]


def run_order(questions: int, rounds: int) -> list[tuple[int, int, str, str]]:
    """(round, question, phase, method) in the order they run: per round and question the phases in order (suffix
    decoding's first asking fills the tree its later phases draft from), each phase's methods in order and in
    reverse order by turns (A B C, C B A, ...), so that a drift of the machine hits every method alike."""
    out = []
    for r in range(rounds):
        for q in range(questions):
            for phase in PHASES:
                methods = METHODS if len(out) // len(METHODS) % 2 == 0 else METHODS[::-1]
                out += [(r, q, phase, m) for m in methods]
    return out


def workshop_figures(runs: dict[tuple, dict]) -> dict:
    """Per phase, from runs keyed as `run_order` gives them, each {tokens_per_s (decode, None: failed), num_drafts,
    num_accepted_tokens, text}: each method's median tokens/s, the drafting methods' mean acceptance length (over
    all their rounds together), suffix decoding's paired speed-ups over plain and over n-gram (compare.py's
    median, spread and verdict over the (round, question) pairs), and whether every drafting run wrote plain's text."""
    pairs = sorted({(r, q) for r, q, _, _ in runs})
    out = {}
    for phase in PHASES:
        of = {m: [runs[r, q, phase, m] for r, q in pairs] for m in METHODS}

        def over(reference: str) -> dict:
            return speedup([s["tokens_per_s"] / x["tokens_per_s"] if s["tokens_per_s"] and x["tokens_per_s"] else None
                            for s, x in zip(of["suffix"], of[reference])], len(pairs))
        drafts = {m: sum(x["num_drafts"] for x in of[m]) for m in DRAFTING}
        out[phase] = {
            "tokens_per_s": {m: statistics.median(x["tokens_per_s"] or 0.0 for x in of[m]) for m in METHODS},
            "mean_acceptance_length": {m: 1 + sum(x["num_accepted_tokens"] for x in of[m]) / drafts[m] if drafts[m]
                                       else None for m in DRAFTING},
            "suffix_over_plain": over("plain"), "suffix_over_ngram": over("ngram"),
            "identical": all(x["text"] == p["text"] for m in DRAFTING for x, p in zip(of[m], of["plain"]))}
    return out
