"""The model runner: turns a scheduled batch into arrays, runs one jitted step, samples.

A step is one flat row of tokens (all sequences' prefill chunks and decode tokens), padded
to a bucket: the smallest of a few token counts (2, 4, 8, ..., the token budget) that holds it.
Its sequence dimension (the rows that attention groups by and sampling draws for) has buckets
of its own, 1, 2, 4, ... up to max_num_seqs, chosen from the number of sequences in the step:
a lone decode runs the model over 2 token rows (1 would copy the KV cache: `token_buckets`) and
attention and sampling over 1 sequence row. Large steps keep at least one
sequence row per TOKENS_PER_ROW tokens (the attention tiles its queries 16 rows at a time, so
fewer rows than that save little), which keeps the number of step shapes small. A step is two
programs run back to back on device: the model (one per step shape) and sampling over its
last-token logits (one per row bucket and sampling variant), so a variant does not compile
the model again. Every step of a running server therefore reuses a handful of compiled
programs, and `warmup` compiles them all before the first request. `num_compilations()`
counts traces, for tests.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstack.serving._src.errors import InvalidInputError
from jaxstack.serving._src.llm import sampler
from jaxstack.serving._src.llm.block_manager import NULL_BLOCK
from jaxstack.serving._src.llm.lora import set_adapter_rows
from jaxstack.serving._src.llm.paged_cache import PagedKVCache, copy_blocks, default_kv_layout
from jaxstack.serving._src.llm.scheduler import ScheduledBatch
from jaxstack.serving._src.models.batcher import default_batch_sizes

MIN_BUCKET = 2
TOKENS_PER_ROW = 16
# The sampling programs a bucket compiles: (all_greedy, top_k_top_p, top_logprobs). Greedy
# batches skip the draw; sampled batches where no row limits top-k or top-p skip the
# full-vocabulary sort; batches where no row asks for log-probability alternatives skip the
# top-k over the vocabulary (a millisecond of a 32-row step on an AVX2 core).
SAMPLING_VARIANTS = tuple(
    (greedy, sort, top)
    for greedy, sort in ((True, False), (False, False), (False, True))
    for top in (False, True)
)


# The per-row sampling settings that are SamplingParams fields of the same name.
SAMPLING_SETTINGS = tuple(f for f in sampler.SamplingInputs._fields if f not in ("seed", "step"))


def token_buckets(max_num_batched_tokens: int) -> tuple[int, ...]:
    """Step sizes, never below MIN_BUCKET rows: with a single row XLA rewrites the cache
    scatter as a dynamic-update-slice that it does not do in place (a copy of the whole cache
    per layer and step, ~40x slower decode at 1,024 blocks); two rows stay a scatter."""
    buckets, b = [], MIN_BUCKET
    while b < max_num_batched_tokens:
        buckets.append(b)
        b *= 2
    return (*buckets, max(max_num_batched_tokens, MIN_BUCKET))


def row_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """Sizes of a step's sequence dimension: powers of two, then max_num_seqs."""
    return default_batch_sizes(max_num_seqs)


class StepInputs(NamedTuple):
    tokens: jax.Array  # [T]
    positions: jax.Array  # [T]
    segment_ids: jax.Array  # [T] 1 live, 0 padding
    slot_mapping: jax.Array  # [T]
    kv_lens: jax.Array  # [S]
    block_tables: jax.Array  # [S, blocks_per_seq]
    query_start_loc: jax.Array  # [S + 1]
    num_seqs: jax.Array  # []
    logits_indices: jax.Array  # [S] row of each sequence's last new token
    next_tokens: jax.Array  # [T] the token after each row (prompt log-probabilities)
    adapter_rows: jax.Array  # [T] each row's LoRA adapter (0: the base model)
    # [T] for a token the previous step sampled and the host has not read yet: its row in
    # that step's sampled tokens (async scheduling); -1 where `tokens` holds the token.
    previous_rows: jax.Array


class PromptScores(NamedTuple):
    """Per token row: log-probability of the following token, and the top alternatives."""

    logprobs: np.ndarray  # [T]
    top_ids: np.ndarray  # [T, K]
    top_logprobs: np.ndarray  # [T, K]


