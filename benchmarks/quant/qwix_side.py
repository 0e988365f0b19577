"""The Qwix side of benchmarks/quant: run with a Python that has `qwix` (never a workspace
dependency) and the jaxstack packages; prints one JSON object.

`qwix.quantize_model(module, qwix.PtqProvider(rules), *inputs)` on the trained nnlib model, the
way Qwix is meant to be used on Flax NNX, with the two adaptations Qwix needs here (quantlib
needs neither):

- Qwix finds a weight by intercepting `jnp.einsum` / `jnp.dot` / `lax.dot_general` and matching
  the operand to a module `Param` by identity, then replaces the Param on the module during its
  first call. nnlib's Dense computes `x @ kernel[...].astype(dtype).reshape(K, N)`: `@` runs
  inside `jnp.matmul`'s own jit, where Flax refuses the mutation (TraceContextError: "Cannot
  mutate 'Dense' from different trace level"), and the reshaped operand is no longer the Param.
  So every Dense here is given a [K, N] kernel (the same matrix view quantlib quantises) and a
  call that passes it to `jnp.einsum` as it is (`EinsumDense`).
- nnlib's Transformer runs each layer on a split/merge copy (one code path for remat and
  scan_layers), so Qwix's first-call replacements would land on the copies. Qwix is therefore
  applied to each Block and to the output head, and the quantised modules are put back.
"""

from __future__ import annotations

import argparse
import json
import math

import jax
import jax.numpy as jnp
import qwix
from flax import nnx

from jaxstack import nnlib
from jaxstack import quantlib as ql

RULES = {
    "int8": dict(weight_qtype="int8"),
    "w8a8": dict(weight_qtype="int8", act_qtype="int8"),
    "int4": dict(weight_qtype="int4", tile_size=128),
    "nf4": dict(weight_qtype="nf4", tile_size=64),
}


def perplexity(model, src, args) -> dict:
    """quantlib.perplexity's measure (and its per-batch losses) through `nnx.jit` (a Qwix model
    may update itself while it runs, so it is called as a module, not as a pure function)."""

    @nnx.jit
    def loss_sum(model, batch):
        logits = model(batch["tokens"], batch["positions"], batch["segment_ids"])[0]
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
        return jnp.sum(nll * batch["loss_mask"]), jnp.sum(batch["loss_mask"])

    batches = ql.validation_batches(src.tokenizer, seq_len=src.seq_len, batch_size=args.batch_size)
    sums, counts = [], []
    for _ in range(args.eval_batches):
        s, n = loss_sum(model, next(batches))
        sums.append(float(s))
        counts.append(float(n))
    return {
        "perplexity": math.exp(sum(sums) / sum(counts)),
        "batch_losses": [s / n for s, n in zip(sums, counts, strict=True)],
    }


class EinsumDense(nnlib.Dense):
    """nnlib's Dense with a [K, N] kernel handed to `jnp.einsum` unchanged (see the docstring)."""

    def __call__(self, x):
        lead = x.shape[: x.ndim - len(self.in_features)]
        x = x.astype(self.dtype).reshape(*lead, math.prod(self.in_features))
        # the Param's array itself, or the WithAux Qwix put in its place
        kernel = self.kernel.get_value() if isinstance(self.kernel, nnx.Param) else self.kernel
        y = jnp.einsum("...k,kn->...n", x, kernel)
        y = y.reshape(*lead, *self.out_features)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


def as_einsum_dense(model) -> None:
    for _, module in nnlib.iter_modules(model):
        if type(module) is nnlib.Dense:
            k = math.prod(module.in_features)
            module.kernel = nnx.Param(module.kernel[...].reshape(k, -1))
            module.__class__ = EinsumDense


def int_leaves(model) -> tuple[int, int]:
    """(number of leaves stored in a narrow type, bytes of the whole state)."""
    leaves = jax.tree.leaves(nnx.state(model))
    narrow = [x for x in leaves if jnp.dtype(x.dtype).itemsize == 1 or "int4" in str(x.dtype)]
    return len(narrow), sum(x.nbytes for x in leaves)


def quantize_with_qwix(src, name):
    provider = qwix.PtqProvider([qwix.QuantizationRule(module_path=".*", **RULES[name])])
    model = nnx.clone(src.model)
    as_einsum_dense(model)
    x = jnp.zeros((1, 8, src.model_config.d_model), jnp.float32)
    positions = jnp.arange(8, dtype=jnp.int32)[None]
    segments = jnp.ones((1, 8), jnp.int32)
    windows = src.model_config.layer_windows()
    for i, block in enumerate(model.layers):
        model.layers[i] = qwix.quantize_model(
            block,
            provider,
            x,
            positions,
            segments,
            attention_fn=model.attention_fn,
            sliding_window=windows[i],
            layer=i,
        )
    if model.lm_head is not None:
        model.lm_head = qwix.quantize_model(model.lm_head, provider, x)
    return model


def model_level(src, name, args) -> dict:
    try:
        q = quantize_with_qwix(src, name)
    except Exception as e:  # reported, not hidden: Qwix's own error on this model
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    n, total = int_leaves(q)
    return {"quantized_leaves": n, "state_bytes": total, **perplexity(q, src, args)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run")
    parser.add_argument("--eval-batches", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    src = ql.load_run(args.run)
    out = {"version": qwix.__version__ if hasattr(qwix, "__version__") else "?"}
    for name in RULES:
        out[name] = {"model": model_level(src, name, args)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
