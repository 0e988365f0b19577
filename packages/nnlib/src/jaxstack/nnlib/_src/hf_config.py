"""Translate Hugging Face `config.json` dicts to ModelConfig and back.

Reads both the transformers 4.x keys (`rope_theta`, `rope_scaling`) and the 5.x ones
(`rope_parameters`). Settings nnlib does not implement raise ConfigError rather than load a
model that would silently compute something else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxstack.nnlib._src.errors import ConfigError

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
# The families whose transformers modules read these flags (one flag for q, k, v and o_proj
# alike); the others hard-code their biases and ignore the key: qwen2 always has q/k/v biases
# and no o_proj bias, mistral and mixtral have none.
_READS_ATTENTION_BIAS = frozenset({"llama", "qwen3", "qwen3_moe", "gemma", "gemma2"})
_READS_MLP_BIAS = frozenset({"llama"})
# What transformers' config class of each family assumes for a key that config.json leaves out,
# where that differs from the fallbacks below (which are llama's); rope_theta is `_rope`'s.
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "mistral": {
        "num_key_value_heads": 8,
        "sliding_window": 4096,
        "max_position_embeddings": 131072,
    },
    "mixtral": {
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "qwen2": {"num_key_value_heads": 32, "max_position_embeddings": 32768},
    "qwen3": {
        "num_key_value_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
    },
    "gemma": {"num_key_value_heads": 16, "head_dim": 256, "max_position_embeddings": 8192},
    "gemma2": {
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
        "query_pre_attn_scalar": 256,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
}
_HF_DEFAULT_ROPE_THETA = {"mixtral": 1e6}
# Keys without which a config.json does not describe a checkpoint (transformers falls back to
# its class defaults, the sizes of some 7B model).
_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu": "gelu",
}


def _rope(d: Mapping[str, Any], family: str) -> tuple[float, dict | None]:
    params = d.get("rope_parameters") or {}
    theta = d.get("rope_theta", params.get("rope_theta", _HF_DEFAULT_ROPE_THETA.get(family, 1e4)))
    scaling = d.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type")) if scaling else None
    if kind in (None, "default"):
        return float(theta), None
    if kind not in ("llama3", "linear"):
        raise ConfigError(f"rope scaling type {kind!r} is not supported (llama3, linear, default)")
    return float(theta), {
        "rope_type": kind,
        **{k: v for k, v in scaling.items() if k not in ("rope_type", "type")},
    }


def _qwen3_sliding_window(d: Mapping[str, Any], family: str, num_layers: int) -> dict[str, Any]:
    """Qwen's rule (transformers' Qwen3Config/Qwen3MoeConfig): a window only with
    `use_sliding_window`; qwen3 slides in layers `max_window_layers` and up (or as
    `layer_types` says), qwen3_moe in every layer."""
    window = d.get("sliding_window") if d.get("use_sliding_window") else None
    if window is None:
        return {}
    if family == "qwen3_moe":
        return {"sliding_window": window}
    first = d.get("max_window_layers", 28)
    types = d.get("layer_types") or [
        "sliding_attention" if i >= first else "full_attention" for i in range(num_layers)
    ]
    return {"sliding_window": window, "layer_types": tuple(types)}


def _with_hf_defaults(d: Mapping[str, Any], family: str) -> dict[str, Any]:
    """`d` completed as transformers completes it, or a ConfigError for what nnlib cannot run."""
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise ConfigError(
            f"config.json ({family}) lacks {missing}, so it does not say which model it holds"
        )
    if d.get("use_bidirectional_attention"):
        raise ConfigError(
            f"use_bidirectional_attention=true ({family}) makes every token attend to every "
            "other, and nnlib's attention is causal only, so this checkpoint cannot be loaded"
        )
    if d.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(
            f"partial_rotary_factor={d['partial_rotary_factor']} rotates only part of each head "
            "in transformers, and nnlib's RoPE rotates all of it, so this checkpoint cannot be "
            "loaded"
        )
    if family == "mixtral" and "num_local_experts" not in d and "num_experts" in d:
        d = {**d, "num_local_experts": d["num_experts"]}  # MixtralConfig's attribute_map
    return {**_HF_DEFAULTS.get(family, {}), **d}


def config_from_hf(cls, d: Mapping[str, Any], overrides: Mapping[str, Any]):
    family = d.get("model_type")
    if family not in _ARCHITECTURES:
        raise ConfigError(
            f"model_type={family!r} is not supported; supported: {sorted(_ARCHITECTURES)}"
        )
    d = _with_hf_defaults(d, family)
    if d.get("mlp_bias") and family in _READS_MLP_BIAS:
        raise ConfigError(
            f"mlp_bias=true ({family}) adds biases to gate/up/down_proj in transformers, which "
            "nnlib's MLP does not have, so this checkpoint cannot be loaded"
        )
    heads = d["num_attention_heads"]
    kw: dict[str, Any] = dict(
        family=family,
        vocab_size=d["vocab_size"],
        d_model=d["hidden_size"],
        num_layers=d["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=d.get("num_key_value_heads") or heads,
        head_dim=d.get("head_dim") or d["hidden_size"] // heads,
        mlp_dim=d["intermediate_size"],
        max_seq_len=d.get("max_position_embeddings", 2048),
        norm_eps=d.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(d.get("tie_word_embeddings", family in ("gemma", "gemma2"))),
    )
    kw["rope_theta"], kw["rope_scaling"] = _rope(d, family)
    stored = d.get("dtype") or d.get("torch_dtype")
    if stored in ("float32", "bfloat16", "float16"):
        kw["param_dtype"] = stored  # keep the checkpoint's precision (and memory footprint)
    act = d.get("hidden_activation") or d.get("hidden_act") or "silu"
    if family in ("gemma", "gemma2") and not d.get("hidden_activation"):
        act = "gelu_pytorch_tanh"  # HF Gemma ignores hidden_act and uses the tanh approximation
    if act not in _ACTIVATIONS:
        raise ConfigError(f"activation {act!r} is not supported; supported: {sorted(_ACTIVATIONS)}")
    kw["activation"] = _ACTIVATIONS[act]
    if d.get("attention_bias") and family in _READS_ATTENTION_BIAS:
        raise ConfigError(
            f"attention_bias=true ({family}) adds biases to q/k/v and to o_proj in transformers, "
            "and nnlib's attention has no o_proj bias, so this checkpoint cannot be loaded"
        )
    kw["qkv_bias"] = family == "qwen2"
    kw["qk_norm"] = family in ("qwen3", "qwen3_moe")
    if family == "qwen2":
        window = d.get("sliding_window") if d.get("use_sliding_window") else None
        if window is not None:
            raise ConfigError("qwen2 use_sliding_window=true (max_window_layers) is not supported")
    elif family in ("qwen3", "qwen3_moe"):
        kw.update(_qwen3_sliding_window(d, family, kw["num_layers"]))
    elif family in ("mistral", "mixtral", "gemma2"):
        kw["sliding_window"] = d.get("sliding_window")
    if family == "gemma2":
        n = kw["num_layers"]
        kw["layer_types"] = tuple(
            d.get("layer_types")
            or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
        )
    if family in ("gemma", "gemma2"):
        kw.update(norm_plus_one=True, embed_scale=True)
    if family == "gemma2":
        kw.update(
            sandwich_norm=True,
            attn_logit_soft_cap=d.get("attn_logit_softcapping"),
            final_logit_soft_cap=d.get("final_logit_softcapping"),
            query_pre_attn_scalar=d.get("query_pre_attn_scalar"),
        )
    if family == "mixtral":
        kw.update(num_experts=d["num_local_experts"], experts_per_token=d["num_experts_per_tok"])
    if family == "qwen3_moe":
        if d.get("mlp_only_layers") or d.get("decoder_sparse_step", 1) != 1:
            raise ConfigError(
                "qwen3_moe with mlp_only_layers / decoder_sparse_step != 1 is not supported"
            )
        kw.update(
            num_experts=d.get("num_experts") or d["num_local_experts"],
            experts_per_token=d["num_experts_per_tok"],
            mlp_dim=d["moe_intermediate_size"],
            router_renormalize=bool(d.get("norm_topk_prob", True)),
        )
    kw.update(overrides)
    return cls(**kw)


def config_to_hf(config) -> dict[str, Any]:
    """The HF config.json dict for a ModelConfig (transformers 4.x and 5.x both read it)."""
    c = config
    d: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[c.family]],
        "model_type": c.family,
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.mlp_dim,
        "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": dict(c.rope_scaling) if c.rope_scaling else None,
        "tie_word_embeddings": c.tie_embeddings,
        "torch_dtype": c.param_dtype,
        "dtype": c.param_dtype,
    }
    act = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}[c.activation]
    d["hidden_activation" if c.family.startswith("gemma") else "hidden_act"] = act
    d.update(_hf_attention_bias(c))
    if c.sliding_window is not None or "sliding_window" in _HF_DEFAULTS.get(c.family, {}):
        d["sliding_window"] = c.sliding_window  # null, where a missing key means a window
    if c.layer_types is not None:
        d["layer_types"] = list(c.layer_types)
    if c.family in ("qwen3", "qwen3_moe"):
        d.update(_hf_qwen3_sliding_window(c))
    if c.family == "gemma2":
        d.update(
            attn_logit_softcapping=c.attn_logit_soft_cap,
            final_logit_softcapping=c.final_logit_soft_cap,
            query_pre_attn_scalar=c.query_pre_attn_scalar or c.head_dim,
        )
    if c.family == "mixtral":
        d.update(num_local_experts=c.num_experts, num_experts_per_tok=c.experts_per_token)
    if c.family == "qwen3_moe":
        d.update(
            num_experts=c.num_experts,
            num_experts_per_tok=c.experts_per_token,
            moe_intermediate_size=c.mlp_dim,
            norm_topk_prob=c.router_renormalize,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return d


def _hf_attention_bias(c) -> dict[str, Any]:
    """HF qwen2 always has q/k/v biases (no key); elsewhere `attention_bias` also means o_proj."""
    if c.family == "qwen2":
        if not c.qkv_bias:
            raise ConfigError(
                "an HF qwen2 config always has q/k/v biases; this qwen2 model has qkv_bias=False, "
                "so it has no HF form (use family llama or qwen3)"
            )
        return {}
    if c.qkv_bias:
        raise ConfigError(
            f"qkv_bias=True has no HF {c.family} config: attention_bias=true would also add an "
            "o_proj bias; q/k/v-only biases are family qwen2"
        )
    return {"attention_bias": False}


def _hf_qwen3_sliding_window(c) -> dict[str, Any]:
    if c.sliding_window is None:
        return {"use_sliding_window": False}
    if c.family == "qwen3_moe":
        if c.layer_types is not None and set(c.layer_types) != {"sliding_attention"}:
            raise ConfigError("qwen3_moe slides in every layer in HF; layer_types cannot differ")
        return {"use_sliding_window": True}
    types = c.layer_types or ("sliding_attention",) * c.num_layers
    full = [t == "full_attention" for t in types]
    # max_window_layers for transformers 4.x readers; layer_types states it exactly for 5.x.
    first = full.index(False) if False in full else c.num_layers
    return {"use_sliding_window": True, "max_window_layers": first, "layer_types": list(types)}