@dataclasses.dataclass
class StepResult:
    sampled: sampler.Sampled  # NumPy arrays, one row per scheduled sequence (and padding)
    prompt: PromptScores | None
    row_offsets: list[int]  # first token row of each scheduled sequence


@dataclasses.dataclass
class LaunchedStep:
    """A step whose programs are launched: its outputs are still on the device, and may still
    be computing. `result()` waits for them and brings them to the host."""

    seqs: list  # the scheduled sequences, in row order
    sampled: sampler.Sampled
    # The sampled tokens padded to max_num_seqs rows: the next step reads its decode tokens
    # from here before the host has seen them.
    token_rows: jax.Array
    prompt: tuple | None
    row_offsets: list[int]

    def result(self) -> StepResult:
        sampled = sampler.Sampled(*jax.device_get(tuple(self.sampled)))
        prompt = None if self.prompt is None else PromptScores(*jax.device_get(self.prompt))
        return StepResult(sampled, prompt, self.row_offsets)


_traces = 0


class HashedOnce:
    """A static jit argument whose hash is computed once: jit hashes its static arguments on
    every call, and an nnx GraphDef hashes its whole module tree (0.3 ms per step at d=512)."""

    __slots__ = ("_hash", "value")

    def __init__(self, value: Any):
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashedOnce) and (
            self.value is other.value or self.value == other.value
        )


def num_compilations() -> int:
    """Programs compiled for engine steps so far, in this process (all engines share them:
    engines of the same model structure and cache shape reuse each other's programs)."""
    return _traces


@functools.partial(
    jax.jit,
    static_argnames=("graphdef", "structure", "block_size", "kv_layout", "num_top", "scores"),
    donate_argnames=("k", "v"),
)
def _forward(
    leaves,
    k,
    v,
    x: StepInputs,
    previous,
    *,
    graphdef,
    structure,
    block_size,
    kv_layout,
    num_top,
    scores,
):
    """One engine step's model: the flat token row through the model, float32 logits at each
    sequence's last row (and, for prompt log-probabilities, scores at every row). The model's
    state comes as the leaves of `structure` (its params and the rest). `previous` is the
    previous step's `token_rows`: the tokens it sampled, read where `x.previous_rows` points."""
    global _traces
    _traces += 1  # runs only while tracing
    tokens = jnp.where(x.previous_rows >= 0, previous[jnp.maximum(x.previous_rows, 0)], x.tokens)
    model = nnx.merge(graphdef.value, *jax.tree.unflatten(structure.value, leaves), copy=True)
    set_adapter_rows(model, x.adapter_rows)
    cache = PagedKVCache(
        k,
        v,
        x.slot_mapping,
        x.kv_lens,
        x.block_tables,
        x.query_start_loc,
        x.num_seqs,
        block_size=block_size,
        kv_layout=kv_layout,
    )
    hidden, cache, _ = model.hidden_states(
        tokens[None], x.positions[None], x.segment_ids[None], cache
    )
    hidden = hidden[0]
    logits = model.unembed(hidden[x.logits_indices]).astype(jnp.float32)
    prompt = None
    if scores:
        raw = jax.nn.log_softmax(model.unembed(hidden), axis=-1)
        nxt = jnp.take_along_axis(raw, x.next_tokens[:, None], axis=-1)[:, 0]
        top_logprobs, top_ids = jax.lax.top_k(raw, max(num_top, 1))
        prompt = (nxt, top_ids.astype(jnp.int32), top_logprobs)
    return logits, prompt, cache.k, cache.v


@functools.partial(
    jax.jit, static_argnames=("num_top", "all_greedy", "top_k_top_p", "max_num_seqs")
)
def _sample(logits, s, penalties, *, num_top, all_greedy, top_k_top_p, max_num_seqs):
    """One engine step's sampling, on the logits `_forward` left on device; also the sampled
    tokens padded to max_num_seqs rows, one shape whatever the step's, for the next step."""
    global _traces
    _traces += 1  # runs only while tracing
    sampled = sampler.sample(
        logits, s, penalties, num_top=num_top, all_greedy=all_greedy, top_k_top_p=top_k_top_p
    )
    token_rows = jnp.zeros(max_num_seqs, jnp.int32).at[: logits.shape[0]].set(sampled.token_ids)
    return sampled, token_rows


