"""GRPO and PPO: sample with the engine, score with reward functions, update the policy.

One iteration (`train.steps` of them):

    hand the current params to the engine (in memory) -> sample group_size completions for
    data.batch_size prompts -> rewards -> log-probs of the sampling policy and the reference
    (and values, PPO) -> advantages (group-relative for GRPO, GAE for PPO)
    -> updates_per_iteration optimiser steps on the clipped objective
    -> (launched, not waited for) the next iteration's first engine step, under the new params

Rows are padded to the smallest of 8, 12, 16, 24, 32, ... columns (up to `data.seq_len`) that
holds the iteration's longest completion, as TRL pads to its longest: short completions cost a short
update, and the iterations share a handful of compiled programs. GRPO's model passes go further
and run over packed rows, each group's prompt once with its completions after it (`pack_groups`;
`pack_rows` for models with sliding windows), so neither padding nor the prompt's copies cost.
Each role (actor, reference, rollout engine) lives on the mesh `roles.<role>` names
(placement.py).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstack.rl._src import losses
from jaxstack.rl._src.config import RLConfig
from jaxstack.rl._src.encode import pack_rows, sequence_batch, shuffled_batches, trim_padding
from jaxstack.rl._src.errors import ConfigError
from jaxstack.rl._src.logprobs import (
    completion_logprobs,
    completion_positions,
    logprobs_at_completions,
)
from jaxstack.rl._src.placement import Placement, place_roles
from jaxstack.rl._src.policy import Policy, build_policy
from jaxstack.rl._src.records import read_prompts
from jaxstack.rl._src.rewards import Reward, as_rewards, score
from jaxstack.rl._src.rollout import EngineSampler
from jaxstack.rl._src.run import (
    Evaluate,
    Run,
    RunResult,
    initial_state,
    optimizer,
    prepare_host,
)
from jaxstack.rl._src.sft import export_model, require_data
from jaxstack.rl._src.shared_prompt import pack_groups, shared_prompt_attention, shares_prompts


@dataclasses.dataclass
class Rollouts:
    """One iteration's sampled rows, their rewards and the sampling statistics."""

    batch: dict[str, np.ndarray]  # sequence batch [B*G, T]
    rewards: np.ndarray  # [B*G]
    valid: np.ndarray  # [B*G], 0 where a reward raised and was skipped
    metrics: dict[str, float]
    prompt_lengths: np.ndarray  # [B], the tokens of each group's prompt


