"""The training corpus: the running interpreter's own standard-library sources (no download).

Selection (fixed and documented so anyone can reproduce it): every top-level `*.py` file of
`sysconfig.get_paths()["stdlib"]` (no packages, no tests directory), sorted by file name. Files
whose sorted index i has i % 10 == 9 are the validation split, the rest train. Documents are joined
with the end-of-text token (id 0) between them.

Vocabulary: the 95 printable ASCII characters plus tab and newline, after `<|endoftext|>` (0) and
"\ufffd" (1); any other character of the corpus (rare: a few accented names, form feeds) becomes
the unknown id 1. The record (python version, file count, characters, sha256) goes into model cards.
"""
from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..model.tokenizer import TextTokenizer

VOCAB_CHARS = "\t\n" + "".join(chr(c) for c in range(32, 127))
VAL_EVERY = 10


@dataclass
class CorpusRecord:
    python_version: str
    stdlib_dir: str
    selection: str
    train_files: int
    val_files: int
    train_chars: int
    val_chars: int
    unknown_chars: int
    sha256: str  # over the file names and contents, in order (train then validation)

    def to_dict(self) -> dict:
        return asdict(self)


def stdlib_files(stdlib_dir: str | Path | None = None) -> list[Path]:
    d = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    return sorted(d.glob("*.py"), key=lambda f: f.name)


def build_tokenizer() -> TextTokenizer:
    return TextTokenizer.char_level(VOCAB_CHARS)


def load_corpus(stdlib_dir: str | Path | None = None, tokenizer: TextTokenizer | None = None,
                max_files: int | None = None):
    """-> (train ids uint8 [N], val ids uint8 [M], tokenizer, CorpusRecord)."""
    files = stdlib_files(stdlib_dir)[:max_files]
    tok = tokenizer or build_tokenizer()
    h = hashlib.sha256()
    splits = {"train": [], "val": []}
    for i, f in enumerate(files):
        text = f.read_text(encoding="utf-8", errors="replace")
        splits["val" if i % VAL_EVERY == VAL_EVERY - 1 else "train"].append((f.name, text))
    out, chars, unk = {}, {}, 0
    for split in ("train", "val"):
        ids = []
        for name, text in splits[split]:
            h.update(name.encode() + b"\0" + text.encode("utf-8") + b"\0")
            enc = tok.encode(text)
            unk += enc.count(tok.unk_token_id)
            ids.extend(enc)
            ids.append(tok.eos_token_id)
        out[split] = np.array(ids, dtype=np.uint8)
        chars[split] = sum(len(t) for _, t in splits[split])
    record = CorpusRecord(
        python_version=platform.python_version(),
        stdlib_dir=str(Path(stdlib_dir or sysconfig.get_paths()["stdlib"])),
        selection=(f"top-level *.py of the stdlib, sorted by name{f', first {max_files}' if max_files else ''}; "
                   f"index % {VAL_EVERY} == {VAL_EVERY - 1} -> validation"),
        train_files=len(splits["train"]), val_files=len(splits["val"]),
        train_chars=chars["train"], val_chars=chars["val"], unknown_chars=unk, sha256=h.hexdigest())
    return out["train"], out["val"], tok, record
