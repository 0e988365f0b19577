import json

import numpy as np
import pytest

import jaxstack.datalib as dl


def test_byte_tokenizer_round_trips_any_text_and_reserves_special_ids():
    tok = dl.ByteTokenizer()
    text = "héllo, 世界\n\x00"
    ids = tok.encode(text)
    assert min(ids) >= 3 and max(ids) < tok.vocab_size == 259
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == text
    assert isinstance(tok, dl.Tokenizer)


@pytest.fixture(scope="module")
def trained(corpus):
    docs = [corpus[i] for i in range(12)]
    return dl.BPETokenizer.train(docs, vocab_size=600)


def test_bpe_train_compresses_and_round_trips(trained, corpus):
    text = max((corpus[i] for i in range(12, 40)), key=len)[:3000]
    ids = trained.encode(text)
    assert trained.decode(ids) == text
    assert len(ids) < 0.75 * len(text.encode())  # merges learned from Python code
    assert trained.vocab_size == 600
    assert (trained.pad_id, trained.bos_id, trained.eos_id) == (0, 1, 2)


def test_bpe_save_and_from_file_give_the_same_ids(trained, tmp_path):
    path = trained.save(tmp_path)
    assert path.name == "tokenizer.json" and not list(tmp_path.glob("*.tmp"))
    loaded = dl.BPETokenizer.from_file(path)
    text = "def f(x):\n    return x + 1\n"
    assert loaded.encode(text) == trained.encode(text)
    assert (loaded.bos_id, loaded.eos_id, loaded.pad_id) == (1, 2, 0)


def test_hf_tokenizer_json_uses_special_tokens_from_tokenizer_config(trained, tmp_path):
    # An HF-style folder: tokenizer.json plus tokenizer_config.json naming the special tokens.
    backend = trained.backend
    backend.add_special_tokens(["<|endoftext|>", "<|im_start|>"])
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"eos_token": {"content": "<|endoftext|>"}, "bos_token": None, "pad_token": None}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = dl.BPETokenizer.from_file(tmp_path)
    assert tok.eos_id == backend.token_to_id("<|endoftext|>")
    assert tok.bos_id == 1  # not in the config: found by the common name "<bos>"
    assert tok.pad_id == 0


def test_tokenizer_errors_name_the_problem(tmp_path):
    with pytest.raises(dl.TokenizerError, match="no such tokenizer file"):
        dl.BPETokenizer.from_file(tmp_path / "missing.json")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(dl.TokenizerError, match=r"not a valid tokenizer\.json"):
        dl.BPETokenizer.from_file(tmp_path)
    with pytest.raises(dl.ConfigError, match="vocab_size"):
        dl.BPETokenizer.train(["abc"], vocab_size=10)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_chat_template_renders_like_hf_and_masks_only_assistant_replies(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"})
    )
    template = dl.ChatTemplate.from_tokenizer_config(tmp_path)
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    text = template.render(messages)
    assert text.startswith("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4")
    assert template.render(messages[:1], add_generation_prompt=True).endswith("assistant\n")
    tok = dl.ByteTokenizer()
    enc = template.encode(messages, tok)
    assert tok.decode(enc["tokens"]) == text
    learned = tok.decode(enc["tokens"][enc["loss_mask"] == 1])
    assert learned == "4<|im_end|>\n6<|im_end|>\n"


def test_a_model_folders_chat_template_is_found_where_transformers_looks(tmp_path):
    assert dl.ChatTemplate.from_model_folder(tmp_path) is None  # no template: no guess
    config = {"chat_template": CHATML, "bos_token": {"content": "<s>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    one = [{"role": "user", "content": "hi"}]
    assert dl.ChatTemplate.from_model_folder(tmp_path).render(one).startswith("<|im_start|>")
    # chat_template.jinja (transformers >= 4.43) wins; special tokens still come from the config
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}[{{ messages[0]['content'] }}]")
    assert dl.ChatTemplate.from_model_folder(tmp_path).render(one) == "<s>[hi]"
    (tmp_path / "chat_template.jinja").write_bytes(b"\xff\xfe")
    with pytest.raises(dl.TokenizerError, match=r"chat_template\.jinja: cannot read"):
        dl.ChatTemplate.from_model_folder(tmp_path)


def test_chat_template_sees_tools_and_documents_as_none_when_absent_like_transformers():
    # transformers passes tools=None and documents=None when the caller gives none, so
    # templates test `tools is not none` (Llama 3.1, Mistral); an undefined variable is not none.
    template = dl.ChatTemplate(
        "{{ 'no tools' if tools is none else tools | length }}, "
        "{{ 'no documents' if documents is none else documents[0]['title'] }}"
    )
    assert template.render([]) == "no tools, no documents"
    tools = [{"type": "function", "function": {"name": "f"}}]
    docs = [{"title": "A", "text": "a"}]
    assert template.render([], tools=tools, documents=docs) == "1, A"


def test_generation_blocks_render_their_body_as_transformers_does():
    # `{% generation %}` marks the assistant's tokens for transformers' assistant masks;
    # rendering gives the block's body unchanged.
    template = dl.ChatTemplate(
        "{% for m in messages %}{% if m['role'] == 'assistant' %}"
        "{% generation %}<a>{{ m['content'] }}</a>{% endgeneration %}"
        "{% else %}<u>{{ m['content'] }}</u>{% endif %}{% endfor %}"
    )
    conv = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    assert template.render(conv) == "<u>2+2?</u><a>4</a>"
    tok = dl.ByteTokenizer()
    enc = template.encode(conv, tok)
    assert tok.decode(enc["tokens"][enc["loss_mask"] == 1]) == "<a>4</a>"


def test_chat_template_errors(tmp_path):
    with pytest.raises(dl.TokenizerError, match="has no 'chat_template'"):
        dl.ChatTemplate.from_tokenizer_config({"eos_token": "x"})
    with pytest.raises(dl.TokenizerError, match="line"):
        dl.ChatTemplate("{% for %}")
    refusing = dl.ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(dl.TokenizerError, match="roles must alternate"):
        refusing.render([])


def test_chat_examples_feed_lm_batches_with_their_mask():
    template = dl.ChatTemplate(CHATML)
    tok = dl.ByteTokenizer()
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    docs = [template.encode(conv, tok) for _ in range(8)]
    it = dl.lm_batches(docs, tok, seq_len=128, batch_size=2, packing="pad", shuffle=False)
    batch = next(it)
    row = 0
    learned = batch["targets"][row][batch["loss_mask"][row] == 1]
    assert tok.decode(learned) == "hello<|im_end|>\n"
    assert np.all(batch["loss_mask"][batch["segment_ids"] == 0] == 0)
