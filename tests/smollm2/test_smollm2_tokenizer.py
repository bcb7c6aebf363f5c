"""The byte-level BPE tokenizer built from the GGUF, its chat template, and streaming text of partial characters."""
import json

import jinja2
import pytest

from engine.model.chat import ChatTemplate, chatml, recognise_template
from engine.model.tokenizer import StreamDecoder, TextTokenizer, byte_level_alphabet

TEXTS = [
    "The quick brown fox jumps over the lazy dog. It's 3:45 pm, isn't it?",
    "def fib(n: int) -> int:\n\tif n < 2:\n\t\treturn n\n    return fib(n - 1) + fib(n - 2)  # O(2**n)\n",
    "  leading spaces,\ttabs\n\n\nand   runs   of   spaces  ",
    "Café, naïve, Zürich, Ærøskøbing, São Paulo, Łódź",
    "北京欢迎你。東京は日本の首都です。서울",
    "Emoji: 😀👍🏽🇫🇷 and math: ∑ x² ≤ ∞ — “quotes” … «guillemets»",
    "Привет, мир! مرحبا بالعالم שלום עולם नमस्ते",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert "".join(tokenizer.stream_texts(ids)) == text          # streamed piece by piece: the same text
    assert b"".join(tokenizer.piece_bytes[i] for i in ids) == text.encode()


def test_byte_level_alphabet_is_the_tokenizers_one():
    from tokenizers import pre_tokenizers

    table = byte_level_alphabet()
    assert sorted(table.values()) == list(range(256))
    assert set(table) == set(pre_tokenizers.ByteLevel.alphabet())
    assert table["Ġ"] == ord(" ") and table["Ċ"] == ord("\n") and table["a"] == ord("a")


def test_partial_characters_are_held_back_while_streaming(tokenizer):
    ids = tokenizer.encode("北京 😀")
    pieces = [tokenizer.piece_bytes[i] for i in ids]
    assert any(_incomplete(p) for p in pieces)            # BPE cut inside a character here
    stream = StreamDecoder(tokenizer)
    texts = [stream.push(i) for i in ids]
    assert "" in texts and "\ufffd" not in "".join(texts) and "".join(texts) == "北京 😀"
    # a token shown on its own writes its incomplete bytes as escapes, never as a bare replacement character
    lone = next(i for i in ids if _incomplete(tokenizer.piece_bytes[i]))
    assert "\\x" in tokenizer.token_text(lone)


def _incomplete(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_a_stream_cut_inside_a_character_ends_with_the_replacement_character(tokenizer):
    ids = tokenizer.encode("😀")
    assert len(ids) > 1
    assert "".join(tokenizer.stream_texts(ids[:-1])) == tokenizer.decode(ids[:-1]) == "\ufffd"


def test_char_level_streaming_is_unchanged():
    tok = TextTokenizer.char_level("abc é\n")
    ids = tok.encode("abé c\n")
    assert tok.stream_texts(ids) == [tok.token_text(i) for i in ids] == list("abé c\n")


def test_special_tokens_digits_and_no_bos(tokenizer):
    assert tokenizer.encode("<|im_start|>user\nhi<|im_end|>")[:1] == [1]
    assert tokenizer.encode("<|im_end|>") == [2]
    assert len(tokenizer.encode("<|im_start|><|im_end|><|endoftext|><file_sep><jupyter_code>")) == 5
    assert [tokenizer.token_text(i) for i in tokenizer.encode("in 2024")] == ["in", " ", "2", "0", "2", "4"]
    assert tokenizer.encode("Hello")[0] != tokenizer.bos_token_id
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.vocab_size) == (1, 2, 49152)
    specials = [t for i, t in tokenizer.tokenizer.get_added_tokens_decoder().items() if t.special]
    assert len(specials) == 17


def test_chatml_renders_what_the_models_jinja_template_renders(smollm2_dir, tokenizer):
    """Our pure function against the GGUF's own Jinja template (run by jinja2 here, in the test only)."""
    template = json.loads((smollm2_dir / "tokenizer_config.json").read_text())["chat_template"]
    jinja = jinja2.Environment().from_string(template)
    chat = tokenizer.chat_template
    assert chat == recognise_template(template) == ChatTemplate(
        "chatml", "You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
         {"role": "user", "content": "and 3+3?"}],
    ]
    for messages in conversations:
        for gen in (True, False):
            assert chat.render(messages, gen) == jinja.render(messages=messages, add_generation_prompt=gen)
    assert chat.prompt("Hi") == chatml([{"role": "user", "content": "Hi"}], chat.default_system_prompt)
