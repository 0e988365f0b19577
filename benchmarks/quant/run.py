"""benchmarks/quant: jaxstack-quantlib against Qwix on the same trained weights.

For each run directory (the tiny main-job model, a d=512 model): validation perplexity and
weight bytes of float32, int8 weight-only, w8a8 (dynamic), int4 (tile 128), nf4 (tile 64); the
same rules applied by Qwix (`qwix_side.py`, run in a Python with qwix); int4 QAT (fine-tuning
steps with fake quantisation, then PTQ) read against a float fine-tune of the same steps and
that fine-tune's own int4 PTQ; and the CPU decode step time at batch 1 of float32, int8, int4
and nf4 weights. Writes results.json and results.md next to this file. See README.md.
"""

from __future__ import annotations

import argparse
import json
import math
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
DECODE_ROWS = ("int8", "int4", "nf4")
ROWS = {
    "int8": (ql.QuantRule(".*", "int8"),),
    "w8a8": (ql.QuantRule(".*", "int8", act_qtype="int8"),),
    "int4": (ql.QuantRule(".*", "int4", tile_size=128),),
    "nf4": (ql.QuantRule(".*", "nf4", tile_size=64),),
}


def perplexity(model, src, args) -> dict:
    batches = ql.validation_batches(src.tokenizer, seq_len=src.seq_len, batch_size=args.batch_size)
    r = ql.perplexity(model, batches, args.eval_batches)
    return {"perplexity": r["perplexity"], "batch_losses": r["batch_losses"]}


def change(a: dict, b: dict) -> tuple[float, float]:
    """Perplexity change of `a` over `b` in %, and two standard errors of it: both were read on
    the same batches, so the spread of the per-batch loss differences is the noise."""
    d = [x - y for x, y in zip(a["batch_losses"], b["batch_losses"], strict=True)]
    return (a["perplexity"] / b["perplexity"] - 1) * 100, 200 * statistics.stdev(d) / math.sqrt(
        len(d)
    )


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
    rows = {"float32": perplexity(src.model, src, args) | {"bytes": ql.weight_bytes(src.model)}}
    for row, rules in ROWS.items():
        q = ql.quantize(src.model, ql.PtqProvider(rules))
        rows[row] = perplexity(q, src, args) | {"bytes": ql.weight_bytes(q)}
    # QAT against the same fine-tune without fake quantisation: both train from the same
    # weights for the same steps, so the trained-for-longer gain cancels (see README).
    to_int4 = lambda m: ql.quantize(m, ql.PtqProvider(ROWS["int4"]))
    control = fine_tune(src.model, src, args)
    qat = to_int4(fine_tune(src.model, src, args, ROWS["int4"]))
    rows["float32 fine-tuned (control)"] = perplexity(control, src, args)
    control_int4 = to_int4(control)
    rows["int4 PTQ of the control"] = perplexity(control_int4, src, args) | {
        "bytes": ql.weight_bytes(control_int4)
    }
    rows["int4 QAT"] = perplexity(qat, src, args) | {"bytes": ql.weight_bytes(qat)}
    base = rows["float32 fine-tuned (control)"]
    ptq_loss, ptq_2se = change(rows["int4 PTQ of the control"], base)
    qat_loss, qat_2se = change(rows["int4 QAT"], base)
    qat_summary = {
        "ptq_loss_pct": ptq_loss,
        "ptq_loss_2se": ptq_2se,
        "qat_loss_pct": qat_loss,
        "qat_loss_2se": qat_2se,
        "recovered": 1 - qat_loss / ptq_loss,
    }
    models = {"float32": src.model} | {
        row: ql.quantize(src.model, ql.PtqProvider(ROWS[row])) for row in DECODE_ROWS
    }
    times = {row: [] for row in models}
    for _ in range(args.decode_rounds):  # interleaved, so load drift hits every row alike
        for row, model in models.items():
            times[row] += decode_ms(model, src.model_config, args)
    decode = {row: statistics.median(t) for row, t in times.items()}
    decode["samples"] = len(times["float32"])
    return {
        "run": run,
        "model_config": {
            k: getattr(src.model_config, k)
            for k in ("d_model", "num_layers", "num_heads", "mlp_dim", "vocab_size")
        },
        "step": src.step,
        "rows": rows,
        "qwix": qwix_rows(run, args),
        "qat": qat_summary,
        "decode_ms": decode,
    }


def fmt_bytes(b) -> str:
    return f"{b['total'] / 1e6:.2f} MB" + (
        f" (quantised part {b['quantized_float'] / b['quantized']:.2f}x smaller)"
        if b.get("quantized")
        else ""
    )


def qat_verdict(q: dict) -> str:
    """What QAT did, said only where PTQ lost more than its own noise (a share of nothing is
    noise divided by noise)."""
    if abs(q["ptq_loss_pct"]) <= q["ptq_loss_2se"]:
        return "PTQ's loss is within its noise, so this model leaves QAT nothing to recover."
    return f"QAT recovers {q['recovered'] * 100:.0f}% of that loss."


def markdown(results: dict) -> str:
    lines = ["# benchmarks/quant results", "", conditions_markdown(results["conditions"]), ""]
    lines.append(f"Settings: `{json.dumps(results['settings'])}`")
    st = results["settings"]
    for name, r in results["models"].items():
        fp = r["rows"]["float32"]
        lines += ["", f"## {name}: {r['model_config']} (run step {r['step']})", ""]
        lines += [
            "| rule | quantlib perplexity | change (± 2 SE) | weight bytes | Qwix perplexity "
            "| change (± 2 SE) | Qwix weight bytes | quantlib - Qwix (± 2 SE) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row, v in r["rows"].items():
            c, se = change(v, fp)
            qx = r["qwix"].get(row, {}).get("model", {}) if row in ROWS else {}
            if "perplexity" in qx:
                qc, qse = change(qx, fp)
                vs, vse = change(v, qx)
                qwix_s = (
                    f"{qx['perplexity']:.4f} | {qc:+.2f}% ± {qse:.2f} | "
                    f"{qx['state_bytes'] / 1e6:.2f} MB | {vs:+.2f}% ± {vse:.2f}"
                )
            else:
                qwix_s = f"{qx.get('error', r['qwix'].get('error', '-'))} | - | - | -"
            b = fmt_bytes(v["bytes"]) if "bytes" in v else "-"
            lines.append(
                f"| {row} | {v['perplexity']:.4f} | {c:+.2f}% ± {se:.2f} | {b} | {qwix_s} |"
            )
        q = r["qat"]
        lines += [
            "",
            f"int4 QAT ({st['qat_steps']} steps at lr {st['qat_lr']}): against the float "
            f"fine-tune of the same steps, int4 PTQ loses {q['ptq_loss_pct']:+.3f}% "
            f"(± {q['ptq_loss_2se']:.3f}) and QAT {q['qat_loss_pct']:+.3f}% "
            f"(± {q['qat_loss_2se']:.3f}): {qat_verdict(q)}",
        ]
        d = r["decode_ms"]
        lines += [
            "",
            f"Decode step at batch 1 (median of {d['samples']} steps, ms): "
            + ", ".join(
                f"{row} {d[row]:.3f}"
                + ("" if row == "float32" else f" ({d['float32'] / d[row]:.2f}x float32's speed)")
                for row in ("float32", *DECODE_ROWS)
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, metavar="NAME=RUN_DIR")
    parser.add_argument("--qwix-python", default=None)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--qat-steps", type=int, default=50)
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
