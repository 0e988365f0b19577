"""Which kernels run the train step's matmuls on a CPU: XLA's default or oneDNN, by measurement.

jaxlib 0.12's XLA:CPU runs dots as YNNPACK fusions. With the compile options in `ONEDNN`, its
oneDNN rewriter takes the dots it supports and YNNPACK keeps the rest; in a Llama step oneDNN
gets the weight gradients (the token axis contracted) and attention's value products, the
products XLA otherwise leaves to its slower built-in kernels. On an Intel Xeon AVX-512 the
d512 train step ran 1.02x (four quiet rounds) and 1.12x (a noisier run) faster with them, but
0.90x in another run; the d256 one 1.03x (benchmarks/train).
Which is faster depends on the CPU and the shapes, so `train.matmul_backend=auto` compiles the
step both ways and a `SettingTrial` times real training steps under each (both compute the same
products, in a different order of float additions) and keeps the faster.

The options go to one executable (`Lowered.compile(compiler_options=...)`): XLA reads XLA_FLAGS
once per process, so only per-executable options let one process hold both. The choice is
recorded in each checkpoint, so a resumed run on the same CPU continues on the same kernels.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxstack.trainer._src.errors import ConfigError
from jaxstack.xprof_lite import HostCPU, SettingTrial, host_cpu

ONEDNN = {"xla_cpu_use_onednn": True, "xla_cpu_experimental_onednn_custom_call": True}
# CPU flags with which oneDNN runs bfloat16 matmuls natively.
BF16_FLAGS = {"avx512_bf16", "amx_bf16"}
SLOW_BF16 = (
    "oneDNN's {dtype} matmuls need AVX512-BF16 or AMX, which this CPU lacks (without them a "
    "bfloat16 train step ran 200x slower)"
)
# The trial's 12 steps run half under the slower backend (as the host-allocator trial's do).
TRIAL_MIN_STEPS = 40


def compile_step(lowered: Any, backend: str) -> Any:
    """The lowered step compiled for `backend` ("default" or "onednn").

    Raises ConfigError when this jaxlib or CPU cannot run the step's matmuls on oneDNN.
    """
    if backend == "default":
        return lowered.compile()
    fix = "use train.matmul_backend=default (or auto, which falls back to it)"
    # XLA cannot serialise oneDNN executables (JAX's persistent cache warns of a bad_alloc), so
    # this compile is kept out of the cache: JAX writes only compiles slower than this minimum.
    min_secs = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    try:
        compiled = lowered.compile(compiler_options=ONEDNN)
    except jax.errors.JaxRuntimeError as e:
        raise ConfigError(
            f"train.matmul_backend=onednn: this jaxlib refused it ({e}); {fix}"
        ) from e
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_secs)
    if "__onednn$" not in compiled.as_text():
        raise ConfigError(f"train.matmul_backend=onednn: XLA sent no matmul to oneDNN here; {fix}")
    return compiled


def why_not_trial(
    config: Any, platform: str, process_count: int, start_step: int, dtype: str, cpu: HostCPU
) -> str | None:
    """Why `auto` keeps the default without a trial in this run, or None when it runs one.

    `dtype` is the model's compute dtype, `cpu` the host's (xprof-lite's `host_cpu()`).
    """
    if platform != "cpu":
        return f"the oneDNN option is XLA:CPU's, and this run is on {platform}"
    if slow_on_onednn(dtype, cpu):
        return SLOW_BF16.format(dtype=dtype)
    if process_count > 1:
        # Every process must compile the same program; their timings could disagree.
        return f"{process_count} processes would each time their own"
    if config.train.steps - start_step < TRIAL_MIN_STEPS:
        return f"fewer than {TRIAL_MIN_STEPS} steps to run"
    return None


def slow_on_onednn(dtype: str, cpu: HostCPU) -> bool:
    """Whether oneDNN would run this compute dtype's matmuls without native instructions."""
    return dtype != "float32" and not BF16_FLAGS & set(cpu.flags)


def candidates(lowered: Any, default_step: Any) -> dict[str, Any]:
    """The executables `auto` times: the default, and oneDNN's where XLA sends it any matmul."""
    try:
        return {"default": default_step, "onednn": compile_step(lowered, "onednn")}
    except ConfigError:
        return {"default": default_step}


def trial(backends: dict[str, Any], apply: Any) -> SettingTrial:
    """The timed trial among `backends`; `apply(name)` switches the loop's step to `name`'s.

    A backend whose step takes 20x another's median is dropped after that one step.
    """
    return SettingTrial(tuple(backends), apply, name="matmul backend", give_up=20.0)


def recorded(metadata: Any) -> str | None:
    """The backend a checkpoint's run used, when it ran on this CPU model."""
    entry = (metadata or {}).get("matmul_backend") or {}
    return entry.get("backend") if entry.get("cpu") == host_cpu().model else None


def record(backend: str) -> dict[str, str]:
    """What a checkpoint keeps of the choice (see `recorded`)."""
    return {"backend": backend, "cpu": host_cpu().model}
