"""Check a real-size config without allocating it: ahead-of-time lowering and compilation.

Everything is abstract: the model comes from `nnx.eval_shape`, the optimiser state from
`jax.eval_shape`, and the train step is lowered on `jax.ShapeDtypeStruct`s that carry the run's
shardings. When enough devices exist (a CPU process can fake them with
`--xla_force_host_platform_device_count`, which the CLI sets for `--dry-run`), the step is also
compiled for the mesh, and XLA's memory analysis gives the per-device bytes; otherwise it is
lowered on an `AbstractMesh` and the per-device state bytes are computed from the shardings.
FLOPs per step come from XLA's cost analysis and from nnlib's analytic count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstack.trainer._src import extras
from jaxstack.trainer._src import mesh as mesh_mod
from jaxstack.trainer._src import model as model_mod
from jaxstack.trainer._src.config import Config
from jaxstack.trainer._src.session import abstract_batch, loss_fn_for, plan_state
from jaxstack.trainer._src.step import make_train_step
from jaxstack.trainer._src.units import si


def dry_run(
    config: Config,
    mesh_sizes: dict[str, int] | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> dict[str, Any]:
    """Lowers (and if possible compiles) one train step; returns a flat report dict.

    `mesh_sizes` gives the axis sizes (default: the config's mesh over the devices). `devices`
    are the devices to compile for (default: the visible ones; `aot.aot_train_compile` passes a
    described TPU slice's). Raises MeshError if the batch does not divide the mesh, as a real
    run would.
    """
    from jaxstack import datalib

    t0 = time.perf_counter()
    tokenizer_vocab = None
    if config.data.vocab_from_tokenizer and config.data.tokenizer == "byte":
        tokenizer_vocab = datalib.ByteTokenizer().vocab_size
    mcfg = model_mod.model_config(config, tokenizer_vocab)
    devices = list(devices) if devices is not None else jax.devices()
    n_visible = len(devices)
    if mesh_sizes is None:
        mesh_sizes = mesh_mod.resolve_axes(config.mesh, n_visible)
    mesh_sizes = {a: int(mesh_sizes.get(a, 1)) for a in mesh_mod.AXES}
    mesh_mod.check_batch(config, mesh_sizes)
    n = math.prod(mesh_sizes.values())
    concrete = n <= n_visible
    if concrete:
        shape = tuple(mesh_sizes[a] for a in mesh_mod.AXES)
        auto = (jax.sharding.AxisType.Auto,) * len(mesh_mod.AXES)
        mesh = jax.make_mesh(shape, mesh_mod.AXES, axis_types=auto, devices=devices[:n])
    else:
        mesh = mesh_mod.abstract_mesh(mesh_sizes)
    rules = mesh_mod.logical_rules(config.mesh)

    model = model_mod.abstract_model(
        mcfg, config.train.seed, extras.attention_function(config.train.attention)
    )
    apply, params, tx, opt_abs, shardings = plan_state(config, mcfg, model, mesh, rules)
    state = {
        "params": params,
        "opt_state": opt_abs,
        "step": jax.ShapeDtypeStruct((), jnp.int32),
    }
    state_abs = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), state, shardings
    )
    batch = abstract_batch(config, mesh_mod.batch_sharding(mesh, rules))
    step = make_train_step(loss_fn_for(config, apply), tx, grad_accum=config.train.grad_accum)
    jitted = jax.jit(step, out_shardings=(shardings, None), donate_argnums=(0,))
    if concrete:
        lowered = jitted.lower(state_abs, batch)
    else:
        platform = devices[0].platform
        lowered = jitted.trace(state_abs, batch).lower(lowering_platforms=(platform,))

    tokens = config.data.batch_size * config.data.seq_len
    report: dict[str, Any] = {
        "model": config.model.get("preset"),
        "num_params": model_mod.param_count(params),
        "mesh": " x ".join(f"{a}={s}" for a, s in mesh_sizes.items()),
        "devices": n,
        "batch": f"{config.data.batch_size} x {config.data.seq_len}",
        "dtype": mcfg.dtype,
        "model_flops_per_step": model_mod.flops_per_token(mcfg, config.data.seq_len) * tokens,
        "state_bytes_per_device": _bytes_per_device(state_abs),
        "compiled": concrete,
    }
    if concrete:
        compiled = lowered.compile()
        report.update(_memory(compiled))
        cost = _cost(compiled)
        if (seconds := _cost(compiled, "optimal_seconds")) is not None and seconds > 0:
            report["cost_model_seconds_loops_once"] = seconds
    else:
        cost = _cost(lowered)
        report["note"] = (
            f"lowered only: {n} devices requested, {n_visible} visible; memory is the sharded "
            "state alone (params + optimiser state), activations not included"
        )
    report["model_flops_per_step_per_device"] = report["model_flops_per_step"] / n
    if cost is not None:
        # XLA's cost analysis counts a while-loop body once (scan over layers, accumulation),
        # so it is a lower bound; the model count above is the one MFU uses.
        key = "xla_flops_per_device_loops_once" if concrete else "xla_flops_global_loops_once"
        report[key] = cost
    report["seconds"] = time.perf_counter() - t0
    return report


def _bytes_per_device(tree: Any) -> int:
    total = 0
    for x in jax.tree.leaves(tree):
        shard = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shard) * np.dtype(x.dtype).itemsize
    return int(total)


def _memory(compiled: Any) -> dict[str, int]:
    try:
        m = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        return {}
    if m is None:
        return {}
    out = {
        "argument_bytes_per_device": int(m.argument_size_in_bytes),
        "output_bytes_per_device": int(m.output_size_in_bytes),
        "temp_bytes_per_device": int(m.temp_size_in_bytes),
        "alias_bytes_per_device": int(m.alias_size_in_bytes),
    }
    out["peak_bytes_per_device"] = (
        out["argument_bytes_per_device"]
        + out["output_bytes_per_device"]
        + out["temp_bytes_per_device"]
        - out["alias_bytes_per_device"]
    )
    return out


def _cost(stage: Any, key: str = "flops") -> float | None:
    try:
        cost = stage.cost_analysis()
    except Exception:
        return None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    if not cost or key not in cost:
        return None
    return float(cost[key])


def format_report(report: dict[str, Any]) -> str:
    lines = ["dry run (nothing allocated):"]
    for key, value in report.items():
        if key.endswith("bytes_per_device") or key.endswith("_bytes"):
            value = f"{value / 2**30:,.2f} GiB"
        elif "flops" in key:
            value = si(value, "FLOP")
        elif key == "num_params":
            value = si(value)
        elif isinstance(value, float):
            value = f"{value:.1f}"
        lines.append(f"  {key:32s} {value}")
    return "\n".join(lines)
