"""The objectives against the papers' formulas, evaluated by hand with NumPy on small inputs."""

import math

import numpy as np

from jaxstack import rl


def log_sigmoid(x):
    return -np.log1p(np.exp(-x))


def test_dpo_loss_matches_rafailov_eq7_with_cdpo_smoothing():
    beta, eps = 0.5, 0.1
    pi_w, pi_l = np.array([-3.0, -5.0]), np.array([-4.0, -2.4])
    ref_w, ref_l = np.array([-3.5, -4.0]), np.array([-3.0, -2.5])
    # h = beta * [(log pi(yw) - log ref(yw)) - (log pi(yl) - log ref(yl))], row by row
    h = [0.5 * ((-3.0 + 3.5) - (-4.0 + 3.0)), 0.5 * ((-5.0 + 4.0) - (-2.4 + 2.5))]
    np.testing.assert_allclose(h, [0.75, -0.55])
    per_pair = [-(1 - eps) * log_sigmoid(x) - eps * log_sigmoid(-x) for x in h]
    loss, metrics = rl.dpo_loss(pi_w, pi_l, ref_w, ref_l, beta=beta, label_smoothing=eps)
    np.testing.assert_allclose(float(loss), np.mean(per_pair), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["rewards/chosen"]), np.mean([0.25, -0.5]), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["rewards/rejected"]), np.mean([-0.5, 0.05]), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["rewards/margins"]), 0.1, rtol=1e-5)
    assert float(metrics["rewards/accuracies"]) == 0.5  # the first pair right, not the second
    np.testing.assert_allclose(float(metrics["logps/chosen"]), -4.0)
    np.testing.assert_allclose(float(metrics["logps/rejected"]), -3.2, rtol=1e-6)


def test_plain_dpo_at_equal_policies_is_log_2():
    x = np.array([-1.0, -2.0, -3.0])
    loss, _ = rl.dpo_loss(x, x - 1, x, x - 1, beta=0.1)
    np.testing.assert_allclose(float(loss), math.log(2.0), rtol=1e-6)


def test_orpo_loss_matches_hong_eq6_7():
    lam = 0.2
    mean_w, mean_l = np.array([-0.2, -1.5]), np.array([-0.9, -0.4])
    nll = 0.7
    odds = lambda lp: np.log(np.exp(lp) / (1.0 - np.exp(lp)))  # log(P / (1 - P))
    l_or = np.mean([-log_sigmoid(odds(w) - odds(r)) for w, r in zip(mean_w, mean_l, strict=True)])
    loss, metrics = rl.orpo_loss(mean_w, mean_l, np.float32(nll), beta=lam)
    np.testing.assert_allclose(float(loss), nll + lam * l_or, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["odds_ratio_loss"]), l_or, rtol=1e-5)
    assert float(metrics["rewards/accuracies"]) == 0.5


def test_group_advantages_are_zero_mean_unit_scale_per_group():
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 3.0, 3.0, 3.0, 3.0, 0.5, 2.0, -1.0, 0.0])
    adv = np.asarray(rl.group_advantages(rewards, 4))
    groups = adv.reshape(3, 4)
    np.testing.assert_allclose(groups.sum(axis=1), 0.0, atol=1e-5)
    np.testing.assert_allclose(groups[1], 0.0)  # equal rewards: nothing to learn
    # group 0: mean 0.5, std 0.5 -> +-1 (up to eps)
    np.testing.assert_allclose(groups[0], [1, -1, -1, 1], rtol=1e-3)
    g = rewards[8:]
    np.testing.assert_allclose(groups[2], (g - g.mean()) / (g.std() + 1e-4), rtol=1e-6)


def test_group_advantages_leave_out_invalid_completions():
    rewards = np.array([1.0, 0.0, 7.0, 0.0])
    valid = np.array([1.0, 1.0, 0.0, 1.0])
    adv = np.asarray(rl.group_advantages(rewards, 4, valid=valid))
    kept = np.array([1.0, 0.0, 0.0])  # mean 1/3, std sqrt(2)/3
    expected = (kept - kept.mean()) / (kept.std() + 1e-4)
    np.testing.assert_allclose(adv[[0, 1, 3]], expected, rtol=1e-5)
    assert adv[2] == 0.0


