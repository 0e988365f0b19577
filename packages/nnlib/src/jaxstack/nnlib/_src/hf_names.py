"""The map between nnlib parameter paths and HF transformers tensor names, per family.

Each TensorMap names one nnlib parameter (in per-layer form, `layers/3/attn/q_proj/kernel`)
and the HF tensors it is made of, with the two conversions. HF Linear weights are [out, in];
nnlib kernels are [in..., out...] with heads kept as their own axis. MoE expert stacks
[E, ...] come from E per-expert HF tensors (the on-disk layout `save_pretrained` writes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from jaxstack.nnlib._src.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class TensorMap:
    path: str
    hf_names: tuple[str, ...]
    hf_shapes: tuple[tuple[int, ...], ...]
    to_nnlib: Callable[[list[np.ndarray]], np.ndarray]
    to_hf: Callable[[np.ndarray], list[np.ndarray]]


def _linear(path, hf, in_shape, out_shape) -> TensorMap:
    """HF [prod(out), prod(in)] <-> nnlib [*in, *out]."""
    n_in, n_out = int(np.prod(in_shape)), int(np.prod(out_shape))
    return TensorMap(
        path,
        (hf,),
        ((n_out, n_in),),
        lambda ts: ts[0].T.reshape(*in_shape, *out_shape),
        lambda a: [np.ascontiguousarray(a.reshape(n_in, n_out).T)],
    )


def _same(path, hf, shape) -> TensorMap:
    return TensorMap(
        path, (hf,), (tuple(shape),), lambda ts: ts[0].reshape(shape), lambda a: [a.reshape(shape)]
    )


def _bias(path, hf, shape) -> TensorMap:
    """HF flat [prod(shape)] <-> nnlib [*shape]."""
    n = int(np.prod(shape))
    return TensorMap(
        path, (hf,), ((n,),), lambda ts: ts[0].reshape(shape), lambda a: [a.reshape(n)]
    )


def _experts(path, hfs, in_dim, out_dim) -> TensorMap:
    """E HF [out, in] tensors <-> nnlib [E, in, out]."""
    return TensorMap(
        path,
        tuple(hfs),
        tuple((out_dim, in_dim) for _ in hfs),
        lambda ts: np.stack([t.T for t in ts]),
        lambda a: [np.ascontiguousarray(e.T) for e in a],
    )


def tensor_maps(config: ModelConfig) -> list[TensorMap]:
    """Every parameter of a (LoRA-free) Transformer for `config`, in per-layer path form."""
    c = config
    d, h, k, hd, f, e = c.d_model, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim, c.num_experts
    maps = [
        _same("embed", "model.embed_tokens.weight", (c.vocab_size, d)),
        _same("final_norm/scale", "model.norm.weight", (d,)),
    ]
    if not c.tie_embeddings:
        maps.append(_linear("lm_head/kernel", "lm_head.weight", (d,), (c.vocab_size,)))
    for i in range(c.num_layers):
        p, hf = f"layers/{i}/", f"model.layers.{i}."
        maps.append(_same(p + "attn_norm/scale", hf + "input_layernorm.weight", (d,)))
        if c.sandwich_norm:
            maps += [
                _same(p + "post_attn_norm/scale", hf + "post_attention_layernorm.weight", (d,)),
                _same(p + "mlp_norm/scale", hf + "pre_feedforward_layernorm.weight", (d,)),
                _same(p + "post_mlp_norm/scale", hf + "post_feedforward_layernorm.weight", (d,)),
            ]
        else:
            maps.append(_same(p + "mlp_norm/scale", hf + "post_attention_layernorm.weight", (d,)))
        a, ha = p + "attn/", hf + "self_attn."
        maps += [
            _linear(a + "q_proj/kernel", ha + "q_proj.weight", (d,), (h, hd)),
            _linear(a + "k_proj/kernel", ha + "k_proj.weight", (d,), (k, hd)),
            _linear(a + "v_proj/kernel", ha + "v_proj.weight", (d,), (k, hd)),
            _linear(a + "o_proj/kernel", ha + "o_proj.weight", (h, hd), (d,)),
        ]
        if c.qkv_bias:
            maps += [
                _bias(a + "q_proj/bias", ha + "q_proj.bias", (h, hd)),
                _bias(a + "k_proj/bias", ha + "k_proj.bias", (k, hd)),
                _bias(a + "v_proj/bias", ha + "v_proj.bias", (k, hd)),
            ]
        if c.qk_norm:
            maps += [
                _same(a + "q_norm/scale", ha + "q_norm.weight", (hd,)),
                _same(a + "k_norm/scale", ha + "k_norm.weight", (hd,)),
            ]
        if not c.is_moe:
            maps += [
                _linear(p + "mlp/gate_proj/kernel", hf + "mlp.gate_proj.weight", (d,), (f,)),
                _linear(p + "mlp/up_proj/kernel", hf + "mlp.up_proj.weight", (d,), (f,)),
                _linear(p + "mlp/down_proj/kernel", hf + "mlp.down_proj.weight", (f,), (d,)),
            ]
            continue
        if c.family == "mixtral":
            m, names = hf + "block_sparse_moe.", ("w1", "w3", "w2")
        else:
            m, names = hf + "mlp.", ("gate_proj", "up_proj", "down_proj")
        experts = [f"{m}experts.{j}." for j in range(e)]
        maps += [
            _linear(p + "moe/router/kernel", m + "gate.weight", (d,), (e,)),
            _experts(p + "moe/gate_proj", [x + names[0] + ".weight" for x in experts], d, f),
            _experts(p + "moe/up_proj", [x + names[1] + ".weight" for x in experts], d, f),
            _experts(p + "moe/down_proj", [x + names[2] + ".weight" for x in experts], f, d),
        ]
    return maps
