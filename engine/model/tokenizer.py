"""Tokenizers behind one small interface, stored as a `tokenizer.json` the `tokenizers` library reads.

Our own models are character level: every character of the training corpus is one token, plus
`<|endoftext|>` (id 0, between documents) and U+FFFD "�" (id 1) for characters the model never saw.

Policy for characters outside the vocabulary: they become "�" (visible in the output, and the model
treats them as the unknown character it saw during training); `encode(text, strict=True)` raises
`UnknownCharactersError` naming them instead. Nothing unknown ever reaches numpy as a bad index.

Byte-level BPE (GPT-2's scheme; SmolLM2's tokenizer, engine/model/gguf.py) has no unknown characters: a
token is a run of UTF-8 *bytes*, written in the tokenizer's vocabulary as printable stand-in characters
(`byte_level_alphabet`). One token may end in the middle of a multi-byte character ("é" = C3 A9 can be
two tokens), so the text of a token stream is decoded with `StreamDecoder`, which holds back incomplete
bytes: joining its pieces always gives `decode(ids)`. A token shown on its own (a draft, a top-5
alternative) uses `token_text`, where incomplete bytes are written as escapes (\\xe2).

A `tokenizer_config.json` next to `tokenizer.json` (Hugging Face's file) may name the EOS/BOS tokens
and the chat format (engine/model/chat.py).
"""
from __future__ import annotations

import codecs
import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from .chat import ChatTemplate

EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "\ufffd"


class UnknownCharactersError(ValueError):
    def __init__(self, chars: list[str]):
        self.chars = chars
        shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in chars[:10])
        more = f" and {len(chars) - 10} more" if len(chars) > 10 else ""
        super().__init__(f"characters not in the model's vocabulary: {shown}{more}")


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, stand-in character -> byte.

    Bytes that are printable Latin-1 characters ("!".."~", "¡".."¬", "®".."ÿ") stand for themselves;
    the other 68 (controls, space, ...) are given the characters 256, 257, ... in byte order, so that
    a space is "Ġ" (U+0120) and a newline "Ċ" (U+010A).
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in table.values()]
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


class TextTokenizer:
    """A thin wrapper over `tokenizers.Tokenizer` with the few things the engine needs."""

    def __init__(self, tokenizer: Tokenizer, config: dict | None = None):
        self.tokenizer = tokenizer
        self.config = dict(config or {})        # tokenizer_config.json: eos/bos tokens, chat format
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_token_id = tokenizer.token_to_id(self.config.get("eos_token") or EOS_TOKEN)
        self.bos_token_id = tokenizer.token_to_id(self.config["bos_token"]) if self.config.get("bos_token") else None
        self.unk_token_id = tokenizer.token_to_id(UNK_TOKEN)
        self.chat_template = ChatTemplate.from_config(self.config)
        self.byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)
        # id -> bytes and id -> text, so that a streamed token is decoded without a library call per token
        if self.byte_level:
            alphabet = byte_level_alphabet()
            added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
            self.piece_bytes = [added[i].encode() if i in added else
                                bytes(alphabet[c] for c in tokenizer.id_to_token(i)) for i in range(self.vocab_size)]
        else:
            self.piece_bytes = [tokenizer.decode([i], skip_special_tokens=False).encode()
                                for i in range(self.vocab_size)]
        self.pieces = [b.decode("utf-8", errors="backslashreplace") for b in self.piece_bytes]

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
        """tokenizer.json, with the tokenizer_config.json beside it if there is one."""
        path = Path(path)
        config_file = path.with_name("tokenizer_config.json")
        config = json.loads(config_file.read_text()) if config_file.is_file() else None
        return cls(Tokenizer.from_file(str(path)), config)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        self.tokenizer.save(str(path))
        if self.config:
            path.with_name("tokenizer_config.json").write_text(json.dumps(self.config, indent=2) + "\n")

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
        """One token's text on its own; bytes of an incomplete UTF-8 character as escapes (\\xe2)."""
        return self.pieces[token_id]

    def stream_texts(self, ids) -> list[str]:
        """The text each token adds to the stream: joined, exactly `decode(ids)` (a piece may be "")."""
        stream = StreamDecoder(self)
        texts = [stream.push(i) for i in ids]
        if texts:
            texts[-1] += stream.flush()
        return texts


class StreamDecoder:
    """Incremental detokenizer: the text each new token completes, holding back a partial character.

    NOTE: joining every `push` and a final `flush` gives decode(all ids); invalid bytes become "�",
    as in decode. For tokenizers whose tokens are whole characters nothing is ever held back.
    """

    def __init__(self, tokenizer: TextTokenizer):
        self._bytes = tokenizer.piece_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._bytes[token_id])

    def flush(self) -> str:
        """What is still held back (an incomplete character at the end becomes "�")."""
        return self._utf8.decode(b"", final=True)
