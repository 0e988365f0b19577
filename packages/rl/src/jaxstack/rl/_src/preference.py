"""Preference tuning on (prompt, chosen, rejected) records: DPO and ORPO.

Each step scores a batch of pairs as 2B rows (chosen rows, then rejected rows) with the policy.
DPO also needs the frozen reference policy's log-probs: with `dpo.reference=precompute` they
are computed once for the whole dataset before training (one forward pass per pair, no second
model in memory while training); with `live` the reference forward runs inside every step.
The reference is the starting model (for LoRA: the base model, as the adapters start at zero).
Batches are a pure function of the step (Grain's shuffled, repeated index dataset), so resuming
needs no data state.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstack.rl._src import losses
from jaxstack.rl._src.config import RLConfig
from jaxstack.rl._src.encode import sequence_batch, shuffled_batches, trim_padding
from jaxstack.rl._src.logprobs import completion_logprobs, completion_positions, sequence_logprobs
from jaxstack.rl._src.policy import Policy, build_policy
from jaxstack.rl._src.records import read_preference_records
from jaxstack.rl._src.run import Run, RunResult, initial_state, optimizer, prepare_host
from jaxstack.rl._src.sft import export_model, require_data


def encode_pairs(config: RLConfig, policy: Policy) -> dict[str, np.ndarray]:
    """All pairs as [N, T] arrays: `chosen_*` and `rejected_*` batch keys side by side."""
    records = read_preference_records(require_data(config))
    encoder = policy.encoder()
    prompts = [encoder.prompt(r.prompt) for r in records]
    out = {}
    for side in ("chosen", "rejected"):
        completions = [encoder.completion(getattr(r, side), r.prompt) for r in records]
        rows = sequence_batch(
            prompts, completions, config.base.data.seq_len, policy.tokenizer.pad_id
        )
        out.update({f"{side}_{k}": v for k, v in rows.items()})
    return out


def pair_rows(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The 2B model rows of a pair batch: chosen rows first, then rejected rows."""
    keys = ("tokens", "targets", "segment_ids", "positions", "loss_mask")
    return {k: jnp.concatenate([batch[f"chosen_{k}"], batch[f"rejected_{k}"]]) for k in keys}


