"""Preference tuning on (prompt, chosen, rejected) records: DPO and ORPO.

Each step scores a batch of B pairs as 2B rows with the policy, packed: a pair's chosen and
rejected replies share its prompt, so the model reads the prompt once with both replies after
it (`pack_groups`, groups of two; `pack_rows` for models with sliding windows), and padding
costs nothing. On the tiny preference records (prompts of 5-7 tokens, rows of 6-9) that is 12
packed positions a pair instead of 2 x 16 columns.
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
from jaxstack.rl._src.encode import pack_rows, sequence_batch, shuffled_batches, trim_padding
from jaxstack.rl._src.logprobs import completion_logprobs, sequence_logprobs
from jaxstack.rl._src.policy import Policy, build_policy
from jaxstack.rl._src.records import read_preference_records
from jaxstack.rl._src.run import Run, RunResult, initial_state, optimizer, prepare_host
from jaxstack.rl._src.sft import export_model, require_data
from jaxstack.rl._src.shared_prompt import pack_groups, shared_prompt_attention, shares_prompts


def encode_pairs(config: RLConfig, policy: Policy) -> dict[str, np.ndarray]:
    """All pairs as [N, T] arrays (`chosen_*` and `rejected_*` batch keys side by side) and
    each pair's `prompt_lengths` [N]."""
    records = read_preference_records(require_data(config))
    encoder = policy.encoder()
    prompts = [encoder.prompt(r.prompt) for r in records]
    out = {"prompt_lengths": np.array([len(p) for p in prompts], np.int64)}
    for side in ("chosen", "rejected"):
        completions = [encoder.completion(getattr(r, side), r.prompt) for r in records]
        rows = sequence_batch(
            prompts, completions, config.base.data.seq_len, policy.tokenizer.pad_id
        )
        out.update({f"{side}_{k}": v for k, v in rows.items()})
    return out


class PairScorer:
    """How a policy scores pair batches: the model function, and the packing that suits it
    (each prompt once, unless a sliding window needs whole rows)."""

    def __init__(self, policy: Policy):
        self.shares_prompts = shares_prompts(policy.model.config)
        self.apply = (
            policy.apply_with(shared_prompt_attention) if self.shares_prompts else policy.apply
        )

    def batch(self, pairs: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
        """The pairs at `idx` as packed model rows (see `pack_rows`): the rows' `targets` and
        `loss_mask` are [2B, T], pair i's chosen row at 2i and its rejected row at 2i + 1;
        precomputed reference log-probs ride along."""
        batch = trim_padding({k: v[idx] for k, v in pairs.items()})
        keys = ("tokens", "targets", "segment_ids", "positions", "loss_mask")
        rows = {
            k: np.stack([batch[f"chosen_{k}"], batch[f"rejected_{k}"]], axis=1).reshape(
                2 * len(idx), -1
            )
            for k in keys
        }
        if self.shares_prompts:
            packed = pack_groups(rows, batch["prompt_lengths"], 2)
        else:
            packed = pack_rows(rows)
        return packed | {k: batch[k] for k in ("ref_chosen", "ref_rejected") if k in batch}

    def logps(self, params: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """Token log-probs [B, 2, T] of the pairs' chosen and rejected replies (0 outside
        them) and their loss mask, the same shape."""
        token_logps = completion_logprobs(self.apply, params, batch)
        pairs = (-1, 2, token_logps.shape[-1])
        return token_logps.reshape(pairs), batch["loss_mask"].reshape(pairs)


def reference_logps(
    scorer: PairScorer, params: Any, pairs: dict[str, np.ndarray], batch_size: int
) -> dict:
    """`ref_chosen` and `ref_rejected` sequence log-probs [N] under `params`."""

    @jax.jit
    def score(params, batch):
        seq = sequence_logprobs(*scorer.logps(params, batch))
        return seq[:, 0], seq[:, 1]

    n = len(pairs["chosen_tokens"])
    chosen, rejected = [], []
    for start in range(0, n, batch_size):
        idx = np.arange(start, start + batch_size) % n  # a full last batch, as in training
        c, r = score(params, scorer.batch(pairs, idx))
        keep = min(batch_size, n - start)
        chosen.append(np.asarray(c)[:keep])
        rejected.append(np.asarray(r)[:keep])
    return {"ref_chosen": np.concatenate(chosen), "ref_rejected": np.concatenate(rejected)}


def make_dpo_loss(config: RLConfig, scorer: PairScorer):
    """DPO's loss over a pair batch; with `dpo.reference=live` the batch carries the reference
    params under "reference_params" (an argument, so they are not baked into the program)."""
    live = config.dpo.reference == "live"

    def loss_fn(params, batch):
        seq = sequence_logprobs(*scorer.logps(params, batch))
        if live:
            ref = sequence_logprobs(*scorer.logps(batch["reference_params"], batch))
            ref = jax.lax.stop_gradient(ref)
            ref_chosen, ref_rejected = ref[:, 0], ref[:, 1]
        else:
            ref_chosen, ref_rejected = batch["ref_chosen"], batch["ref_rejected"]
        return losses.dpo_loss(
            seq[:, 0],
            seq[:, 1],
            ref_chosen,
            ref_rejected,
            beta=config.dpo.beta,
            label_smoothing=config.dpo.label_smoothing,
        )

    return loss_fn


def make_orpo_loss(config: RLConfig, scorer: PairScorer):
    def loss_fn(params, batch):
        token_logps, mask = scorer.logps(params, batch)
        mean_logps = sequence_logprobs(token_logps, mask) / jnp.maximum(mask.sum(axis=-1), 1.0)
        chosen_logps, chosen_mask = token_logps[:, 0], mask[:, 0]
        nll = -(chosen_logps * chosen_mask).sum() / jnp.maximum(chosen_mask.sum(), 1.0)
        return losses.orpo_loss(mean_logps[:, 0], mean_logps[:, 1], nll, beta=config.orpo.beta)

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
    scorer = PairScorer(policy)
    batch_size = config.base.data.batch_size
    if config.algorithm == "dpo":
        if config.dpo.reference == "precompute":
            pairs.update(reference_logps(scorer, policy.params, pairs, batch_size))
        loss_fn = make_dpo_loss(config, scorer)
    else:
        loss_fn = make_orpo_loss(config, scorer)
    order = shuffled_batches(len(pairs["chosen_tokens"]), batch_size, config.base.data.seed)
    tx = optimizer(config, policy.params)
    train_step = jax.jit(trainer.make_train_step(loss_fn, tx), donate_argnums=0)
    run = Run(config, allocator)
    try:
        start, state, _ = run.restore(initial_state(policy.params, tx))

        def step_fn(state: dict[str, Any], step: int):
            idx = np.asarray(order[step])
            batch = scorer.batch(pairs, idx)
            if config.algorithm == "dpo" and config.dpo.reference == "live":
                batch["reference_params"] = policy.params
            state, metrics = train_step(state, batch)
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            return state, {**metrics, "tokens": batch["targets"].size}

        result = run.loop(state, step_fn, start=start)
        export_model(policy, result.state["params"], run)
        run.finish(result)
        return result
    finally:
        run.close()
