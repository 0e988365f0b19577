"""Chat-template rendering from a Hugging Face `tokenizer_config.json`, for SFT data.

HF models ship their conversation format as a Jinja template (`chat_template`). `ChatTemplate`
renders it the way `transformers.apply_chat_template` does (sandboxed Jinja, trimmed blocks,
`raise_exception`, `tojson`, `{% generation %}` blocks, `tools` and `documents` None when
absent), without needing transformers, and `encode` turns a conversation
into a pre-tokenized document whose `loss_mask` is 1 only on the assistant's replies.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import numpy as np

from jaxstack.datalib._src.errors import TokenizerError
from jaxstack.datalib._src.tokenizer import Tokenizer, tokenize_text

Message = Mapping[str, Any]


def _raise_exception(message: str):
    raise TokenizerError(f"chat template refused the conversation: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: marks an assistant reply for transformers'
    assistant masks; rendered, it is its body unchanged."""

    tags = frozenset({"generation"})

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def _content(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    """A compiled chat template plus the special tokens it refers to."""

    def __init__(self, template: str, *, special_tokens: Mapping[str, str] | None = None):
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(template)
        except jinja2.TemplateSyntaxError as e:
            raise TokenizerError(f"chat template line {e.lineno}: {e.message}") from None
        self.source = template
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def from_tokenizer_config(
        cls, config: str | os.PathLike | Mapping[str, Any], *, name: str = "default"
    ) -> ChatTemplate:
        """Read `chat_template` (and bos/eos/pad/unk tokens) from a tokenizer_config.json.

        Args:
          config: the file, its folder, or the parsed dict.
          name: which template when the config holds several named ones (HF's list form).
        """
        where = "tokenizer config"
        if not isinstance(config, Mapping):
            path = pathlib.Path(config)
            if path.is_dir():
                path = path / "tokenizer_config.json"
            where = str(path)
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as e:
                raise TokenizerError(f"{path}: cannot read tokenizer config ({e})") from None
        template = config.get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template}
            if name not in named:
                raise TokenizerError(
                    f"{where}: no chat template named {name!r}; it has {sorted(named)}"
                )
            template = named[name]
        if not isinstance(template, str):
            raise TokenizerError(f"{where}: has no 'chat_template'; pass a template string")
        specials = {}
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = _content(config.get(key))
            if value is not None:
                specials[key] = value
        return cls(template, special_tokens=specials)

    @classmethod
    def from_model_folder(cls, folder: str | os.PathLike) -> ChatTemplate | None:
        """The chat template of a Hugging Face model folder, found where transformers looks:
        `chat_template.jinja` (the file transformers >= 4.43 writes; it wins), else
        `tokenizer_config.json`'s `chat_template`. The special tokens come from
        tokenizer_config.json either way. None when the folder has no template: a caller
        must not guess a conversation format the model was never trained on."""
        folder = pathlib.Path(folder)
        config_file = folder / "tokenizer_config.json"
        config: Mapping[str, Any] = {}
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise TokenizerError(f"{config_file}: cannot read tokenizer config ({e})") from None
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            try:
                config = {**config, "chat_template": jinja_file.read_text(encoding="utf-8")}
            except (OSError, UnicodeDecodeError) as e:
                raise TokenizerError(f"{jinja_file}: cannot read the chat template ({e})") from None
        if not config.get("chat_template"):
            return None
        return cls.from_tokenizer_config(config)

    def render(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = False, **kwargs
    ) -> str:
        """The conversation as the model sees it (`transformers.apply_chat_template` text).

        `tools` and `documents` are None unless given, as transformers passes them: templates
        test `tools is not none`, which an undefined variable would pass."""
        context = {**self.special_tokens, "tools": None, "documents": None, **kwargs}
        return self._template.render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **context
        )

    def encode(
        self, messages: Sequence[Message], tokenizer: Tokenizer, *, train_on: str = "assistant"
    ) -> dict[str, np.ndarray]:
        """Tokens of the rendered conversation and a mask of the tokens to learn.

        Each assistant reply is located by rendering the conversation up to it (with the
        generation prompt) and up to its end; the text in between is the reply, plus whatever
        end-of-turn marker the template writes. Pieces are tokenized separately, so the
        boundaries between prompt and reply never merge into one token.

        Returns:
          {"tokens": int32 [N], "loss_mask": int32 [N]} with 1 where the token is to be
          predicted; `lm_batches` accepts such dicts as pre-tokenized documents.
        """
        if train_on not in ("assistant", "all"):
            raise TokenizerError(f"train_on={train_on!r}; use 'assistant' or 'all'")
        full = self.render(messages)
        spans: list[tuple[int, int]] = []
        if train_on == "all":
            spans.append((0, len(full)))
        else:
            for i, message in enumerate(messages):
                if message.get("role") != "assistant":
                    continue
                prefix = self.render(messages[:i], add_generation_prompt=True)
                upto = self.render(messages[: i + 1])
                start, end = len(prefix), len(upto)
                if not (upto.startswith(prefix) and full.startswith(upto)):
                    raise TokenizerError(
                        f"chat template is not prefix-stable at message {i}: rendering a "
                        "shorter conversation does not give a prefix of the full one, so the "
                        "assistant tokens cannot be located; use train_on='all'"
                    )
                spans.append((start, end))
        tokens, mask, cursor = [], [], 0
        for start, end in [*spans, (len(full), len(full))]:
            for piece, learn in ((full[cursor:start], 0), (full[start:end], 1)):
                if piece:
                    ids = tokenize_text(tokenizer, piece)
                    tokens.append(ids)
                    mask.append(np.full(len(ids), learn, np.int32))
            cursor = end
        if not tokens:
            raise TokenizerError("chat template rendered an empty conversation")
        return {"tokens": np.concatenate(tokens), "loss_mask": np.concatenate(mask)}
