"""benchmarks/quant: jaxstack-quantlib against Qwix on the same trained weights.

For each run directory (the tiny main-job model, a d=512 model): validation perplexity and
weight bytes of float32, int8 weight-only, w8a8 (dynamic), int4 (tile 128), nf4 (tile 64) and
int4 QAT (a few fine-tuning steps with fake quantisation, then PTQ; a float fine-tune of the
same steps is the control), the Qwix rows from `qwix_side.py` run in a Python with qwix, and
the CPU decode step time at batch 1 for float32 versus int8 weight-only. Writes results.json
and results.md next to this file. See README.md for the commands.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
import jax
import jax.numpy as jnp
import optax
from conditions import conditions_markdown, measure_conditions
from flax import nnx

from jaxstack import nnlib
from jaxstack import quantlib as ql

HERE = pathlib.Path(__file__).parent
ROWS = {
    "int8": (ql.QuantRule(".*", "int8"),),
    "w8a8": (ql.QuantRule(".*", "int8", act_qtype="int8"),),
    "int4": (ql.QuantRule(".*", "int4", tile_size=128),),
    "nf4": (ql.QuantRule(".*", "nf4", tile_size=64),),
}


def perplexity(model, src, args) -> float:
    batches = ql.validation_batches(src.tokenizer, seq_len=src.seq_len, batch_size=args.batch_size)
    return ql.perplexity(model, batches, args.eval_batches)["perplexity"]


def fine_tune(model, src, args, rules=None):
    """`args.qat_steps` AdamW steps on training batches (QAT when rules are given)."""
    model = ql.quantize(model, ql.QatProvider(rules)) if rules else nnx.clone(model)
    apply, params = nnlib.as_function(model)
    tx = optax.adamw(args.qat_lr)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, batch):
        def loss(p):
            logits = apply(p, batch["tokens"], batch["positions"], batch["segment_ids"])[0]
            logp = jax.nn.log_softmax(logits)
            nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
            return jnp.sum(nll * batch["loss_mask"]) / jnp.sum(batch["loss_mask"])

        grads = jax.grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt

    batches = ql.validation_batches(
        src.tokenizer, seq_len=src.seq_len, batch_size=args.batch_size, split="train"
    )
    for _ in range(args.qat_steps):
        params, opt = step(params, opt, next(batches))
    nnx.update(model, params)
    return model


def decode_ms(model, config, args) -> list[float]:
    """Per-step times (ms) of a jitted one-token decode step with a KV cache, batch 1."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state, token, position, cache):
        logits, cache = nnx.merge(graphdef, state)(token, position, None, cache)
        return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None], cache

    cache = nnlib.ContiguousKVCache.create(config, 1, args.decode_steps + 8)
    token = jnp.ones((1, 1), jnp.int32)
    times = []
    for i in range(args.decode_steps + 3):
        t0 = time.perf_counter()
        token, cache = step(state, token, jnp.full((1, 1), i, jnp.int32), cache)
        token.block_until_ready()
        if i >= 3:  # the first calls compile
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def qwix_rows(run: str, args) -> dict:
    if not args.qwix_python:
        return {"error": "not run (no --qwix-python)"}
    cmd = [args.qwix_python, str(HERE / "qwix_side.py"), run]
    cmd += ["--eval-batches", str(args.eval_batches), "--batch-size", str(args.batch_size)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_model(name: str, run: str, args) -> dict:
    src = ql.load_run(run)
    fp = perplexity(src.model, src, args)
    float_bytes = ql.weight_bytes(src.model)
    rows = {"float32": {"perplexity": fp, "bytes": float_bytes}}
    for row, rules in ROWS.items():
        q = ql.quantize(src.model, ql.PtqProvider(rules))
        rows[row] = {"perplexity": perplexity(q, src, args), "bytes": ql.weight_bytes(q)}
    qat_rules = ROWS["int4"]
    qat = ql.quantize(fine_tune(src.model, src, args, qat_rules), ql.PtqProvider(qat_rules))
    control = fine_tune(src.model, src, args)
    rows["int4 QAT"] = {"perplexity": perplexity(qat, src, args), "bytes": ql.weight_bytes(qat)}
    rows["float32 fine-tuned (QAT control)"] = {"perplexity": perplexity(control, src, args)}
    int8 = ql.quantize(src.model, ql.PtqProvider(ROWS["int8"]))
    f_times, q_times = [], []
    for _ in range(args.decode_rounds):  # interleaved, so load drift hits both alike
        f_times += decode_ms(src.model, src.model_config, args)
        q_times += decode_ms(int8, src.model_config, args)
    decode = {
        "float32_ms": statistics.median(f_times),
        "int8_ms": statistics.median(q_times),
        "samples": len(f_times),
    }
    decode["float32_over_int8"] = decode["float32_ms"] / decode["int8_ms"]
    return {
        "run": run,
        "model_config": {
            k: getattr(src.model_config, k)
            for k in ("d_model", "num_layers", "num_heads", "mlp_dim", "vocab_size")
        },
        "step": src.step,
        "rows": rows,
        "qwix": qwix_rows(run, args),
        "decode": decode,
    }


def fmt_bytes(b) -> str:
    return f"{b['total'] / 1e6:.2f} MB" + (
        f" (quantised part {b['quantized_float'] / b['quantized']:.2f}x smaller)"
        if b.get("quantized")
        else ""
    )


def markdown(results: dict) -> str:
    lines = ["# benchmarks/quant results", "", conditions_markdown(results["conditions"]), ""]
    lines.append(f"Settings: `{json.dumps(results['settings'])}`")
    for name, r in results["models"].items():
        fp = r["rows"]["float32"]["perplexity"]
        lines += ["", f"## {name}: {r['model_config']} (run step {r['step']})", ""]
        lines += [
            "| rule | quantlib perplexity | change | weight bytes | Qwix model-level "
            "| Qwix numerics perplexity (change) | Qwix numerics bytes |",
            "|---|---|---|---|---|---|---|",
        ]
        for row, v in r["rows"].items():
            ppl = v["perplexity"]
            qx = r["qwix"].get(row.split(" ")[0], {}) if row in ROWS else {}
            model = qx.get("model", {})
            model_s = (
                model.get("error")
                or f"{model.get('quantized_leaves')} narrow leaves, ppl {model.get('perplexity')}"
                if model
                else "-"
            )
            num = qx.get("numerics", {})
            num_ppl = (
                f"{num['perplexity']:.4f} ({(num['perplexity'] / fp - 1) * 100:+.2f}%)"
                if "perplexity" in num
                else num.get("error", "-")
            )
            num_bytes = (
                f"{num['float_bytes'] / num['quantized_bytes']:.2f}x smaller"
                if "quantized_bytes" in num
                else "-"
            )
            b = fmt_bytes(v["bytes"]) if "bytes" in v else "-"
            lines.append(
                f"| {row} | {ppl:.4f} | {(ppl / fp - 1) * 100:+.2f}% | {b} | {model_s} | "
                f"{num_ppl} | {num_bytes} |"
            )
        d = r["decode"]
        lines += [
            "",
            f"Decode step at batch 1 (median of {d['samples']}): float32 {d['float32_ms']:.3f} ms,"
            f" int8 weight-only {d['int8_ms']:.3f} ms: int8 is "
            f"{d['float32_over_int8']:.2f}x the speed of float32.",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, metavar="NAME=RUN_DIR")
    parser.add_argument("--qwix-python", default=None)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--qat-steps", type=int, default=10)
    parser.add_argument("--qat-lr", type=float, default=2e-4)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--decode-rounds", type=int, default=3)
    parser.add_argument("--out", default=str(HERE))
    args = parser.parse_args()
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    with measure_conditions(packages=["jax", "flax", "jaxstack-quantlib", "jaxstack-kernlib"]) as c:
        models = {}
        for item in args.run:
            name, _, run = item.partition("=")
            models[name] = bench_model(name, run, args)
            print(f"{name}: done", flush=True)
    results = {"conditions": c.as_dict(), "settings": settings, "models": models}
    out = pathlib.Path(args.out)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
