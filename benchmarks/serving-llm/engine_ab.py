"""In-process A/B of the LLM engine: decode time per token and throughput by engine setting.

Each variant is one `LLM` on the same in-memory model (the issue's: Llama d=256, 4 layers, 4
heads, MLP 1,024, vocabulary 8,000, float32, random weights) with its engine options and
sampling parameters. A round gives every variant the same `concurrency` prompts of 128 random
tokens x 128 output tokens (`ignore_eos`), the order of the variants rotating from round to
round so that load from other processes falls on all of them alike. Per variant and round:
TPOT, the mean time of the steps in which every sequence decodes (no prefill chunk); the
time until every request has its first token (TTFT, all); and output tokens/s over the round.
The load average is recorded before, during (every round) and after, next to every number,
with the machine and versions (`benchmarks/conditions.py`); `--json` writes them all.

    .venv/bin/python benchmarks/serving-llm/engine_ab.py capacity   # cost vs cache capacity
    .venv/bin/python benchmarks/serving-llm/engine_ab.py sampling   # the top-k/top-p sort
    .venv/bin/python benchmarks/serving-llm/engine_ab.py budget --rounds 3 --json out.json
    .venv/bin/python benchmarks/serving-llm/engine_ab.py rows-c1    # sequence-row buckets
    .venv/bin/python benchmarks/serving-llm/engine_ab.py int8-c1    # weight-only int8, d=512
    .venv/bin/python benchmarks/serving-llm/engine_ab.py sampler-c32  # the sampling program
    .venv/bin/python benchmarks/serving-llm/engine_ab.py kvlayout-c8  # page- vs head-major cache
    .venv/bin/python benchmarks/serving-llm/engine_ab.py async-c32  # async scheduling on/off
    .venv/bin/python benchmarks/serving-llm/engine_ab.py alternatives-c32  # top-k when asked
    .venv/bin/python benchmarks/serving-llm/engine_ab.py chunks-c32  # attention chunks by bytes
    .venv/bin/python benchmarks/serving-llm/engine_ab.py attention-c32  # XLA vs custom call

A suite may name its own model (`int8-*`: d=512) and a variant a quantlib preset (`quant`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstack import kernlib, nnlib
from jaxstack.kernlib.ops.ragged_paged_attention import xla as xla_attention
from jaxstack.serving import LLM, SamplingParams

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from conditions import conditions_markdown, measure_conditions

# nnlib's `tiny` preset is the model but for its vocabulary and context.
MODEL = nnlib.get_preset("tiny").replace(vocab_size=8000, max_seq_len=8192)
# Issue 31's goal 3 asks for d >= 512: 8 heads of 64, MLP 1,536 (benchmarks/quant's d512).
D512 = MODEL.replace(d_model=512, num_heads=8, num_kv_heads=8, mlp_dim=1536)
PROMPT_LEN, OUTPUT_LEN = 128, 128
BASE = dict(max_num_seqs=32, max_num_batched_tokens=256)
GREEDY = dict(temperature=0.0)
SAMPLED = dict(temperature=0.8)  # the client setting


def rows_as_tokens(llm: LLM) -> None:
    """The step's sequence rows as before row buckets: min(token bucket, max_num_seqs)."""
    runner = llm.engine.runner
    empty_inputs = type(runner)._empty_inputs
    runner._empty_inputs = lambda t, s=None: empty_inputs(runner, t)


def before_and_now(concurrency: int, before: str, change, now: str) -> tuple:
    """A suite of two variants at issue 31's client setting and server limits (max_model_len
    2,048, token budget 2,048, default cache): the engine with `change` (as it was before,
    named `before`) and as it is (`now`)."""
    options = dict(max_model_len=2048, max_num_batched_tokens=2048)
    return concurrency, {before: (options, SAMPLED, change), now: (options, SAMPLED)}


def rows_suite(concurrency: int) -> tuple:
    """Sequence rows sized by the step's tokens (before) or by its sequences (now)."""
    return before_and_now(
        concurrency,
        "rows = min(token bucket, max_num_seqs)",
        rows_as_tokens,
        "rows = row bucket of the sequences",
    )


def tokens_from_16(llm: LLM) -> None:
    """The step's token buckets as before: none below 16."""
    runner = llm.engine.runner
    runner.buckets = tuple(b for b in runner.buckets if b >= 16)


class HashedEveryCall:
    """The model's GraphDef as a static argument hashed on every call, as before."""

    def __init__(self, key):
        self.value = key.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __eq__(self, other: object) -> bool:  # the same object: no comparison of trees
        return self is other or getattr(other, "value", None) == self.value


