"""ModelConfig: one frozen dataclass describes every decoder family nnlib builds.

A family (llama, mistral, qwen2, qwen3, gemma, gemma2, mixtral) is only a label plus a set of
switches (qkv bias, q/k norm, sliding window, (1+w) norms, soft caps, ...), so one Transformer
module covers them all and a new family is usually a new preset, not new code.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping
from typing import Any

from jaxstack.nnlib._src.errors import ConfigError

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "mixtral", "qwen3_moe")
REMAT_POLICIES = ("none", "full", "save_dots")
DTYPES = ("float32", "bfloat16", "float16")
ACTIVATIONS = ("silu", "gelu_tanh", "gelu")
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only transformer.

    Attributes (beyond the obvious sizes):
      rope_scaling: None, or a dict with "rope_type" "llama3" (keys factor, low_freq_factor,
        high_freq_factor, original_max_position_embeddings) or "linear" (key factor).
      norm_plus_one: Gemma's RMSNorm that scales by (1 + w) with w initialised to 0.
      embed_scale: multiply embeddings by sqrt(d_model) (Gemma).
      sandwich_norm: Gemma 2's extra norms after attention and after the MLP.
      layer_types: per layer "full_attention" or "sliding_attention"; None means every layer
        uses `sliding_window` when it is set.
      query_pre_attn_scalar: attention scale is query_pre_attn_scalar**-0.5 (Gemma 2);
        None means head_dim**-0.5.
      num_experts: 0 for dense models; >0 replaces every MLP by a top-k MoE block.
      router_renormalize: renormalise the top-k router weights to sum to 1 (Mixtral).
      moe_impl: "ragged" (sort by expert + jax.lax.ragged_dot: k expert MLPs per token on
        GPU/TPU, but XLA:CPU lowers it densely to k * E) or "dense" (every expert on every
        token, weighted by the sparse routing weights: E per token; faster on CPU when k > 1).
        Both are dropless and compute the same function.
      scan_layers: stack layer params on a leading "layers" axis and run them with lax.scan,
        so compile time does not grow with depth.
      remat: "none", "full" (recompute each layer in the backward pass) or "save_dots"
        (keep matmul outputs, recompute the rest).
      dtype: compute dtype; param_dtype: storage dtype of the parameters.
    """

    family: str = "llama"
    vocab_size: int = 4096
    d_model: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 64
    mlp_dim: int = 1024
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    norm_eps: float = 1e-5
    norm_plus_one: bool = False
    activation: str = "silu"
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    attn_logit_soft_cap: float | None = None
    final_logit_soft_cap: float | None = None
    query_pre_attn_scalar: float | None = None
    embed_scale: bool = False
    sandwich_norm: bool = False
    tie_embeddings: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    router_renormalize: bool = True
    moe_impl: str = "ragged"
    init_std: float = 0.02
    scan_layers: bool = False
    remat: str = "none"
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __hash__(self) -> int:
        # rope_scaling is a dict, so the generated field hash would fail; hash the JSON form.
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    def __post_init__(self):
        if self.rope_scaling is not None:
            object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first inconsistent field."""
        if self.family not in FAMILIES:
            raise ConfigError(f"family={self.family!r} is not one of {FAMILIES}")
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be positive")
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be positive and even (RoPE)")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads="
                f"{self.num_kv_heads}; GQA needs whole query groups"
            )
        if self.remat not in REMAT_POLICIES:
            raise ConfigError(f"remat={self.remat!r}; use one of {REMAT_POLICIES}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ConfigError(f"{name}={getattr(self, name)!r}; use one of {DTYPES}")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"activation={self.activation!r}; use one of {ACTIVATIONS}")
        if self.num_experts < 0 or (
            self.num_experts and not 0 < self.experts_per_token <= self.num_experts
        ):
            raise ConfigError(
                f"experts_per_token={self.experts_per_token} must be in [1, num_experts="
                f"{self.num_experts}] for a MoE model"
            )
        if self.moe_impl not in ("ragged", "dense"):
            raise ConfigError(f"moe_impl={self.moe_impl!r}; use 'ragged' or 'dense'")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise ConfigError(
                    f"layer_types has {len(self.layer_types)} entries, num_layers={self.num_layers}"
                )
            bad = [t for t in self.layer_types if t not in LAYER_TYPES]
            if bad:
                raise ConfigError(f"layer_types {bad} not in {LAYER_TYPES}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ConfigError(f"sliding_window={self.sliding_window} must be positive or None")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind not in ("llama3", "linear", "default"):
                raise ConfigError(
                    f"rope_scaling type {kind!r} is not supported; use 'llama3', 'linear' or None"
                )

    # --- derived values -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_scale(self) -> float:
        base = self.query_pre_attn_scalar if self.query_pre_attn_scalar else self.head_dim
        return float(base) ** -0.5

    def layer_windows(self) -> tuple[int | None, ...]:
        """Sliding window of each layer (None = full causal attention)."""
        if self.sliding_window is None:
            return (None,) * self.num_layers
        if self.layer_types is None:
            return (self.sliding_window,) * self.num_layers
        return tuple(
            self.sliding_window if t == "sliding_attention" else None for t in self.layer_types
        )

    # --- (de)serialisation ----------------------------------------------------------------
    def replace(self, **kw: Any) -> ModelConfig:
        unknown = set(kw) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"ModelConfig has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (tuples become lists)."""
        d = dataclasses.asdict(self)
        if d["layer_types"] is not None:
            d["layer_types"] = list(d["layer_types"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(
                f"unknown ModelConfig field(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        return cls(**d)

    @classmethod
    def from_hf_config(
        cls, config: Mapping[str, Any] | str | pathlib.Path, **overrides: Any
    ) -> ModelConfig:
        """Build a config from a Hugging Face `config.json` (a dict, a file or its folder)."""
        from jaxstack.nnlib._src.hf_config import config_from_hf

        if not isinstance(config, Mapping):
            path = pathlib.Path(config)
            if path.is_dir():
                path = path / "config.json"
            config = json.loads(path.read_text())
        return config_from_hf(cls, config, overrides)


def _to_hf(config: ModelConfig) -> dict[str, Any]:
    from jaxstack.nnlib._src.hf_config import config_to_hf

    return config_to_hf(config)


ModelConfig.to_hf_config = _to_hf
ModelConfig.to_hf_config.__doc__ = "The HF transformers config.json dict for this config."


def dtype_of(name: str):
    """The jnp dtype for a config dtype name."""
    import jax.numpy as jnp

    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}[name]


def dense_options(config: ModelConfig, rngs) -> dict:
    """The keyword arguments of a `Dense` layer that follow from the config: init std, compute
    and parameter dtypes, and the rngs to initialise from."""
    return dict(
        init_std=config.init_std,
        dtype=dtype_of(config.dtype),
        param_dtype=dtype_of(config.param_dtype),
        rngs=rngs,
    )