def pair_batch(pairs: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
    """The pairs at `idx`, cut to their longest row (`trim_padding`), with their
    `completion_index`."""
    return with_completion_index(trim_padding({k: v[idx] for k, v in pairs.items()}))


def with_completion_index(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The batch with `completion_index`: the loss-mask positions of its 2B pair rows, the only
    ones whose log-probs a step computes (`completion_logprobs`): with a prompt longer than its
    replies, most of the [rows, columns, vocab] logits would be spent on the prompt."""
    mask = np.concatenate([batch["chosen_loss_mask"], batch["rejected_loss_mask"]])
    return {**batch, "completion_index": completion_positions(mask)}


def _pair_logps(apply: Any, params: Any, batch: dict[str, jax.Array]):
    """Token log-probs of the pair rows at their completion positions (0 elsewhere)."""
    rows = pair_rows(batch) | {"completion_index": batch["completion_index"]}
    return completion_logprobs(apply, params, rows), rows["loss_mask"]


def reference_logps(policy: Policy, pairs: dict[str, np.ndarray], batch_size: int) -> dict:
    """`ref_chosen` and `ref_rejected` sequence log-probs [N] under the starting policy."""

    @jax.jit
    def score(params, batch):
        token_logps, mask = _pair_logps(policy.apply, params, batch)
        seq = sequence_logprobs(token_logps, mask)
        return seq[: seq.shape[0] // 2], seq[seq.shape[0] // 2 :]

    n = len(pairs["chosen_tokens"])
    chosen, rejected = [], []
    for start in range(0, n, batch_size):
        idx = np.arange(start, start + batch_size) % n  # a full last batch: one compiled shape
        c, r = score(policy.params, pair_batch(pairs, idx))
        keep = min(batch_size, n - start)
        chosen.append(np.asarray(c)[:keep])
        rejected.append(np.asarray(r)[:keep])
    return {"ref_chosen": np.concatenate(chosen), "ref_rejected": np.concatenate(rejected)}


def make_dpo_loss(config: RLConfig, policy: Policy):
    """DPO's loss over a pair batch; with `dpo.reference=live` the batch carries the reference
    params under "reference_params" (an argument, so they are not baked into the program)."""
    live = config.dpo.reference == "live"

    def loss_fn(params, batch):
        token_logps, mask = _pair_logps(policy.apply, params, batch)
        seq = sequence_logprobs(token_logps, mask)
        half = seq.shape[0] // 2
        if live:
            ref_token_logps, _ = _pair_logps(policy.apply, batch["reference_params"], batch)
            ref = jax.lax.stop_gradient(sequence_logprobs(ref_token_logps, mask))
            ref_chosen, ref_rejected = ref[:half], ref[half:]
        else:
            ref_chosen, ref_rejected = batch["ref_chosen"], batch["ref_rejected"]
        return losses.dpo_loss(
            seq[:half],
            seq[half:],
            ref_chosen,
            ref_rejected,
            beta=config.dpo.beta,
            label_smoothing=config.dpo.label_smoothing,
        )

    return loss_fn


def make_orpo_loss(config: RLConfig, policy: Policy):
    def loss_fn(params, batch):
        token_logps, mask = _pair_logps(policy.apply, params, batch)
        lengths = jnp.maximum(mask.sum(axis=-1), 1.0)
        mean_logps = sequence_logprobs(token_logps, mask) / lengths
        half = mean_logps.shape[0] // 2
        chosen_mask = mask[:half]
        nll = -(token_logps[:half] * chosen_mask).sum() / jnp.maximum(chosen_mask.sum(), 1.0)
        return losses.orpo_loss(mean_logps[:half], mean_logps[half:], nll, beta=config.orpo.beta)

    return loss_fn


def dpo(config: RLConfig) -> RunResult:
    """DPO on the (prompt, chosen, rejected) records of `data.path`; the model lands in
    run_dir/model."""
    return _preference(config.model_copy(update={"algorithm": "dpo"}))


def orpo(config: RLConfig) -> RunResult:
    """ORPO on the (prompt, chosen, rejected) records of `data.path`; the model lands in
    run_dir/model."""
    return _preference(config.model_copy(update={"algorithm": "orpo"}))


def _preference(config: RLConfig) -> RunResult:
    from jaxstack import trainer

    allocator = prepare_host(config)
    policy = build_policy(config)
    pairs = encode_pairs(config, policy)
    batch_size = config.base.data.batch_size
    if config.algorithm == "dpo":
        if config.dpo.reference == "precompute":
            pairs.update(reference_logps(policy, pairs, batch_size))
        loss_fn = make_dpo_loss(config, policy)
    else:
        loss_fn = make_orpo_loss(config, policy)
    order = shuffled_batches(len(pairs["chosen_tokens"]), batch_size, config.base.data.seed)
    tx = optimizer(config, policy.params)
    train_step = jax.jit(trainer.make_train_step(loss_fn, tx), donate_argnums=0)
    run = Run(config, allocator)
    try:
        start, state, _ = run.restore(initial_state(policy.params, tx))

        def step_fn(state: dict[str, Any], step: int):
            idx = np.asarray(order[step])
            batch = pair_batch(pairs, idx)
            if config.algorithm == "dpo" and config.dpo.reference == "live":
                batch["reference_params"] = policy.params
            state, metrics = train_step(state, batch)
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            return state, {**metrics, "tokens": 2 * batch["chosen_tokens"].size}

        result = run.loop(state, step_fn, start=start)
        export_model(policy, result.state["params"], run)
        run.finish(result)
        return result
    finally:
        run.close()