class Rollouter:
    """Prompts, the engine and the reward functions of an online run."""

    def __init__(
        self,
        config: RLConfig,
        policy: Policy,
        rewards: Sequence[Reward],
        roles: Mapping[str, Placement],
    ):
        encoder = policy.encoder()
        prompts = read_prompts(require_data(config))
        self.config = config
        self.policy = policy
        self.encoder = encoder
        self.rewards = rewards
        self.texts = [encoder.prompt_text(p) for p in prompts]
        self.prompt_ids = [encoder.prompt(p) for p in prompts]
        longest = max(len(p) for p in self.prompt_ids)
        seq_len = config.base.data.seq_len
        if longest >= seq_len:
            raise ConfigError(
                f"the longest prompt has {longest} tokens, data.seq_len={seq_len} leaves no room "
                "for a completion; raise data.seq_len"
            )
        data = config.base.data
        self.order = shuffled_batches(len(prompts), data.batch_size, data.seed)
        group = config.rollout.group_size
        self.sampler = EngineSampler(
            policy,
            roles["rollout"],
            max_model_len=min(
                policy.model.config.max_seq_len, longest + config.rollout.max_new_tokens
            ),
            max_num_seqs=min(256, config.base.data.batch_size * group),
            seed=config.base.train.seed,
            prefill_tokens=config.base.data.batch_size * group * longest,
        )
        self.started: tuple[int, Any] | None = None  # (iteration, its sequences) once started

    def greedy_fn(self, params: Any) -> Callable[[Sequence[str]], list[str]]:
        """`generate(prompts) -> completions`: greedy, under `params`, for an evaluation."""
        return self.sampler.greedy_fn(params, self.encoder, self.config.rollout.max_new_tokens)

    def start(self, params: Any, iteration: int) -> None:
        """Hand `params` to the engine and launch the iteration's first engine step without
        waiting. Called while the previous update computes (its params not ready yet), the
        host's share of the round's start (requests, scheduling, the step's inputs) runs beside
        that update instead of after it."""
        r = self.config.rollout
        self.sampler.update_weights(params)
        started = self.sampler.start(
            [self.prompt_ids[i] for i in self.order[iteration]],
            n=r.group_size,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_k=r.top_k,
            iteration=iteration,
        )
        self.started = iteration, started

    def collect(self, params: Any, iteration: int) -> Rollouts:
        """The iteration's rollouts under `params` (`start`ed already, or started here);
        `rollout_s` times this call."""
        r, data = self.config.rollout, self.config.base.data
        t = time.perf_counter()
        if self.started is None or self.started[0] != iteration:
            self.start(params, iteration)
        done = self.sampler.finish(self.started[1])
        self.started = None
        rollout_s = time.perf_counter() - t
        idx = np.asarray(self.order[iteration])
        prompts = [self.prompt_ids[i] for i in idx]
        texts = [self.texts[i] for i in idx for _ in range(r.group_size)]
        rewards, valid, metrics = score(self.rewards, texts, done.texts, on_error=r.on_reward_error)
        rows = [p for p in prompts for _ in range(r.group_size)]
        # cut to the longest completion (in 8, 12, 16, 24, ... columns), as TRL pads
        batch = trim_padding(
            sequence_batch(rows, done.token_ids, data.seq_len, self.policy.tokenizer.pad_id)
        )
        batch["loss_mask"] *= valid[:, None]
        metrics.update(
            completion_metrics(
                rewards,
                valid,
                done.token_ids,
                r.group_size,
                r.max_new_tokens,
                self.policy.tokenizer.eos_id,
            ),
            rollout_s=rollout_s,
            rollout_tokens_per_sec=done.num_tokens / rollout_s,
        )
        return Rollouts(batch, rewards, valid, metrics, np.array([len(p) for p in prompts]))


def completion_metrics(
    rewards: np.ndarray,
    valid: np.ndarray,
    token_ids: Sequence[np.ndarray],
    group_size: int,
    max_new_tokens: int,
    eos_id: int,
) -> dict[str, float]:
    """A round of rollouts in TRL's terms: `reward` (mean of the weighted total) and
    `reward_std` (the mean over prompts of the std within each group, the spread advantages
    are made of), completion lengths, and `completions/clipped_ratio`, the share cut at
    `max_new_tokens` before their end-of-sequence."""
    kept = valid > 0
    groups = rewards.reshape(-1, group_size)
    keep = kept.reshape(groups.shape)
    count = np.maximum(keep.sum(axis=1), 1)
    mean = (groups * keep).sum(axis=1) / count
    std = np.sqrt((np.square(groups - mean[:, None]) * keep).sum(axis=1) / count)
    lengths = np.asarray([len(t) for t in token_ids], np.float32)
    ended = np.asarray([len(t) > 0 and t[-1] == eos_id for t in token_ids])
    nan = float("nan")
    return {
        "reward": float(rewards[kept].mean()) if kept.any() else nan,
        "reward_std": float(std[keep.any(axis=1)].mean()) if kept.any() else nan,
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        "completions/clipped_ratio": float(np.mean((lengths >= max_new_tokens) & ~ended)),
    }


INDEX_KEYS = ("completion_index", "completion_source")
"""Batch arrays that index all the rows (`completion_positions`, `pack_rows`): every device
gets them whole."""