def graphdef_hashed_every_call(llm: LLM) -> None:
    runner = llm.engine.runner
    runner.graphdef_key = HashedEveryCall(runner.graphdef_key)


def _gumbel_sample(
    sampler, logits, s, penalties, *, num_top, all_greedy, top_k_top_p, max_num_seqs
):
    """The sampler as it was (serving 0.4.2): `jnp.argmax`, and Gumbel noise over the whole
    vocabulary through `jax.random.categorical`. `sampler` is the engine's sampler module."""
    raw = jax.nn.log_softmax(logits, axis=-1)
    if penalties is not None:
        logits = sampler.apply_penalties(logits, s, penalties)
    token_ids = jnp.argmax(logits, axis=-1)
    if not all_greedy:
        keys = jax.vmap(lambda seed, step: jax.random.fold_in(jax.random.key(seed), step))(
            s.seed, s.step
        )
        filtered = sampler.filter_logits(logits, s, top_k_top_p=top_k_top_p)
        drawn = jax.vmap(jax.random.categorical)(keys, filtered)
        token_ids = jnp.where(s.temperature > 0, drawn, token_ids)
    token_ids = token_ids.astype(jnp.int32)
    chosen = jnp.take_along_axis(raw, token_ids[:, None], axis=-1)[:, 0]
    top_logprobs, top_ids = jax.lax.top_k(raw, max(num_top, 1))
    sampled = sampler.Sampled(token_ids, chosen, top_ids.astype(jnp.int32), top_logprobs)
    # What the engine's sampling program also returns: the tokens padded for the next step.
    return sampled, jnp.zeros(max_num_seqs, jnp.int32).at[: logits.shape[0]].set(token_ids)


def gumbel_sampling(llm: LLM) -> None:
    """This LLM's steps sample with `_gumbel_sample` (the engine is single-threaded: the swap
    of the runner's module-level sampling program lasts exactly one step)."""
    model_runner = sys.modules[type(llm.engine.runner).__module__]  # the engine's own module
    before = jax.jit(
        functools.partial(_gumbel_sample, model_runner.sampler),
        static_argnames=("num_top", "all_greedy", "top_k_top_p", "max_num_seqs"),
    )
    step = llm.engine.step

    def swapped_step():
        current, model_runner._sample = model_runner._sample, before
        try:
            return step()
        finally:
            model_runner._sample = current

    llm.engine.step = swapped_step


def sampler_suite(concurrency: int) -> tuple:
    """The sampling program before and after the inverse-CDF draw."""
    return before_and_now(
        concurrency,
        "Gumbel draw, jnp.argmax (before)",
        gumbel_sampling,
        "inverse-CDF draw, two-reduction argmax",
    )


def alternatives_always(llm: LLM) -> None:
    """Every step ranks the vocabulary for log-probability alternatives, as before (serving
    0.4.5), whether or not a request asks for them."""
    runner = llm.engine.runner
    static = runner._sampling_static
    runner._sampling_static = lambda **flags: static(**{**flags, "top_logprobs": True})


def alternatives_suite(concurrency: int) -> tuple:
    return before_and_now(
        concurrency,
        "top-20 alternatives every step (before)",
        alternatives_always,
        "top-20 alternatives when asked",
    )


def page_major_cache(llm: LLM) -> None:
    """The KV cache as before (serving 0.4.3): page-major, [layers, slots, kv_heads, head_dim]."""
    llm.engine.runner.allocate_cache("page_major")


def kvlayout_suite(concurrency: int) -> tuple:
    """The KV cache page-major (before) or head-major (now, the engine's default on CPU)."""
    return before_and_now(
        concurrency, "page-major cache (before)", page_major_cache, "head-major cache"
    )


class OwnPrograms:
    """The model's GraphDef as a static argument equal only to itself: the engine compiles
    programs of its own instead of sharing those of an engine of the same model."""

    def __init__(self, key):
        self.value, self._hash = key.value, hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return other is self


def chunks_of_256(llm: LLM) -> None:
    """kernlib's XLA attention as before (kernlib 0.3.0): 256 cache positions per loop
    iteration whatever the bytes a decode step gathers. The engine's programs are compiled
    (`warmup`) while kernlib's byte limit is lifted, so they keep the old chunks."""
    runner = llm.engine.runner
    runner.graphdef_key = OwnPrograms(runner.graphdef_key)
    limit, xla_attention.CHUNK_BYTES = xla_attention.CHUNK_BYTES, float("inf")
    try:
        runner.warmup()
    finally:
        xla_attention.CHUNK_BYTES = limit


def warmed_up(llm: LLM) -> None:
    """Every step program compiled before the first round, as `chunks_of_256` compiles its."""
    llm.engine.runner.warmup()