def test_grpo_loss_matches_deepseekmath_eq3_eq4():
    eps, beta = 0.2, 0.1
    logp = np.array([[-1.0, -2.0, -0.5], [-0.3, -1.2, -9.0]])
    old = np.array([[-1.5, -1.9, -0.5], [-0.2, -1.0, -9.0]])
    ref = np.array([[-1.2, -2.5, -0.7], [-0.4, -1.1, -9.0]])
    mask = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # second completion has 2 tokens
    adv = np.array([0.8, -1.3])
    objective = []
    for i in range(2):
        terms = []
        for t in range(3):
            if not mask[i, t]:
                continue
            ratio = math.exp(logp[i, t] - old[i, t])
            clipped = min(max(ratio, 1 - eps), 1 + eps)
            surrogate = min(ratio * adv[i], clipped * adv[i])
            r = math.exp(ref[i, t] - logp[i, t])  # pi_ref / pi_theta
            kl = r - math.log(r) - 1
            terms.append(surrogate - beta * kl)
        objective.append(sum(terms) / len(terms))  # 1/|o_i| sum_t
    expected = -np.mean(objective)  # 1/G sum_i, negated to minimise
    loss, metrics = rl.grpo_loss(logp, old, ref, adv, mask, clip_eps=eps, kl_coef=beta)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    assert 0.0 < float(metrics["clip_ratio"]) < 1.0


def test_dr_grpo_sums_tokens_over_a_constant_and_does_not_divide_by_the_group_std():
    """Dr. GRPO (Liu et al. 2025, eq. 3): no 1/|o_i| and no std(r) in the advantage; the
    per-token terms are summed and divided by G x the generation budget (a constant)."""
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 1.0, 0.0])
    adv = np.asarray(rl.group_advantages(rewards, 4, scale=False))
    np.testing.assert_allclose(adv, [0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.5, -0.5], atol=1e-6)

    logp = np.array([[-1.0, -2.0, -0.5], [-0.3, -1.2, -9.0]])
    old = np.array([[-1.5, -1.9, -0.5], [-0.2, -1.0, -9.0]])
    mask = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    a = np.array([0.8, -1.3])
    total = 0.0
    for i in range(2):
        for t in range(3):
            if mask[i, t]:
                ratio = math.exp(logp[i, t] - old[i, t])
                clipped = min(max(ratio, 0.8), 1.2)
                total += min(ratio * a[i], clipped * a[i])
    expected = -total / (2 * 4)  # G = 2 completions, a budget of 4 new tokens each
    # Without a KL term no reference log-probs are needed (kl_coef=0 runs no reference model)
    loss, metrics = rl.grpo_loss(
        logp, old, None, a, mask, clip_eps=0.2, kl_coef=0.0, loss_type="dr_grpo", max_tokens=4
    )
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    assert "kl" not in metrics


def test_gae_matches_the_backward_recursion():
    gamma, lam = 0.9, 0.8
    r = np.array([[0.0, 0.1, 1.0, 5.0]])
    v = np.array([[0.5, 0.4, 0.3, 9.0]])
    mask = np.array([[1.0, 1.0, 1.0, 0.0]])  # the last step is padding: terminal after t=2
    # delta_t = r_t + gamma V_{t+1} - V_t (V = 0 past the end)
    d2 = 1.0 + 0.0 - 0.3
    d1 = 0.1 + gamma * 0.3 - 0.4
    d0 = 0.0 + gamma * 0.4 - 0.5
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    adv, ret = rl.gae(r, v, mask, gamma=gamma, lam=lam)
    np.testing.assert_allclose(np.asarray(adv)[0], [a0, a1, a2, 0.0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(ret)[0], [a0 + 0.5, a1 + 0.4, a2 + 0.3, 0.0], rtol=1e-5)


def test_ppo_loss_matches_clipped_policy_and_value_terms():
    eps, eps_v, c = 0.2, 0.1, 0.5
    logp = np.array([[-1.0, -0.2]])
    old = np.array([[-1.4, -0.1]])
    adv = np.array([[1.5, -0.7]])
    values = np.array([[0.9, -0.3]])
    old_values = np.array([[0.5, -0.25]])
    returns = np.array([[1.0, 0.2]])
    mask = np.ones((1, 2))
    pg, vf = [], []
    for t in range(2):
        ratio = math.exp(logp[0, t] - old[0, t])
        clipped = min(max(ratio, 1 - eps), 1 + eps)
        pg.append(-min(ratio * adv[0, t], clipped * adv[0, t]))
        v_clip = old_values[0, t] + min(max(values[0, t] - old_values[0, t], -eps_v), eps_v)
        vf.append(0.5 * max((values[0, t] - returns[0, t]) ** 2, (v_clip - returns[0, t]) ** 2))
    loss, metrics = rl.ppo_loss(
        logp,
        old,
        adv,
        values,
        old_values,
        returns,
        mask,
        clip_eps=eps,
        value_clip_eps=eps_v,
        value_coef=c,
    )
    np.testing.assert_allclose(float(metrics["policy_loss"]), np.mean(pg), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["value_loss"]), np.mean(vf), rtol=1e-5)
    np.testing.assert_allclose(float(loss), np.mean(pg) + c * np.mean(vf), rtol=1e-5)