def place_rows(placement: Placement, batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """Rollout rows on a role's mesh, split on rows, with their `INDEX_KEYS` arrays copied
    whole to every device."""
    placed = placement.put_batch({k: v for k, v in batch.items() if k not in INDEX_KEYS})
    placed.update({k: placement.put_replicated(batch[k]) for k in INDEX_KEYS if k in batch})
    return placed


def _online_run(
    config: RLConfig,
    rewards: Mapping[str, float] | Sequence[Any] | None,
    make_update: Callable[[Policy, Mapping[str, Placement]], Any],
    evaluate: Evaluate | None,
) -> RunResult:
    reward_list = as_rewards(rewards if rewards is not None else config.rewards)
    allocator = prepare_host(config)
    roles = place_roles(config)
    policy = build_policy(config)
    rollouter = Rollouter(config, policy, reward_list, roles)
    run = Run(config, allocator)
    try:
        update = make_update(policy, roles)
        start, state, _ = run.restore(update.initial_state())
        state = roles["actor"].put_state(state)  # a restored state comes back unplaced

        def step_fn(state, step):
            evaluation = evaluate is not None and run.evaluation_due(step + 1)
            # the next round starts beside this update, unless an evaluation samples between
            follows = step + 1 < config.base.train.steps and not evaluation
            state, metrics = update.iteration(state, step, rollouter, follows)
            if evaluation:
                generate = rollouter.greedy_fn(update.policy_params(state["params"]))
                metrics.update(evaluate(step + 1, generate))
            return state, metrics

        result = run.loop(state, step_fn, start=start)
        export_model(policy, update.policy_params(result.state["params"]), run)
        run.finish(result)
        return result
    finally:
        run.close()


class GrpoUpdate:
    """GRPO's iteration: group-relative advantages, clipped ratio, KL to the reference."""

    def __init__(self, config: RLConfig, policy: Policy, roles: Mapping[str, Placement]):
        self.config = config
        self.policy = policy
        self.actor, self.reference = roles["actor"], roles["reference"]
        self.tx = optimizer(config, policy.params)
        g, temperature = config.grpo, config.rollout.temperature
        # Without a KL term the reference policy is never read: no copy, no forward pass.
        self.ref_params = self.reference.put(policy.params) if g.kl_coef else None
        # A reference on the actor's mesh runs its forward pass inside the train step (one
        # program, the rows placed once); on devices of its own it runs there, and its
        # log-probs are sent to the actor.
        self.reference_in_step = self.ref_params is not None and (
            (self.reference.mesh, self.reference.rules) == (self.actor.mesh, self.actor.rules)
        )
        # One update per batch is on-policy: the sampling policy is the one being updated, so
        # its log-probs are those of the loss's own forward pass (ratio 1), not a second one.
        self.on_policy = g.updates_per_iteration == 1
        # The model passes read each group's prompt once (`pack_groups`), unless a sliding
        # window needs the rows whole (`pack_rows`).
        self.shares_prompts = shares_prompts(policy.model.config)
        apply = policy.apply_with(shared_prompt_attention) if self.shares_prompts else policy.apply
        # Log-probs at the completion positions only (the batch's completion_index): the
        # output projection and softmax skip the prompt and padding positions.
        self.logprobs = jax.jit(partial(completion_logprobs, apply, temperature=temperature))

        def loss_fn(params, batch):
            logps = completion_logprobs(apply, params, batch, temperature)
            ref_logps = batch.get("ref_logps")
            if "reference_params" in batch:
                ref_logps = completion_logprobs(
                    apply, batch["reference_params"], batch, temperature
                )
            advantages = losses.group_advantages(
                batch["rewards"],
                config.rollout.group_size,
                valid=batch["valid"],
                scale=g.scale_rewards,
            )
            return losses.grpo_loss(
                logps,
                jax.lax.stop_gradient(logps) if self.on_policy else batch["old_logps"],
                ref_logps,
                advantages,
                batch["loss_mask"],
                clip_eps=g.clip_eps,
                kl_coef=g.kl_coef,
                loss_type=g.loss_type,
                max_tokens=config.rollout.max_new_tokens,
            )

        from jaxstack.trainer import make_train_step

        self.train_step = jax.jit(make_train_step(loss_fn, self.tx), donate_argnums=0)

    def initial_state(self) -> dict[str, Any]:
        return self.actor.put_state(initial_state(self.policy.params, self.tx))

    def policy_params(self, params: Any) -> Any:
        return params

    def iteration(self, state, iteration: int, rollouter: Rollouter, next_follows: bool = False):
        rollouts = rollouter.collect(state["params"], iteration)
        t = time.perf_counter()
        # the model passes run over packed rows: the recipe's rows (a 7-token prompt, a
        # completion of a few tokens) in 16 columns are 40% padding; packed, its update halved
        devices = math.lcm(self.actor.mesh.size, self.reference.mesh.size)
        if self.shares_prompts:
            group = self.config.rollout.group_size
            packed = pack_groups(rollouts.batch, rollouts.prompt_lengths, group, devices)
        else:
            packed = pack_rows(rollouts.batch, devices)
        packed |= {"rewards": rollouts.rewards, "valid": rollouts.valid}  # advantages in the step
        batch = place_rows(self.actor, packed)
        if self.reference_in_step:
            batch["reference_params"] = self.ref_params
        elif self.ref_params is not None:
            ref_rows = place_rows(self.reference, packed)
            ref_logps = self.logprobs(self.ref_params, ref_rows)
            batch["ref_logps"] = self.actor.put_batch(ref_logps)
        if not self.on_policy:
            batch["old_logps"] = self.logprobs(state["params"], batch)
        for _ in range(self.config.grpo.updates_per_iteration):
            state, metrics = self.train_step(state, batch)
        if next_follows:
            rollouter.start(state["params"], iteration + 1)
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        metrics["update_s"] = time.perf_counter() - t
        metrics["zero_advantage_groups"] = zero_advantage_share(
            rollouts.rewards, rollouts.valid, self.config.rollout.group_size
        )
        return state, {**rollouts.metrics, **metrics}


def zero_advantage_share(rewards: np.ndarray, valid: np.ndarray, group_size: int) -> float:
    """Share of prompts whose completions all scored the same: their advantages are zero, so
    they add nothing to the update (a run where this stays near 1 is not learning)."""
    kept = (valid > 0).reshape(-1, group_size)
    groups = rewards.reshape(-1, group_size)
    highest = np.where(kept, groups, -np.inf).max(axis=1)
    lowest = np.where(kept, groups, np.inf).min(axis=1)
    return float(np.mean(~(highest > lowest)))


def grpo(
    config: RLConfig,
    rewards: Mapping[str, float] | Sequence[Any] | None = None,
    *,
    evaluate: Evaluate | None = None,
) -> RunResult:
    """GRPO on the prompts in `data.path`; the model lands in run_dir/model.

    Args:
      rewards: overrides the config's reward functions: callables `(prompt, completion) ->
        float`, `(callable, weight)` pairs, or a `{"module:function": weight}` mapping.
      evaluate: called as `evaluate(iteration, generate)` every `eval.every` iterations and
        after the last, with a greedy `generate(prompts) -> completions` of the current policy;
        the metrics it returns are logged with that iteration's.
    """
    return _online_run(
        config, rewards, lambda policy, roles: GrpoUpdate(config, policy, roles), evaluate
    )


class PpoUpdate:
    """PPO's iteration: a value head on the policy's last hidden state, per-token KL-penalised
    rewards with the sequence reward on the last token, GAE, clipped policy and value losses."""

    def __init__(self, config: RLConfig, policy: Policy, roles: Mapping[str, Placement]):
        from jaxstack.trainer import make_train_step

        self.config = config
        self.policy = policy
        self.actor, self.reference = roles["actor"], roles["reference"]
        self.ref_params = self.reference.put(policy.params)
        self.ref_logprobs = jax.jit(
            partial(completion_logprobs, policy.apply, temperature=config.rollout.temperature)
        )
        d_model = policy.model.config.d_model
        self.params = {
            "policy": policy.params,
            "value_head": {"kernel": jnp.zeros((d_model,), jnp.float32), "bias": jnp.zeros(())},
        }
        self.tx = optimizer(config, self.params)
        hidden_states = policy.apply.method("hidden_states")
        p, temperature = config.ppo, config.rollout.temperature

        def forward(params, batch):
            """(token log-probs, values), both [B, T]; the log-probs at the batch's
            completion_index only (0 elsewhere), as GRPO's."""
            x, _, _ = hidden_states(
                params["policy"], batch["tokens"], batch["positions"], batch["segment_ids"]
            )
            logps = logprobs_at_completions(policy.apply, params["policy"], x, batch, temperature)
            head = params["value_head"]
            return logps, x.astype(jnp.float32) @ head["kernel"] + head["bias"]

        @jax.jit
        def prepare(params, batch, ref_logps, scores):
            """Old log-probs and values, KL-penalised token rewards, GAE advantages."""
            logps, values = forward(params, batch)
            mask = batch["loss_mask"]
            last = jnp.argmax(jnp.cumsum(mask, axis=1), axis=1)  # last completion token
            rewards = -p.kl_coef * (logps - ref_logps) * mask
            rewards = rewards.at[jnp.arange(mask.shape[0]), last].add(scores)
            adv, returns = losses.gae(rewards, values, mask, gamma=p.gamma, lam=p.lam)
            mean = (adv * mask).sum() / jnp.maximum(mask.sum(), 1.0)
            var = (jnp.square(adv - mean) * mask).sum() / jnp.maximum(mask.sum(), 1.0)
            adv = (adv - mean) / jnp.sqrt(var + 1e-8) * mask  # whitened, as in RLHF practice
            kl = ((logps - ref_logps) * mask).sum() / jnp.maximum(mask.sum(), 1.0)
            return logps, values, adv, returns, kl

        def loss_fn(params, batch):
            logps, values = forward(params, batch)
            return losses.ppo_loss(
                logps,
                batch["old_logps"],
                batch["advantages"],
                values,
                batch["old_values"],
                batch["returns"],
                batch["loss_mask"],
                clip_eps=p.clip_eps,
                value_clip_eps=p.value_clip_eps,
                value_coef=p.value_coef,
            )

        self.prepare = prepare
        self.train_step = jax.jit(make_train_step(loss_fn, self.tx), donate_argnums=0)

    def initial_state(self) -> dict[str, Any]:
        return self.actor.put_state(initial_state(self.params, self.tx))

    def policy_params(self, params: Any) -> Any:
        return params["policy"]

    def iteration(self, state, iteration: int, rollouter: Rollouter, next_follows: bool = False):
        rollouts = rollouter.collect(state["params"]["policy"], iteration)
        t = time.perf_counter()
        index = completion_positions(rollouts.batch["loss_mask"])
        rows = {**rollouts.batch, "completion_index": index}
        batch = place_rows(self.actor, rows)
        ref_rows = place_rows(self.reference, rows)
        ref_logps = self.ref_logprobs(self.ref_params, ref_rows)
        old_logps, old_values, adv, returns, kl = self.prepare(
            state["params"],
            batch,
            self.actor.put_batch(ref_logps),
            self.actor.put_batch(rollouts.rewards),
        )
        batch.update(old_logps=old_logps, old_values=old_values, advantages=adv, returns=returns)
        for _ in range(self.config.ppo.updates_per_iteration):
            state, metrics = self.train_step(state, batch)
        if next_follows:
            rollouter.start(state["params"]["policy"], iteration + 1)
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        metrics.update(kl=float(kl), update_s=time.perf_counter() - t)
        return state, {**rollouts.metrics, **metrics}


def ppo(
    config: RLConfig,
    rewards: Mapping[str, float] | Sequence[Any] | None = None,
    *,
    evaluate: Evaluate | None = None,
) -> RunResult:
    """PPO on the prompts in `data.path`, with a value head; arguments as for `grpo`."""
    return _online_run(
        config, rewards, lambda policy, roles: PpoUpdate(config, policy, roles), evaluate
    )
