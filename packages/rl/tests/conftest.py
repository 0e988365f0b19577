import json

import pytest

TINY_MODEL = {
    "d_model": 32,
    "num_layers": 1,
    "num_heads": 2,
    "num_kv_heads": 2,
    "head_dim": 16,
    "mlp_dim": 64,
    "max_seq_len": 128,
}
TINY = [
    "model.preset=tiny-llama",
    *(f"model.{key}={value}" for key, value in TINY_MODEL.items()),
    "log.tensorboard=false",
    "log.report=false",
    "log.progress=plain",
]


@pytest.fixture
def write_jsonl():
    """`write_jsonl(path, records) -> path`: one JSON object per line."""

    def write(path, records):
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path

    return write


@pytest.fixture
def tiny():
    return list(TINY)


@pytest.fixture
def tiny_hf():
    """`tiny` for runs from an `init.hf` folder, which defines the model: the log settings."""
    return [item for item in TINY if not item.startswith("model.")]


@pytest.fixture
def tiny_model_config():
    """The model that `tiny`'s overrides describe (vocab_size comes from the run's tokenizer)."""
    from jaxstack import nnlib

    return nnlib.get_preset("tiny-llama").replace(**TINY_MODEL)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def hf_folder(tmp_path):
    """`hf_folder(name="hf", vocab_size=None) -> folder`: a tiny Llama HF folder with a
    byte-level BPE tokenizer (chat-ML special tokens, eos <|endoftext|>, no bos), a
    tokenizer_config.json with a chat-ML template, a generation_config.json and weights."""

    def make(name="hf", vocab_size=None):
        import tokenizers
        from flax import nnx
        from tokenizers import decoders, models, pre_tokenizers, trainers

        from jaxstack import nnlib

        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        trainer = trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(["user assistant 2+2=4 echo hello world"] * 20, trainer=trainer)
        size = tok.get_vocab_size()
        model = nnlib.Transformer(
            nnlib.get_preset("tiny-llama").replace(vocab_size=vocab_size or size, **TINY_MODEL),
            rngs=nnx.Rngs(0),
        )
        config = {
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "bos_token": None,
            "chat_template": CHATML,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
        ids = {"eos_token_id": tok.token_to_id("<|endoftext|>")}
        return nnlib.save_hf_checkpoint(
            model,
            tmp_path / name,
            special_token_ids=ids,
            generation_config={
                "eos_token_id": [tok.token_to_id("<|im_end|>"), ids["eos_token_id"]]
            },
            files={"tokenizer.json": tok.to_str(), "tokenizer_config.json": json.dumps(config)},
        )

    return make
