"""The post-training objectives, written to match their papers' equations.

Every function takes log-probabilities (never logits), so the same code scores a policy, a
frozen reference or the log-probs a sampler returned, and returns `(loss, metrics)` with scalar
metrics. Sequence log-probs are sums over a completion's tokens; token arrays are [B, T] with a
`mask` that is 1 on completion tokens.

- DPO (Rafailov et al., 2023, eq. 7), with the conservative label smoothing of cDPO.
- ORPO (Hong et al., 2024, eqs. 6-7): SFT loss plus lambda times the odds-ratio loss.
- GRPO (Shao et al., 2024, DeepSeekMath eq. 3 and 4): group-normalised outcome advantages, the
  clipped ratio per token, and the unbiased KL estimator against the reference policy.
- PPO (Schulman et al., 2017) with generalised advantage estimation (Schulman et al., 2016) and
  a clipped value loss, as used for RLHF (Ouyang et al., 2022).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Metrics = dict[str, jax.Array]


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    return (x * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def dpo_loss(
    chosen_logps: jax.Array,
    rejected_logps: jax.Array,
    ref_chosen_logps: jax.Array,
    ref_rejected_logps: jax.Array,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, Metrics]:
    """Direct Preference Optimisation on sequence log-probs [B].

    loss = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h), with
    h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l)); eps = 0 is plain DPO.
    The implicit rewards beta * (log pi - log ref) are logged under TRL's names:
    `rewards/chosen`, `rewards/rejected`, `rewards/margins` and `rewards/accuracies` (how often
    the chosen one is larger), with the policy's `logps/chosen` and `logps/rejected`.
    """
    chosen_rewards = beta * (chosen_logps - ref_chosen_logps)
    rejected_rewards = beta * (rejected_logps - ref_rejected_logps)
    logits = chosen_rewards - rejected_rewards
    losses = -(1.0 - label_smoothing) * jax.nn.log_sigmoid(logits) - (
        label_smoothing * jax.nn.log_sigmoid(-logits)
    )
    metrics = _preference_metrics(chosen_rewards, rejected_rewards)
    metrics.update({"logps/chosen": chosen_logps.mean(), "logps/rejected": rejected_logps.mean()})
    return losses.mean(), metrics


def _preference_metrics(chosen: jax.Array, rejected: jax.Array) -> Metrics:
    """TRL's names for a preference batch's rewards."""
    return {
        "rewards/chosen": chosen.mean(),
        "rewards/rejected": rejected.mean(),
        "rewards/margins": (chosen - rejected).mean(),
        "rewards/accuracies": (chosen > rejected).astype(jnp.float32).mean(),
    }


def orpo_loss(
    chosen_mean_logps: jax.Array,
    rejected_mean_logps: jax.Array,
    chosen_nll: jax.Array,
    *,
    beta: float = 0.1,
) -> tuple[jax.Array, Metrics]:
    """Odds-Ratio Preference Optimisation; no reference model.

    Args:
      chosen_mean_logps, rejected_mean_logps: [B] per-token *average* log-probs of the
        completions (the paper's length-normalised log P(y|x)).
      chosen_nll: scalar SFT loss on the chosen completions (mean token NLL).
      beta: the paper's lambda, weight of the odds-ratio term.

    loss = L_SFT + beta * mean(-log sigmoid(log odds(y_w) - log odds(y_l))), with
    log odds(y) = log P - log(1 - P).
    """

    def log_odds(logp: jax.Array) -> jax.Array:
        return logp - jnp.log(-jnp.expm1(logp))

    ratio = log_odds(chosen_mean_logps) - log_odds(rejected_mean_logps)
    or_loss = -jax.nn.log_sigmoid(ratio).mean()
    metrics = _preference_metrics(beta * chosen_mean_logps, beta * rejected_mean_logps)
    metrics.update(nll_loss=chosen_nll, odds_ratio_loss=or_loss, log_odds_ratio=ratio.mean())
    return chosen_nll + beta * or_loss, metrics


def group_advantages(
    rewards: jax.Array,
    group_size: int,
    *,
    valid: jax.Array | None = None,
    eps: float = 1e-4,
    scale: bool = True,
) -> jax.Array:
    """GRPO's outcome advantages: each reward normalised within its group of completions.

    `rewards` is [N * group_size], completions of one prompt adjacent. Returns
    (r - mean(group)) / (std(group) + eps), so every group sums to zero; a group whose
    completions all scored the same gives zeros (nothing to learn from it). `valid` (0/1, same
    shape) leaves completions out of their group's statistics and gives them advantage 0.
    `scale=False` keeps r - mean(group) (Dr. GRPO: dividing by the std up-weights the
    groups that are nearly all right or all wrong).
    """
    groups = rewards.reshape(-1, group_size)
    keep = jnp.ones_like(groups) if valid is None else valid.reshape(groups.shape)
    count = jnp.maximum(keep.sum(axis=1, keepdims=True), 1.0)
    mean = (groups * keep).sum(axis=1, keepdims=True) / count
    centred = groups - mean
    if scale:
        std = jnp.sqrt((jnp.square(centred) * keep).sum(axis=1, keepdims=True) / count)
        centred = centred / (std + eps)
    return (centred * keep).reshape(rewards.shape)


def grpo_loss(
    logps: jax.Array,
    old_logps: jax.Array,
    ref_logps: jax.Array | None,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_eps: float = 0.2,
    kl_coef: float = 0.04,
    loss_type: str = "grpo",
    max_tokens: int | None = None,
) -> tuple[jax.Array, Metrics]:
    """Group Relative Policy Optimisation, DeepSeekMath eq. 3 (to be minimised).

    Args:
      logps, old_logps, ref_logps: [B, T] token log-probs under the policy being trained, the
        policy that sampled the completions, and the reference policy. `ref_logps=None`
        drops the KL term (and its metric): with `kl_coef=0` no reference model need run.
      advantages: [B] one advantage per completion (`group_advantages`), shared by its tokens.
      mask: [B, T] 1 on completion tokens.

    Per token: min(rho A, clip(rho, 1 - eps, 1 + eps) A) - kl_coef * KL, with
    rho = exp(logps - old_logps) and KL = ref/pi - log(ref/pi) - 1 (eq. 4); averaged over each
    completion's tokens, then over completions; the loss is its negative. With
    `loss_type="dr_grpo"` (Liu et al. 2025) the tokens are summed and divided by the number of
    completions times `max_tokens`, the generation budget, instead of by each completion's
    length, which favours short wrong and long right answers.
    """
    mask = mask.astype(jnp.float32)
    adv = advantages[:, None]
    ratio = jnp.exp(logps - old_logps)
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    surrogate = jnp.minimum(ratio * adv, clipped * adv)
    metrics = {
        "clip_ratio": _masked_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32), mask),
        "ratio": _masked_mean(ratio, mask),
    }
    per_token = surrogate
    if ref_logps is not None:
        log_ref_ratio = ref_logps - logps
        kl = jnp.exp(log_ref_ratio) - log_ref_ratio - 1.0
        per_token = surrogate - kl_coef * kl
        metrics["kl"] = _masked_mean(kl, mask)
    if loss_type == "dr_grpo":
        objective = (per_token * mask).sum() / (mask.shape[0] * max_tokens)
    else:
        lengths = jnp.maximum(mask.sum(axis=1), 1.0)
        objective = ((per_token * mask).sum(axis=1) / lengths).mean()
    return -objective, metrics


def gae(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over [B, T] token rewards and values.

    delta_t = r_t + gamma V_{t+1} - V_t and A_t = delta_t + gamma lambda A_{t+1}, where steps
    past the end of a completion (mask 0) count as terminal. Returns (advantages, returns =
    advantages + values), both zero outside the mask and without gradient.
    """
    mask = mask.astype(jnp.float32)
    rewards, values = rewards * mask, values * mask
    next_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], axis=1)
    next_mask = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
    deltas = rewards + gamma * next_values * next_mask - values

    def step(carry, xs):
        delta, cont = xs
        adv = delta + gamma * lam * cont * carry
        return adv, adv

    _, adv = jax.lax.scan(step, jnp.zeros_like(deltas[:, 0]), (deltas.T, next_mask.T), reverse=True)
    adv = adv.T * mask
    return jax.lax.stop_gradient(adv), jax.lax.stop_gradient((adv + values) * mask)


def ppo_loss(
    logps: jax.Array,
    old_logps: jax.Array,
    advantages: jax.Array,
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    clip_eps: float = 0.2,
    value_clip_eps: float = 0.2,
    value_coef: float = 0.1,
) -> tuple[jax.Array, Metrics]:
    """PPO-clip policy loss plus the clipped value loss, token-averaged over the mask.

    policy: -min(rho A, clip(rho, 1 - eps, 1 + eps) A), rho = exp(logps - old_logps);
    value: 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2).
    All inputs are [B, T]; advantages and returns come from `gae`.
    """
    mask = mask.astype(jnp.float32)
    ratio = jnp.exp(logps - old_logps)
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    policy_loss = _masked_mean(-jnp.minimum(ratio * advantages, clipped * advantages), mask)
    values_clipped = old_values + jnp.clip(values - old_values, -value_clip_eps, value_clip_eps)
    value_err = jnp.maximum(jnp.square(values - returns), jnp.square(values_clipped - returns))
    value_loss = 0.5 * _masked_mean(value_err, mask)
    metrics = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "clip_ratio": _masked_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32), mask),
        "ratio": _masked_mean(ratio, mask),
    }
    return policy_loss + value_coef * value_loss, metrics
