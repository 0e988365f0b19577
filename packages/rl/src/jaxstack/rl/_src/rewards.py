"""Reward functions: plain callables `(prompt, completion) -> float`, combined with weights.

A reward that raises is never silently zeroed: with `rollout.on_reward_error=stop` the run stops
with a `RewardError` naming the function and the prompt; with `skip` that completion is left out
of the update (its advantage and loss weight are zero) and counted in `rewards_skipped`.
"""

from __future__ import annotations

import dataclasses
import math
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxstack.rl._src.errors import ConfigError, RewardError

RewardFn = Callable[[str, str], float]


@dataclasses.dataclass(frozen=True)
class Reward:
    """One reward of an online (GRPO/PPO) run: `fn(prompt, completion) -> float`, weighted in the
    sum of rewards and logged under `name`.

    A config names rewards as `{"module:function": weight}`; Python code may pass `Reward`s,
    callables or `(callable, weight)` pairs (see `as_rewards`).
    """

    name: str
    fn: RewardFn
    weight: float = 1.0


def as_rewards(rewards: Mapping[str, float] | Sequence[Any]) -> list[Reward]:
    """`{"module:function": weight}` (a config's `rewards`), or a list of callables,
    `(callable, weight)` pairs or `Reward`s (Python use)."""
    if isinstance(rewards, Mapping):
        return [Reward(name, _import(name), float(w)) for name, w in rewards.items()]
    out = []
    for item in rewards:
        if isinstance(item, Reward):
            out.append(item)
        elif callable(item):
            out.append(Reward(getattr(item, "__name__", repr(item)), item))
        else:
            fn, weight = item
            out.append(Reward(getattr(fn, "__name__", repr(fn)), fn, float(weight)))
    if not out:
        raise ConfigError("no reward functions: GRPO and PPO need at least one")
    return out


def _import(name: str) -> RewardFn:
    """`module:function`; the module part may be a public attribute path of a package
    (`jaxstack.rl.arithmetic:exact_answer`), as `pkgutil.resolve_name` walks it."""
    module, _, attr = name.partition(":")
    if not attr:
        raise ConfigError(f"reward {name!r} is not of the form 'module:function'")
    try:
        fn = pkgutil.resolve_name(f"{module}.{attr}")
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"reward {name!r} cannot be imported ({e})") from None
    if not callable(fn):
        raise ConfigError(f"reward {name!r} is not callable")
    return fn


def score(
    rewards: Sequence[Reward],
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    on_error: str = "stop",
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """(weighted total [N], valid [N] (0 where a reward raised and was skipped), metrics).

    The metrics hold each function's `rewards/<function>/mean` and `/std` over the kept
    completions (TRL's names) and `rewards_skipped`.
    """
    total = np.zeros(len(completions), np.float32)
    valid = np.ones(len(completions), np.float32)
    metrics: dict[str, float] = {}
    for reward in rewards:
        values = np.zeros(len(completions), np.float32)
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            try:
                value = float(reward.fn(prompt, completion))
                if not math.isfinite(value):
                    raise ValueError(f"returned {value}")
            except Exception as e:
                if on_error == "stop":
                    raise RewardError(
                        f"reward {reward.name!r} raised {type(e).__name__}: {e} on prompt "
                        f"{prompt!r} (completion {completion!r}); fix the function or set "
                        "rollout.on_reward_error=skip"
                    ) from e
                valid[i] = 0.0
                continue
            values[i] = value
        total += reward.weight * values
        kept = valid > 0
        name = reward.name.rsplit(":", 1)[-1]  # the function's name, as TRL logs it
        metrics[f"rewards/{name}/mean"] = float(values[kept].mean()) if kept.any() else math.nan
        metrics[f"rewards/{name}/std"] = float(values[kept].std()) if kept.any() else math.nan
    metrics["rewards_skipped"] = float((valid == 0).sum())
    return total * valid, valid, metrics
