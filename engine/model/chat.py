"""Chat templates as small pure functions (an instruct model's prompt format), never by evaluating a template.

ChatML, the format of SmolLM2-Instruct (and Qwen, and others), wraps every message in control tokens:

    <|im_start|>system
    You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
    <|im_start|>user
    What is the capital of France?<|im_end|>
    <|im_start|>assistant

The model answers after the last line and ends its turn with <|im_end|> (its EOS). SmolLM2's Jinja
template inserts its default system prompt when the conversation does not start with one;
tests/smollm2/test_smollm2_tokenizer.py checks that `chatml` renders exactly what that Jinja template renders.

A checkpoint says which format it uses in tokenizer_config.json (written by engine/model/gguf.py):
`"chat_format": "chatml"` and `"default_system_prompt"` next to Hugging Face's `chat_template`
string, which is kept for other tools and only ever read here to recognise the format.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


def chatml(messages: list[dict], default_system_prompt: str | None = None,
           add_generation_prompt: bool = True) -> str:
    """Render [{"role", "content"}] as ChatML; a default system message first when none is given."""
    out = []
    if default_system_prompt is not None and (not messages or messages[0]["role"] != "system"):
        out.append(f"{IM_START}system\n{default_system_prompt}{IM_END}\n")
    for m in messages:
        out.append(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n")
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)


FORMATS = {"chatml": chatml}


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat format: one of FORMATS, and its default system prompt (None: no system message)."""
    chat_format: str
    default_system_prompt: str | None = None

    def __post_init__(self):
        if self.chat_format not in FORMATS:
            raise ValueError(f"unknown chat format {self.chat_format!r}; known: {', '.join(FORMATS)}")

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return FORMATS[self.chat_format](messages, self.default_system_prompt, add_generation_prompt)

    def prompt(self, user_text: str, system_prompt: str | None = None) -> str:
        """One user turn (after an optional system prompt), ready for the assistant's answer."""
        messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
        return self.render(messages + [{"role": "user", "content": user_text}])

    def user_span(self, user_text: str, system_prompt: str | None = None) -> tuple[int, int]:
        """Where `user_text` sits in `prompt(user_text, system_prompt)`: [start, end) in characters; the rest
        of the prompt is the template's (control tokens, role names, the system prompt)."""
        marker = "\x00"                        # not in any format's own text
        start = self.prompt(marker, system_prompt).index(marker)
        return start, start + len(user_text)

    def to_config(self) -> dict:
        return {"chat_format": self.chat_format, "default_system_prompt": self.default_system_prompt}

    @classmethod
    def from_config(cls, config: dict) -> "ChatTemplate | None":
        """From tokenizer_config.json's fields (None when the model has no chat format)."""
        if not config.get("chat_format"):
            return None
        return cls(config["chat_format"], config.get("default_system_prompt"))


def marked_prompt_tokens(ids: list[int], texts: list[str], prompt_text: str, user_span: tuple[int, int]) -> list[dict]:
    """A prompt's tokens [{id, text}] (`texts`: what each adds to the text); those of the chat template, outside
    the user's text at `user_span` of `prompt_text`, carry "template": True."""
    tokens = [{"id": t, "text": text} for t, text in zip(ids, texts)]
    start, end = user_span
    if "".join(texts) != prompt_text or (start, end) == (0, len(prompt_text)):
        return tokens                       # no template, or text that does not decode back to itself
    at = 0
    for tok in tokens:
        n = len(tok["text"])
        if not (at < end and at + n > start) and n:
            tok["template"] = True
        at += n
    return tokens


_DEFAULT_SYSTEM = re.compile(re.escape(IM_START) + r"system\n(.*?)" + re.escape(IM_END), re.S)


def recognise_template(jinja_source: str) -> ChatTemplate | None:
    """Which of our formats a Hugging Face / GGUF Jinja chat template is, read (not run) from its text.

    ChatML when it emits <|im_start|> and <|im_end|>; the default system prompt is the literal text
    of a `<|im_start|>system\\n...<|im_end|>` in the template, if there is one.
    """
    if IM_START not in jinja_source or IM_END not in jinja_source:
        return None
    m = _DEFAULT_SYSTEM.search(jinja_source)
    default = m.group(1) if m and not any(c in m.group(1) for c in "{}'\"") else None
    return ChatTemplate("chatml", default)
