"""The core update rule of each optimiser name, as Optax builds it, given a learning rate.

`core_factory` returns a function of the learning rate alone, so that `build_optimizer` can wrap
it in `optax.inject_hyperparams` (which is what makes the current learning rate readable from
the state). Every other hyperparameter comes from the config, and only those the config sets
are passed: the others keep the defaults of the Optax function that is called. Where optlib
assembles a rule from Optax's parts (muon's fallback, schedule-free AdamW with a decay mask),
the defaults are read from the signature of the Optax function it stands in for.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import optax
from optax import contrib

from jaxstack.optlib._src.config import OptimizerConfig

Mask = Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class Routing:
    """Which leaves get what: the weight-decay mask, muon's split, the schedule itself."""

    decay_mask: Mask
    muon_labels: Mask | None = None
    muon_dims: Mask | None = None
    schedule: optax.Schedule | None = None


def _given(**hyperparameters: Any) -> dict[str, Any]:
    """The hyperparameters the config sets (None means: the Optax default)."""
    return {name: value for name, value in hyperparameters.items() if value is not None}


def _default(function: Callable[..., Any], name: str) -> Any:
    return inspect.signature(function).parameters[name].default


def _with_l2(opt: optax.GradientTransformation, c: OptimizerConfig, mask: Mask):
    """Classic L2 regularisation (decay added to the gradient), as torch's Adam and SGD do."""
    if c.weight_decay == 0.0:
        return opt
    return optax.chain(optax.add_decayed_weights(c.weight_decay, mask), opt)


def _adamw(c: OptimizerConfig, lr: Any, r: Routing) -> optax.GradientTransformation:
    return optax.adamw(
        lr,
        weight_decay=c.weight_decay,
        mask=r.decay_mask,
        **_given(b1=c.b1, b2=c.b2, eps=c.eps, nesterov=c.nesterov),
    )


def _adam(c: OptimizerConfig, lr: Any, r: Routing) -> optax.GradientTransformation:
    opt = optax.adam(lr, **_given(b1=c.b1, b2=c.b2, eps=c.eps, nesterov=c.nesterov))
    return _with_l2(opt, c, r.decay_mask)


def _lion(c: OptimizerConfig, lr: Any, r: Routing) -> optax.GradientTransformation:
    return optax.lion(
        lr, weight_decay=c.weight_decay, mask=r.decay_mask, **_given(b1=c.b1, b2=c.b2)
    )


def _adafactor(c: OptimizerConfig, lr: Any, r: Routing) -> optax.GradientTransformation:
    return optax.adafactor(
        lr,
        weight_decay_rate=c.weight_decay or None,
        weight_decay_mask=r.decay_mask,
        **_given(momentum=c.momentum, eps=c.eps),
    )


def _sgd(c: OptimizerConfig, lr: Any, r: Routing) -> optax.GradientTransformation:
    opt = optax.sgd(lr, **_given(momentum=c.momentum, nesterov=c.nesterov))
    return _with_l2(opt, c, r.decay_mask)


def _muon(c: OptimizerConfig, lr: Any, r: Routing) -> optax.GradientTransformation:
    # optax.contrib.muon's own Adam fallback decays every fallback leaf alike; routing the
    # fallback leaves to a separate adamw (with muon's fallback settings) keeps the
    # weight-decay mask meaningful for them.
    muon = contrib.muon
    nesterov = c.nesterov if c.nesterov is not None else _default(muon, "nesterov")
    eps = c.eps if c.eps is not None else _default(muon, "eps")
    b1 = c.b1 if c.b1 is not None else _default(muon, "adam_b1")
    b2 = c.b2 if c.b2 is not None else _default(muon, "adam_b2")
    decay = {"weight_decay": c.weight_decay}
    return optax.partition(
        {
            "muon": muon(
                lr,
                eps=eps,
                weight_decay_mask=r.decay_mask,
                nesterov=nesterov,
                adam_b1=b1,
                adam_b2=b2,
                muon_weight_dimension_numbers=r.muon_dims,
                **decay,
                **_given(beta=c.momentum),
            ),
            "adam": optax.adamw(
                lr, b1=b1, b2=b2, eps=eps, mask=r.decay_mask, nesterov=nesterov, **decay
            ),
        },
        r.muon_labels,
    )


def _schedule_free_adamw(c: OptimizerConfig, lr: Any, r: Routing) -> optax.GradientTransformation:
    # optax.contrib.schedule_free_adamw, plus the weight-decay mask it does not take. Its
    # averaging weights read the schedule at its own 1-based step count, so they get the
    # schedule itself; the injected value (0-based, like every other optimiser) scales z.
    reference = contrib.schedule_free_adamw
    base = optax.chain(
        optax.scale_by_rms(
            decay=c.b2 if c.b2 is not None else _default(reference, "b2"),
            eps=c.eps if c.eps is not None else _default(reference, "eps"),
            eps_in_sqrt=False,
            bias_correction=True,
        ),
        optax.add_decayed_weights(c.weight_decay, r.decay_mask),
        optax.scale_by_learning_rate(lr),
    )
    return contrib.schedule_free(
        base,
        learning_rate=r.schedule if r.schedule is not None else lr,
        **_given(b1=c.b1),
    )


_BUILDERS: dict[str, Callable[[OptimizerConfig, Any, Routing], optax.GradientTransformation]] = {
    "adamw": _adamw,
    "adam": _adam,
    "lion": _lion,
    "adafactor": _adafactor,
    "sgd": _sgd,
    "muon": _muon,
    "schedule_free_adamw": _schedule_free_adamw,
}


def core_factory(
    config: OptimizerConfig, routing: Routing
) -> Callable[[Any], optax.GradientTransformation]:
    """A function learning_rate -> the optimiser's GradientTransformation."""
    builder = _BUILDERS[config.name]

    def factory(learning_rate: Any) -> optax.GradientTransformation:
        return builder(config, learning_rate, routing)

    return factory
