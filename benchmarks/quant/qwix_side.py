"""The Qwix side of benchmarks/quant: run with a Python that has `qwix` (never a workspace
dependency) and the jaxstack packages; prints one JSON object.

Two ways of applying Qwix to the same trained weights:
- `model`: `qwix.quantize_model(model, qwix.PtqProvider(rules), ...)` on the nnlib model, the
  way Qwix is meant to be used; the row records how many weights Qwix stored quantised.
- `numerics`: every Dense kernel quantised with `qwix.quantize` (same [K, N] view, channel
  axis and tiles as quantlib) and dequantised back into the float model: Qwix's rounding and
  scales on the same weights, independent of how its interception finds them.
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


def perplexity(model, src, args) -> float:
    batches = ql.validation_batches(src.tokenizer, seq_len=src.seq_len, batch_size=args.batch_size)
    return ql.perplexity(model, batches, args.eval_batches)["perplexity"]


def perplexity_nnx_jit(model, src, args) -> float:
    """The same measure through `nnx.jit` (a Qwix model mutates itself while it runs)."""

    @nnx.jit
    def loss_sum(model, batch):
        logits = model(batch["tokens"], batch["positions"], batch["segment_ids"])[0]
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
        return jnp.sum(nll * batch["loss_mask"]), jnp.sum(batch["loss_mask"])

    batches = ql.validation_batches(src.tokenizer, seq_len=src.seq_len, batch_size=args.batch_size)
    total = tokens = 0.0
    for _ in range(args.eval_batches):
        s, n = loss_sum(model, next(batches))
        total, tokens = total + float(s), tokens + float(n)
    return math.exp(total / tokens)


def int_leaves(model) -> tuple[int, int]:
    """(number of leaves stored in a narrow type, bytes of the whole state)."""
    leaves = jax.tree.leaves(nnx.state(model))
    narrow = [x for x in leaves if jnp.dtype(x.dtype).itemsize == 1 or "int4" in str(x.dtype)]
    return len(narrow), sum(x.nbytes for x in leaves)


def model_level(src, name, args) -> dict:
    rules = [qwix.QuantizationRule(module_path=".*", **RULES[name])]
    tokens = jnp.zeros((1, 8), jnp.int32)
    positions = jnp.arange(8, dtype=jnp.int32)[None]
    model = nnlib.Transformer(src.model_config, rngs=nnx.Rngs(0))  # built eagerly, as Qwix
    nnx.update(model, nnx.state(src.model))  # expects, then given the trained weights
    try:
        q = qwix.quantize_model(model, qwix.PtqProvider(rules), tokens, positions)
    except Exception as e:  # reported, not hidden: Qwix's own error on this model
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    n, total = int_leaves(q)
    try:
        ppl = perplexity_nnx_jit(q, src, args)
    except Exception as e:
        ppl = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return {"quantized_leaves": n, "state_bytes": total, "perplexity": ppl}


def numerics(src, name, args) -> dict:
    spec = RULES[name]
    model = nnx.clone(src.model)
    qbytes = fbytes = 0
    try:
        for _, module in nnlib.iter_modules(model):
            if not isinstance(module, nnlib.Dense):
                continue
            w = module.kernel[...]
            k = math.prod(module.in_features)
            tiles = {0: spec["tile_size"]} if "tile_size" in spec else None
            qa = qwix.quantize(
                w.reshape(k, -1), spec["weight_qtype"], channelwise_axes=[1], tiled_axes=tiles
            )
            qbytes += sum(x.nbytes for x in jax.tree.leaves(qa))
            fbytes += w.nbytes
            module.kernel[...] = qwix.dequantize(qa).reshape(w.shape).astype(w.dtype)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    return {
        "quantized_bytes": qbytes,
        "float_bytes": fbytes,
        "perplexity": perplexity(model, src, args),
    }


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
        if name != "w8a8":  # activations need Qwix's interception; see the model row
            out[name]["numerics"] = numerics(src, name, args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
