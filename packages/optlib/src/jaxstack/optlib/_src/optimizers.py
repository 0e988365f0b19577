"""The core update rule of each optimiser name, as Optax builds it, given a learning rate.

Each factory takes the learning rate as its only free argument so that `build_optimizer` can
wrap it in `optax.inject_hyperparams` (which is what makes the current learning rate readable
from the state). Everything else is fixed from the config. Defaults of `None` fields are the
Optax defaults of the respective optimiser.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optax
from optax import contrib

from jaxstack.optlib._src.config import OptimizerConfig

Mask = Callable[[Any], Any]


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def core_factory(
    config: OptimizerConfig,
    decay_mask: Mask,
    muon_labels: Mask | None = None,
    muon_dims: Mask | None = None,
    schedule: optax.Schedule | None = None,
) -> Callable[[Any], optax.GradientTransformation]:
    """A function learning_rate -> the optimiser's GradientTransformation."""
    c = config
    wd = c.weight_decay

    def adamw(learning_rate):
        return optax.adamw(
            learning_rate,
            b1=_or(c.b1, 0.9),
            b2=_or(c.b2, 0.999),
            eps=_or(c.eps, 1e-8),
            weight_decay=wd,
            mask=decay_mask,
            nesterov=_or(c.nesterov, False),
        )

    def adam(learning_rate):
        opt = optax.adam(
            learning_rate,
            b1=_or(c.b1, 0.9),
            b2=_or(c.b2, 0.999),
            eps=_or(c.eps, 1e-8),
            nesterov=_or(c.nesterov, False),
        )
        return _with_l2(opt, wd, decay_mask)

    def lion(learning_rate):
        return optax.lion(
            learning_rate, b1=_or(c.b1, 0.9), b2=_or(c.b2, 0.99), weight_decay=wd, mask=decay_mask
        )

    def adafactor(learning_rate):
        return optax.adafactor(
            learning_rate,
            momentum=c.momentum,
            eps=_or(c.eps, 1e-30),
            weight_decay_rate=wd or None,
            weight_decay_mask=decay_mask,
        )

    def sgd(learning_rate):
        opt = optax.sgd(learning_rate, momentum=c.momentum, nesterov=_or(c.nesterov, False))
        return _with_l2(opt, wd, decay_mask)

    def muon(learning_rate):
        # optax.contrib.muon's own Adam fallback decays every fallback leaf alike; routing the
        # fallback leaves to a separate adamw keeps the weight-decay mask meaningful for them.
        nesterov = _or(c.nesterov, True)
        eps = _or(c.eps, 1e-8)
        b1, b2 = _or(c.b1, 0.9), _or(c.b2, 0.999)
        return optax.partition(
            {
                "muon": contrib.muon(
                    learning_rate,
                    beta=_or(c.momentum, 0.95),
                    eps=eps,
                    weight_decay=wd,
                    weight_decay_mask=decay_mask,
                    nesterov=nesterov,
                    adam_b1=b1,
                    adam_b2=b2,
                    muon_weight_dimension_numbers=muon_dims,
                ),
                "adam": optax.adamw(
                    learning_rate,
                    b1=b1,
                    b2=b2,
                    eps=eps,
                    weight_decay=wd,
                    mask=decay_mask,
                    nesterov=nesterov,
                ),
            },
            muon_labels,
        )

    def schedule_free_adamw(learning_rate):
        # optax.contrib.schedule_free_adamw, plus the weight-decay mask it does not take. Its
        # averaging weights read the schedule at its own 1-based step count, so they get the
        # schedule itself; the injected value (0-based, like every other optimiser) scales z.
        base = optax.chain(
            optax.scale_by_rms(
                decay=_or(c.b2, 0.999),
                eps=_or(c.eps, 1e-8),
                eps_in_sqrt=False,
                bias_correction=True,
            ),
            optax.add_decayed_weights(wd, decay_mask),
            optax.scale_by_learning_rate(learning_rate),
        )
        return contrib.schedule_free(
            base, learning_rate=_or(schedule, learning_rate), b1=_or(c.b1, 0.9)
        )

    return {
        "adamw": adamw,
        "adam": adam,
        "lion": lion,
        "adafactor": adafactor,
        "sgd": sgd,
        "muon": muon,
        "schedule_free_adamw": schedule_free_adamw,
    }[c.name]


def _with_l2(
    opt: optax.GradientTransformation, wd: float, mask: Mask
) -> optax.GradientTransformation:
    """Classic L2 regularisation (decay added to the gradient), as torch's Adam and SGD do."""
    if wd == 0.0:
        return opt
    return optax.chain(optax.add_decayed_weights(wd, mask), opt)