def chunks_suite(concurrency: int) -> tuple:
    """Decode attention read 256 positions at a time (before) or in chunks of at most
    kernlib's CHUNK_BYTES of keys (now); both engines compile every step shape first."""
    options = dict(max_model_len=2048, max_num_batched_tokens=2048)
    return concurrency, {
        "256-position chunks (before)": (options, SAMPLED, chunks_of_256),
        "chunks by bytes": (options, SAMPLED, warmed_up),
    }


def attention_as_xla(llm: LLM) -> None:
    """kernlib's XLA attention as before (kernlib 0.3.1), not its CPU custom call: `xla` is
    recorded as this device's winner in a private tuning cache while the engine's programs
    compile (`warmup`), so they keep it."""
    runner = llm.engine.runner
    runner.graphdef_key = OwnPrograms(runner.graphdef_key)
    before = os.environ.get("JAXSTACK_KERNLIB_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["JAXSTACK_KERNLIB_CACHE_DIR"] = cache
        try:
            kernlib.TuningCache().record(
                jax.devices()[0].device_kind,
                "ragged_paged_attention",
                "*",
                {"implementation": "xla"},
            )
            runner.warmup()
        finally:
            if before is None:
                del os.environ["JAXSTACK_KERNLIB_CACHE_DIR"]
            else:
                os.environ["JAXSTACK_KERNLIB_CACHE_DIR"] = before


def attention_suite(concurrency: int) -> tuple:
    """The engine's attention as kernlib's XLA implementation (before) or its CPU custom call
    (now, the default on CPU); both engines compile every step shape first."""
    options = dict(max_model_len=2048, max_num_batched_tokens=2048)
    return concurrency, {
        "xla attention (before)": (options, SAMPLED, attention_as_xla),
        "ffi_cpu attention": (options, SAMPLED, warmed_up),
    }


# suite -> (concurrency, {variant: (engine options, sampling parameters[, change to the LLM])})
SUITES = {
    # Goal 1 of issue 31: cost follows the work, not the cache's capacity or context limit.
    "capacity": (
        1,
        {
            f"blocks {b}, len {n}": (dict(num_blocks=b, max_model_len=n), GREEDY)
            for n in (512, 8192)
            for b in (1024, 16384)
        },
    ),
    # Sampled rows with no top-k/top-p skip the vocabulary sort; top_p just below 1 forces it.
    "sampling": (
        32,
        {
            "temperature 0.8": (dict(max_model_len=512), SAMPLED),
            "temperature 0.8, top_p 0.9999 (sort)": (
                dict(max_model_len=512),
                dict(SAMPLED, top_p=0.9999),
            ),
        },
    ),
    # The step token budget (vLLM's max_num_batched_tokens) for 32 prompts arriving at once.
    "budget": (
        32,
        {
            f"budget {t}": (
                # Every round repeats its prompts: cached prefixes would leave nothing to prefill.
                dict(max_model_len=512, max_num_batched_tokens=t, enable_prefix_caching=False),
                SAMPLED,
            )
            for t in (256, 512, 1024, 2048)
        },
    ),
    "rows-c1": rows_suite(1),
    **{f"sampler-c{c}": sampler_suite(c) for c in (1, 8, 32)},
    "rows-c8": rows_suite(8),
    **{f"kvlayout-c{c}": kvlayout_suite(c) for c in (1, 8, 32)},
    **{f"chunks-c{c}": chunks_suite(c) for c in (8, 16, 32)},
    **{f"attention-c{c}": attention_suite(c) for c in (1, 8, 32)},
    # Token buckets from 2 (a lone decode's model runs 2 token rows) or from 16 as before.
    "tokens-c1": (
        1,
        {
            "token buckets from 16": (dict(max_model_len=2048), SAMPLED, tokens_from_16),
            "token buckets from 2": (dict(max_model_len=2048), SAMPLED),
        },
    ),
    # One variant, issue 31's settings: to compare two versions of the engine, run it under each
    # (e.g. PYTHONPATH=<other checkout>/packages/serving/src), alternating.
    **{
        f"defaults-c{c}": (
            c,
            {"defaults": (dict(max_model_len=2048, max_num_batched_tokens=2048), SAMPLED)},
        )
        for c in (1, 8, 32)
    },
    **{f"alternatives-c{c}": alternatives_suite(c) for c in (1, 8, 32)},
    # Async scheduling (vLLM V1's): each step launched before the previous one is recorded.
    **{
        f"async-c{c}": (
            c,
            {
                f"async_scheduling={on}": (
                    dict(max_model_len=2048, max_num_batched_tokens=2048, async_scheduling=on),
                    SAMPLED,
                )
                for on in (False, True)
            },
        )
        for c in (1, 8, 32)
    },
    # jit's hash of the model's GraphDef (a static argument) on every step, or once.
    "hash-c1": (
        1,
        {
            "GraphDef hashed every step": (
                dict(max_model_len=2048),
                SAMPLED,
                graphdef_hashed_every_call,
            ),
            "GraphDef hashed once": (dict(max_model_len=2048), SAMPLED),
        },
    ),
    # Goal 3: weight-only int8 (quantlib's `int8` preset, per-channel, every Dense) through LLM.
    **{
        f"int8-c{c}": (
            c,
            {
                name: (dict(max_model_len=2048, quant=quant), SAMPLED)
                for name, quant in (("float32", None), ("int8 weight-only", "int8"))
            },
            D512,
        )
        for c in (1, 8)
    },
}


def quantized(model: nnlib.Transformer, preset: str | None) -> nnlib.Transformer:
    if preset is None:
        return model
    from jaxstack import quantlib

    return quantlib.quantize(model, quantlib.PtqProvider(quantlib.PRESETS[preset]))


def load() -> float:
    return os.getloadavg()[0]


def one_round(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict:
    engine = llm.engine
    seqs = [q for p in prompts for q in engine.add_request(p, params)]
    decode_steps, t0 = [], time.perf_counter()
    first = None
    while engine.has_unfinished():
        decoding = not engine.scheduler.waiting and all(
            q.num_computed_tokens >= len(q.prompt_token_ids) for q in engine.scheduler.running
        )
        t = time.perf_counter()
        engine.step()
        if decoding:
            decode_steps.append(time.perf_counter() - t)
        if first is None and all(q.output.token_ids for q in seqs):
            first = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    return {
        "tpot_s": statistics.fmean(decode_steps),
        "ttft_all_s": first,
        "output_tokens_per_s": len(seqs) * OUTPUT_LEN / wall,
    }


def summary(rows: list[float], ref: list[float]) -> str:
    ratios = [a / b for a, b in zip(rows, ref, strict=True)]
    return (
        f"median {statistics.median(rows):8.3f} (rounds {min(rows):.3f}-{max(rows):.3f}); "
        f"ratio {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the per-round numbers here")
    args = parser.parse_args()
    with measure_conditions(
        packages=["jax", "jaxlib", "jaxstack-serving", "jaxstack-kernlib", "jaxstack-quantlib"]
    ) as conditions:
        rows, loads = run(args)
    meta = conditions.as_dict()
    print(conditions_markdown(meta))
    if args.json:
        with open(args.json, "w") as f:
            out = {"suite": args.suite, "rows": rows, "load": loads, "conditions": meta}
            json.dump(out, f, indent=1)


def run(args) -> tuple[dict, dict]:
    loads = {"before": load()}
    concurrency, variants, *config = SUITES[args.suite]
    model = nnlib.Transformer(config[0] if config else MODEL, rngs=nnx.Rngs(0))
    llms = {}
    for name, (opts, _, *change) in variants.items():
        opts = dict(opts)
        llms[name] = LLM(quantized(model, opts.pop("quant", None)), **{**BASE, **opts})
        for f in change:
            f(llms[name])
    params = {
        name: SamplingParams(max_tokens=OUTPUT_LEN, ignore_eos=True, seed=0, **sampling)
        for name, (_, sampling, *_) in variants.items()
    }
    rng = np.random.default_rng(0)
    vocab = model.config.vocab_size
    prompts = [rng.integers(3, vocab, PROMPT_LEN).tolist() for _ in range(concurrency)]
    for name, llm in llms.items():  # compile the shapes a round uses
        one_round(llm, prompts, params[name])
    names = list(llms)
    rows = {n: [] for n in names}
    loads["during"] = []
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            rows[name].append(one_round(llms[name], prompts, params[name]))
        loads["during"].append(round(load(), 2))
    loads["after"] = load()
    print(
        f"{args.suite}: concurrency {concurrency}, {args.rounds} rounds; load 1-min before "
        f"{loads['before']:.2f}, during {loads['during']}, after {loads['after']:.2f}"
    )
    ref = names[0]
    for metric, scale, unit in (
        ("tpot_s", 1e3, "ms"),
        ("ttft_all_s", 1.0, "s"),
        ("output_tokens_per_s", 1.0, "tok/s"),
    ):
        print(f"{metric} ({unit}; ratio to {ref!r})")
        for name in names:
            values = [row[metric] * scale for row in rows[name]]
            print(f"  {name:40s} {summary(values, [row[metric] * scale for row in rows[ref]])}")
    return rows, loads


if __name__ == "__main__":
    main()