@functools.partial(jax.jit, static_argnames=("block_size", "kv_layout"), donate_argnames=("k", "v"))
def _copy_blocks(k, v, source, destination, *, block_size, kv_layout):
    global _traces
    _traces += 1  # runs only while tracing
    return copy_blocks(k, v, source, destination, block_size=block_size, kv_layout=kv_layout)


def fork_copy(fork, block_size: int) -> tuple[int, int] | None:
    """The block a fork copies from its parent: their prompt's partly filled last block."""
    full, partial = divmod(len(fork.prompt_token_ids), block_size)
    return (fork.parent.block_ids[full], fork.block_ids[full]) if partial else None


def array_layout(tree: Any) -> tuple[Any, list[tuple[tuple[int, ...], Any]]]:
    """A pytree's structure and its leaves' shapes and dtypes: what new weights must match."""
    leaves, structure = jax.tree.flatten(tree)
    return structure, [(tuple(a.shape), jnp.dtype(a.dtype)) for a in leaves]


class ModelRunner:
    """Holds the model's split state and the cache arrays; `execute` runs one step."""

    def __init__(
        self,
        model: nnx.Module,
        *,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_logprobs: int,
        kv_layout: str | None = None,
    ):
        self.config = model.config
        # The weights apart from the rest of the state, so that `update_weights` swaps them
        # without walking the module (a walk took 5 ms of a 35 ms GRPO rollout at d_model 64).
        self.graphdef, self.params, self.rest = nnx.split(model, nnx.Param, ...)
        self.graphdef_key = HashedOnce(self.graphdef)
        self.param_layout = array_layout(self.params)
        # Steps take the state as flat leaves, its structure a static argument: flattening
        # the nnx State at every call (a Python callback per Variable) was 0.1-0.2 ms of a
        # step's 0.5 ms dispatch at d_model 64 (benchmarks/serving-llm/README.md).
        self.state_structure = HashedOnce(jax.tree.structure((self.params, self.rest)))
        self.state_leaves = jax.tree.leaves((self.params, self.rest))
        self.block_size = block_size
        self.blocks_per_seq = -(-max_model_len // block_size)
        self.max_num_seqs = max_num_seqs
        self.max_logprobs = max_logprobs
        self.buckets = token_buckets(max_num_batched_tokens)
        self.row_buckets = row_buckets(max_num_seqs)
        # Steps run per (token bucket, row bucket): which programs serving actually uses.
        self.steps_by_shape: collections.Counter[tuple[int, int]] = collections.Counter()
        # Called with no arguments once a step's inputs are ready, right before its model
        # program is launched: the server hands the previous step's results to its event
        # loop there, so that their HTTP work runs beside the model, not beside this
        # thread's input preparation (both need the GIL).
        self.before_launch: Callable[[], None] | None = None
        self.num_blocks = num_blocks
        self.no_previous_tokens = jnp.zeros(max_num_seqs, jnp.int32)
        self.allocate_cache(kv_layout or default_kv_layout())

    def allocate_cache(self, kv_layout: str) -> None:
        """An empty cache in the layout `kv_layout` ("head_major" or "page_major", see
        `paged_cache`; the default follows the platform): before the first request only,
        since whatever the cache held is dropped."""
        self.kv_layout = kv_layout
        dtype = jnp.dtype(self.config.dtype)
        self.k, self.v = PagedKVCache.zeros(
            self.config, self.num_blocks, self.block_size, dtype, kv_layout
        )

    def update_weights(self, params: Any) -> None:
        """Serve new parameter values (an nnx State of the same structure, shapes and dtypes)
        from the next step on; the module the runner was made from keeps its own."""
        if array_layout(params) != self.param_layout:
            raise InvalidInputError(
                "update_weights: params must have the served model's structure, shapes and "
                "dtypes (pass nnx.state(model, nnx.Param) of the same config)"
            )
        self.params = params
        self.state_leaves = jax.tree.leaves((params, self.rest))

    # --------------------------------------------------------------------------------- host
    def bucket(self, num_tokens: int) -> int:
        return next(b for b in self.buckets if b >= num_tokens)

    def step_rows(self, token_bucket: int, num_seqs: int) -> int:
        """Sequence rows of a step: the row bucket of its sequences, and never fewer than
        one per TOKENS_PER_ROW of its token bucket."""
        floor = min(token_bucket // TOKENS_PER_ROW, self.max_num_seqs)
        return next(r for r in self.row_buckets if r >= max(num_seqs, floor))

    def step_shapes(self) -> list[tuple[int, int]]:
        """(token bucket, sequence rows) of every step that can occur: from the fewest rows
        its tokens allow to as many as it can hold sequences (one token each)."""
        return [
            (t, r)
            for t in self.buckets
            for r in self.row_buckets
            if self.step_rows(t, 1) <= r <= self.step_rows(t, min(t, self.max_num_seqs))
        ]

    @property
    def num_programs(self) -> int:
        """Programs `warmup` compiles: the model per step shape, sampling per row bucket and
        sampling variant, and the forks' block copy per row bucket."""
        shapes = self.step_shapes()
        rows = len({r for _, r in shapes})
        return len(shapes) + rows * len(SAMPLING_VARIANTS) + len(self.row_buckets)

    def warmup(self) -> None:
        """Compile every step shape, and for each row bucket greedy, sampling, and sampling
        with top-k/top-p, each with and without log-probability alternatives, before serving."""
        sampled_rows = set()
        for t, r in self.step_shapes():
            variants = SAMPLING_VARIANTS[:1] if r in sampled_rows else SAMPLING_VARIANTS
            sampled_rows.add(r)
            for all_greedy, top_k_top_p, top_logprobs in variants:
                x = self._empty_inputs(t, r)
                self._launch(
                    x, all_greedy=all_greedy, top_k_top_p=top_k_top_p, top_logprobs=top_logprobs
                ).result()
        for r in self.row_buckets:  # forks' block copies
            self.copy_blocks([(NULL_BLOCK, NULL_BLOCK)] * r)

    def launch(self, batch: ScheduledBatch, previous: LaunchedStep | None = None) -> LaunchedStep:
        """Launch one step's programs and return without waiting for them. A sequence whose
        last token `previous` sampled and the host has not recorded yet (`num_pending`) has
        that token read on the device, from `previous.token_rows`.

        The inputs are built with whole-array NumPy operations over the step's rows: a loop
        over the sequences cost about 20 us each, 5 ms a step at 256 sequences (a GRPO
        rollout's), on a host that has the next step to launch meanwhile."""
        seqs, n_seqs = batch.seqs, len(batch.seqs)
        counts = np.asarray(batch.num_new_tokens, np.int64)
        # Forks (no tokens, last in the batch) are padding to attention; they sample from
        # their parent's last row. A step never has more sequence rows than token rows.
        live = int(np.count_nonzero(counts))
        t = self.bucket(max(batch.num_tokens, n_seqs))
        shape = (t, self.step_rows(t, n_seqs))
        x = self._empty_inputs(*shape)
        starts = np.fromiter((q.num_computed_tokens for q in seqs), np.int64, n_seqs)
        ends = np.cumsum(counts)
        rows = int(counts.sum())
        owner = np.repeat(np.arange(n_seqs), counts)  # the sequence of each row
        offset = np.arange(rows) - (ends - counts)[owner]  # the row's place in its chunk
        pos = starts[owner] + offset
        # each sequence's tokens from its first new one, and the one after its last (prompt
        # log-probabilities): short by the tokens still on the device, zeros past the end
        chunks = zip(seqs, starts.tolist(), counts.tolist(), strict=True)
        window = _padded([q.token_ids[s : s + n + 1] for q, s, n in chunks], int(counts.max()) + 1)
        x.tokens[:rows] = window[owner, offset]
        x.next_tokens[:rows] = window[owner, offset + 1]
        if previous is not None:
            previous_row = {id(q): i for i, q in enumerate(previous.seqs)}
            pending = [i for i, q in enumerate(seqs) if q.num_pending]
            x.previous_rows[ends[pending] - 1] = [previous_row[id(seqs[i])] for i in pending]
        x.block_tables[:n_seqs] = _padded([q.block_ids for q in seqs], self.blocks_per_seq)
        block = x.block_tables[owner, pos // self.block_size]
        x.slot_mapping[:rows] = block * self.block_size + pos % self.block_size
        x.positions[:rows] = pos
        x.segment_ids[:rows] = 1
        x.adapter_rows[:rows] = np.fromiter((q.adapter for q in seqs), np.int32, n_seqs)[owner]
        x.kv_lens[:live] = (starts + counts)[:live]
        x.query_start_loc[1 : live + 1] = ends[:live]
        x.query_start_loc[live + 1 :] = rows
        x.logits_indices[:n_seqs] = ends - 1
        x.num_seqs[...] = live
        copies = []
        if live < n_seqs:
            row = {id(q): i for i, q in enumerate(seqs[:live])}
            x.logits_indices[live:n_seqs] = [ends[row[id(q.parent)]] - 1 for q in seqs[live:]]
            copies = [c for q in seqs[live:] if (c := fork_copy(q, self.block_size))]
        offsets = (ends - counts).tolist()
        scores = any(
            q.prompt_logprobs is not None and q.num_computed_tokens < len(q.prompt_token_ids)
            for q in seqs
        )
        launched = self._launch(
            x,
            previous,
            seqs=seqs,
            row_offsets=offsets,
            all_greedy=all(q.params.greedy for q in seqs),
            top_k_top_p=any(
                not q.params.greedy and (q.params.top_k > 0 or q.params.top_p < 1.0) for q in seqs
            ),
            top_logprobs=any(q.params.logprobs for q in seqs),
            scores=scores,
            copies=copies,
        )
        self.steps_by_shape[shape] += 1
        return launched

    def _empty_inputs(self, t: int, s: int | None = None) -> StepInputs:
        """Zeroed inputs of t token rows and s sequence rows (default: as many as fit)."""
        s = min(t, self.max_num_seqs) if s is None else s
        i32 = lambda *shape: np.zeros(shape, np.int32)
        slots = np.full((t,), NULL_BLOCK * self.block_size, np.int32)
        return StepInputs(
            i32(t),
            i32(t),
            i32(t),
            slots,
            i32(s),
            i32(s, self.blocks_per_seq),
            i32(s + 1),
            i32(),
            i32(s),
            i32(t),
            i32(t),
            np.full((t,), -1, np.int32),
        )

    def lower(self, num_tokens: int, *, num_seqs: int | None = None) -> jax.stages.Lowered:
        """The model program of a step of `num_tokens` tokens and `num_seqs` sequences
        (default: as many as the tokens allow), lowered on empty inputs: what a step compiles
        to (`.compile().memory_analysis()`, `.as_text()`), without running it."""
        t = self.bucket(num_tokens)
        n = min(num_tokens, self.max_num_seqs) if num_seqs is None else num_seqs
        args, static = self._step_args(self._empty_inputs(t, self.step_rows(t, n)), scores=False)
        return _forward.lower(*args, **static)

    def lower_sampling(
        self,
        num_seqs: int,
        *,
        all_greedy: bool = True,
        top_k_top_p: bool = True,
        top_logprobs: bool = True,
    ) -> jax.stages.Lowered:
        """The sampling program of a step of `num_seqs` sequences, lowered on empty inputs."""
        s = next(r for r in self.row_buckets if r >= num_seqs)
        logits = jax.ShapeDtypeStruct((s, self.config.vocab_size), jnp.float32)
        inputs, penalties = self._sampling_args(s, ())
        static = self._sampling_static(
            all_greedy=all_greedy, top_k_top_p=top_k_top_p, top_logprobs=top_logprobs
        )
        return _sample.lower(logits, inputs, penalties, **static)

    def _launch(
        self,
        x: StepInputs,
        previous=None,
        *,
        seqs=(),
        row_offsets=(),
        all_greedy=True,
        top_k_top_p=True,
        top_logprobs=True,
        scores=False,
        copies=(),
    ) -> LaunchedStep:
        inputs, penalties = self._sampling_args(x.kv_lens.shape[0], seqs)
        args, static = self._step_args(x, previous, scores=scores)
        if self.before_launch is not None:
            self.before_launch()
        logits, prompt, self.k, self.v = _forward(*args, **static)
        if copies:
            self.copy_blocks(copies)
        static = self._sampling_static(
            all_greedy=all_greedy, top_k_top_p=top_k_top_p, top_logprobs=top_logprobs
        )
        sampled, token_rows = _sample(logits, inputs, penalties, **static)
        return LaunchedStep(list(seqs), sampled, token_rows, prompt, list(row_offsets))

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy blocks (source, destination) of the cache on the device, in place, after the
        launched step's writes; the pairs are padded to a row bucket with null-block pairs."""
        size = next(r for r in self.row_buckets if r >= len(pairs))
        blocks = np.full((2, size), NULL_BLOCK, np.int32)
        blocks[:, : len(pairs)] = np.asarray(pairs, np.int32).T
        static = dict(block_size=self.block_size, kv_layout=self.kv_layout)
        self.k, self.v = _copy_blocks(self.k, self.v, *blocks, **static)

    def _step_args(self, x: StepInputs, previous: LaunchedStep | None = None, *, scores: bool):
        """`_forward`'s arguments for one step (the state's leaves, the cache, the inputs and
        the tokens the previous step sampled, zeros when there is none) and its static ones."""
        token_rows = self.no_previous_tokens if previous is None else previous.token_rows
        args = (self.state_leaves, self.k, self.v, x, token_rows)
        static = dict(graphdef=self.graphdef_key, structure=self.state_structure)
        static |= dict(block_size=self.block_size, kv_layout=self.kv_layout)
        return args, dict(static, num_top=self.max_logprobs, scores=scores)

    def _sampling_static(self, *, all_greedy: bool, top_k_top_p: bool, top_logprobs: bool) -> dict:
        return dict(
            num_top=self.max_logprobs if top_logprobs else 0,
            all_greedy=all_greedy,
            top_k_top_p=top_k_top_p and not all_greedy,
            max_num_seqs=self.max_num_seqs,
        )

    def _sampling_args(self, s: int, seqs):
        """`_sample`'s per-sequence settings for s rows (padding rows get neutral ones), and
        the per-token penalties when some sequence needs them."""
        f32 = lambda fill: np.full((s,), fill, np.float32)
        inputs = sampler.SamplingInputs(
            f32(0.0),
            np.zeros(s, np.int32),
            f32(1.0),
            f32(0.0),
            np.zeros(s, np.uint32),
            np.zeros(s, np.int32),
            f32(0.0),
            f32(0.0),
            f32(1.0),
        )
        if seqs:  # one NumPy conversion per setting, not one assignment per setting and row
            n, params = len(seqs), [q.params for q in seqs]
            for name in SAMPLING_SETTINGS:
                getattr(inputs, name)[:n] = [getattr(p, name) for p in params]
            inputs.seed[:n] = [q.seed for q in seqs]
            inputs.step[:n] = [len(q.output.token_ids) + q.num_pending for q in seqs]
        penalties = None
        if any(q.params.adjusts_logits for q in seqs):
            vocab = self.config.vocab_size
            counts = np.zeros((s, vocab), np.int32)
            prompt_mask = np.zeros((s, vocab), bool)
            bias = np.zeros((s, vocab), np.float32)
            for i, q in enumerate(seqs):
                np.add.at(counts[i], np.asarray(q.output.token_ids, np.int64), 1)
                prompt_mask[i, q.prompt_token_ids] = True
                if q.params.logit_bias:
                    ids, values = zip(*q.params.logit_bias.items(), strict=True)
                    bias[i, list(ids)] = values
                bias[i, [t for t in q.banned_token_ids() if t < vocab]] = -np.inf
                if q.guided is not None:
                    bias[i, ~q.guided.allowed()] = -np.inf
            penalties = sampler.Penalties(counts, prompt_mask, bias)
        return inputs, penalties


def _padded(lists: list[list[int]], width: int) -> np.ndarray:
    """Lists of ints as the rows of a zero-padded int32 [len(lists), width] array, in whole-
    array operations (one list at a time costs a NumPy call each)."""
    lengths = np.fromiter(map(len, lists), np.int64, len(lists))
    owner = np.repeat(np.arange(len(lists)), lengths)
    out = np.zeros((len(lists), width), np.int32)
    flat = np.fromiter(itertools.chain.from_iterable(lists), np.int32, owner.size)
    out[owner, np.arange(owner.size) - (np.cumsum(lengths) - lengths)[owner]] = flat
    return out
