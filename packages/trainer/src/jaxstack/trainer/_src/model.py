"""Model wiring: nnlib config from the run config, the pure apply function, parameter specs."""

from __future__ import annotations

from typing import Any

import jax

from jaxstack.trainer._src.config import Config
from jaxstack.trainer._src.errors import ConfigError


def model_config(config: Config, tokenizer_vocab: int | None = None) -> Any:
    """nnlib `ModelConfig`: the preset, then the config's fields, then the tokenizer's vocab."""

    from jaxstack import nnlib

    fields = dict(config.model)
    base = nnlib.get_preset(fields.pop("preset", "tiny"))
    explicit_vocab = "vocab_size" in fields
    if tokenizer_vocab is not None and config.data.vocab_from_tokenizer and not explicit_vocab:
        fields["vocab_size"] = tokenizer_vocab
    if explicit_vocab and tokenizer_vocab is not None and fields["vocab_size"] < tokenizer_vocab:
        raise ConfigError(
            f"model.vocab_size={fields['vocab_size']} is smaller than the tokenizer's vocabulary "
            f"({tokenizer_vocab}); raise it or drop the override"
        )
    if fields.get("max_seq_len", base.max_seq_len) < config.data.seq_len:
        fields["max_seq_len"] = config.data.seq_len
    try:
        return base.replace(**fields)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model section {config.model!r} is not valid for nnlib: {e}") from e


def build_model(mcfg: Any, seed: int, attention_fn: Any = None) -> Any:
    """A concrete nnlib Transformer on the default device (host memory on CPU)."""
    from flax import nnx

    from jaxstack import nnlib

    return nnlib.Transformer(mcfg, rngs=nnx.Rngs(seed), attention_fn=attention_fn)


def abstract_model(mcfg: Any, seed: int = 0, attention_fn: Any = None) -> Any:
    """The Transformer with ShapeDtypeStruct leaves: nothing is allocated."""
    from flax import nnx

    from jaxstack import nnlib

    return nnx.eval_shape(
        lambda: nnlib.Transformer(mcfg, rngs=nnx.Rngs(seed), attention_fn=attention_fn)
    )


def functional(model: Any) -> tuple[Any, Any]:
    from jaxstack import nnlib

    return nnlib.as_function(model)


def param_specs(mcfg: Any, params: Any, rules: dict[str, Any]) -> Any:
    """PartitionSpec per parameter from nnlib's logical axes and the run's rules.

    For abstract parameters (a dry run) the specs are computed while tracing the model's
    construction under `jax.eval_shape`, so the Variables hold tracers rather than
    ShapeDtypeStructs and still nothing is allocated.
    """
    from flax import nnx

    from jaxstack import nnlib

    if not any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params)):
        return nnlib.partition_specs(params, rules)
    box: dict[str, Any] = {}

    def build() -> Any:
        model = nnlib.Transformer(mcfg, rngs=nnx.Rngs(0))
        box["specs"] = nnlib.partition_specs(nnx.state(model, nnx.Param), rules)
        return 0

    jax.eval_shape(build)
    return box["specs"]


def flops_per_token(mcfg: Any, seq_len: int) -> float:
    from jaxstack import nnlib

    return float(nnlib.training_flops_per_token(mcfg, seq_len))


def param_count(params: Any) -> int:
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
