"""Tokenizers behind one small interface, stored as a `tokenizer.json` the `tokenizers` library reads.

Our own models are character level: every character of the training corpus is one token, plus
`<|endoftext|>` (id 0, between documents) and U+FFFD "�" (id 1) for characters the model never saw.

Policy for characters outside the vocabulary: they become "�" (visible in the output, and the model
treats them as the unknown character it saw during training); `encode(text, strict=True)` raises
`UnknownCharactersError` naming them instead. Nothing unknown ever reaches numpy as a bad index.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "\ufffd"


class UnknownCharactersError(ValueError):
    def __init__(self, chars: list[str]):
        self.chars = chars
        shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in chars[:10])
        more = f" and {len(chars) - 10} more" if len(chars) > 10 else ""
        super().__init__(f"characters not in the model's vocabulary: {shown}{more}")


class TextTokenizer:
    """A thin wrapper over `tokenizers.Tokenizer` with the few things the engine needs."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_token_id = tokenizer.token_to_id(EOS_TOKEN)
        self.unk_token_id = tokenizer.token_to_id(UNK_TOKEN)
        # id -> text, so that a streamed token is decoded without a library call per token
        self.pieces = [tokenizer.decode([i], skip_special_tokens=False) for i in range(self.vocab_size)]

    @classmethod
    def char_level(cls, corpus_chars: str) -> "TextTokenizer":
        """Build a character tokenizer over the distinct characters of `corpus_chars`, sorted."""
        vocab = {EOS_TOKEN: 0, UNK_TOKEN: 1}
        for ch in sorted(set(corpus_chars) - set(vocab)):
            vocab[ch] = len(vocab)
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        tok.add_special_tokens([EOS_TOKEN])
        return cls(tok)

    @classmethod
    def from_file(cls, path: str | Path) -> "TextTokenizer":
        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: str | Path) -> None:
        self.tokenizer.save(str(path))

    def unknown_characters(self, text: str) -> list[str]:
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        return sorted({text[a:b] for (a, b), i in zip(enc.offsets, enc.ids) if i == self.unk_token_id})

    def encode(self, text: str, strict: bool = False) -> list[int]:
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        if strict and self.unk_token_id is not None and self.unk_token_id in enc.ids:
            raise UnknownCharactersError(self.unknown_characters(text))
        return enc.ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        return self.pieces[token_id]
