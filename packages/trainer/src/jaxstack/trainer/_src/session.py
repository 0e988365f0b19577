"""Everything a run needs before its first step, built in the order errors should surface.

Cheap checks first (data path, tokenizer, model config, mesh and batch divisibility), then the
model, optimiser and shardings, then the state (restored from the run directory's latest good
checkpoint, or initialised directly into its shardings), then the data iterators. Damaged
checkpoints are never silent: each one skipped, and a restart from scratch because of them, is
logged as a warning line naming the step and the problem.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.metadata
import math
import pathlib
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxstack.trainer._src import data as data_mod
from jaxstack.trainer._src import extras, matmul_backend, quant
from jaxstack.trainer._src import mesh as mesh_mod
from jaxstack.trainer._src import model as model_mod
from jaxstack.trainer._src.config import Config
from jaxstack.trainer._src.errors import ConfigError, MeshError, ResumeError
from jaxstack.trainer._src.step import make_eval_step, make_loss_fn, make_train_step
from jaxstack.xprof_lite import host_cpu

PACKAGES = ("jaxstack-trainer", "jaxstack-nnlib", "jaxstack-optlib", "jaxstack-datalib")


def default_run_dir() -> pathlib.Path:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return pathlib.Path.cwd() / "runs" / stamp


def plan_state(config: Config, mcfg: Any, model: Any, mesh: Any, rules: Any) -> tuple:
    """(apply, params, tx, abstract opt_state, state shardings) for a concrete or abstract model.

    Shared by a real run and a dry run, so both shard parameters and optimiser state alike.
    """
    from jaxstack import optlib

    apply, params = model_mod.functional(model)
    specs = model_mod.param_specs(mcfg, params, rules)
    p_shard = mesh_mod.param_shardings(params, specs, mesh)
    tx = optlib.build_optimizer(config.optimizer, params)
    opt_abs = jax.eval_shape(tx.init, params)
    o_shard = mesh_mod.state_shardings(opt_abs, params, p_shard, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    shardings = {"params": p_shard, "opt_state": o_shard, "step": replicated}
    return apply, params, tx, opt_abs, shardings


def loss_fn_for(config: Config, apply: Any) -> Any:
    """The training loss of `apply` with the config's z-loss and MoE auxiliary-loss weights
    (`train.z_loss_weight`, `train.moe_*_weight`)."""
    t = config.train
    return make_loss_fn(
        apply,
        z_loss_weight=t.z_loss_weight,
        aux_weights={
            "moe_load_balance_loss": t.moe_load_balance_weight,
            "moe_router_z_loss": t.moe_router_z_weight,
        },
    )


def abstract_batch(config: Config, sharding: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes, dtypes and sharding of one global batch, for ahead-of-time compiles."""
    shape = (config.data.batch_size, config.data.seq_len)
    dtypes = {k: jnp.int32 for k in data_mod.BATCH_KEYS} | {"loss_mask": jnp.float32}
    return {
        k: jax.ShapeDtypeStruct(shape, dtypes[k], sharding=sharding) for k in data_mod.BATCH_KEYS
    }


def put_global(tree: Any, shardings: Any) -> Any:
    """Host arrays (the same on every process) -> global arrays in `shardings`."""

    def put(x: Any, sharding: NamedSharding) -> jax.Array:
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(put, tree, shardings)


def abstract_like(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), tree, shardings
    )


@dataclasses.dataclass
class Session:
    config: Config
    run_dir: pathlib.Path
    is_chief: bool
    mesh: jax.sharding.Mesh
    mesh_sizes: dict[str, int]
    model_config: Any
    model: Any
    apply: Any
    tx: Any
    tokenizer: Any
    state: dict[str, Any]
    state_shardings: dict[str, Any]
    batch_sharding: NamedSharding
    start_step: int
    restored: bool
    manager: Any
    train_iterators: list[Any]
    data_states: list[dict[str, Any]]
    local_shards: list[int]
    num_shards: int
    peak_source: str
    peak_units: int  # devices (accelerators) or processes (CPU) the peak is multiplied by
    total_peak_flops: float
    flops_per_token: float
    num_params: int
    notes: list[str] = dataclasses.field(default_factory=list)  # warnings for the run log
    restored_matmul_backend: str | None = None  # what the restored checkpoint's run used here
    matmul_backend: str | None = None  # settled by `compile`, or by the loop's trial
    matmul_note: str = ""

    def describe(self) -> list[str]:
        c = self.model_config
        return [
            f"run directory: {self.run_dir}",
            f"model: {self.config.model.get('preset')} d_model={c.d_model} layers={c.num_layers} "
            f"heads={c.num_heads} vocab={c.vocab_size} params={self.num_params / 1e6:.2f}M "
            f"dtype={c.dtype}",
            f"mesh: {' x '.join(f'{a}={n}' for a, n in self.mesh_sizes.items())} over "
            f"{jax.device_count()} {jax.devices()[0].platform} device(s), "
            f"{jax.process_count()} process(es); batch {self.config.data.batch_size} x "
            f"{self.config.data.seq_len} tokens, grad_accum {self.config.train.grad_accum}",
            f"MFU is measured against a device peak of "
            f"{self.total_peak_flops / self.peak_units / 1e9:,.0f} GFLOP/s "
            f"({c.dtype}; {self.peak_source})",
            *self.notes,
            (
                f"resumed from checkpoint step {self.start_step}"
                if self.restored
                else "starting from scratch"
            ),
        ]

    def speed(self, seconds: float, tokens: int) -> dict[str, float]:
        """Step time, tokens/s and MFU. MFU never exceeds 1: a step faster than the peak
        (a CPU peak measured on a busy machine) raises the peak to what the step achieved."""
        achieved = self.flops_per_token * tokens / seconds
        if achieved > self.total_peak_flops > 0:
            self.notes.append(
                f"a step reached {achieved / 1e9:,.0f} GFLOP/s, above the device peak of "
                f"{self.total_peak_flops / 1e9:,.0f}; MFU is now reported against that step "
                "(refresh the measured peak with `jaxstack-prof peak --refresh` on a quiet "
                "machine, or set log.peak_flops)"
            )
            self.total_peak_flops = achieved
        mfu = achieved / self.total_peak_flops if self.total_peak_flops > 0 else float("nan")
        return {"step_time_s": seconds, "tokens_per_sec": tokens / seconds, "mfu": mfu}

    def put_batch(self, host: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        return {
            k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in host.items()
        }

    def batch_abstract(self) -> dict[str, jax.ShapeDtypeStruct]:
        return abstract_batch(self.config, self.batch_sharding)

    def compile(self) -> tuple[dict[str, Any], Any]:
        """Ahead-of-time compiled train steps by matmul backend (state donated), and eval step.

        One train step when the backend is settled: fixed by `train.matmul_backend`, recorded by
        the checkpoint an `auto` run resumes on this CPU, or `auto` where no trial applies. Else
        the candidates the loop's trial times. `matmul_backend` is the settled one (None until
        the trial decides), `matmul_note` says how it was settled.
        """
        loss_fn = self.loss_fn()
        step = make_train_step(loss_fn, self.tx, grad_accum=self.config.train.grad_accum)
        jitted = jax.jit(
            step,
            in_shardings=(self.state_shardings, self.batch_sharding),
            out_shardings=(self.state_shardings, None),
            donate_argnums=(0,) if self.config.train.donate else (),
        )
        state_abs = abstract_like(self.state, self.state_shardings)
        train_steps = self._compile_train_steps(jitted.lower(state_abs, self.batch_abstract()))
        eval_jit = jax.jit(
            make_eval_step(loss_fn),
            in_shardings=(self.state_shardings["params"], self.batch_sharding),
        )
        eval_step = eval_jit.lower(state_abs["params"], self.batch_abstract()).compile()
        return train_steps, eval_step

    def _compile_train_steps(self, lowered: Any) -> dict[str, Any]:
        setting = self.config.train.matmul_backend
        dtype = self.model_config.dtype
        if setting != "auto":
            self.matmul_backend, self.matmul_note = setting, "train.matmul_backend"
            if setting == "onednn" and matmul_backend.slow_on_onednn(dtype, host_cpu()):
                warning = matmul_backend.SLOW_BF16.format(dtype=dtype)
                self.matmul_note += f"; WARNING: {warning}; matmul_backend=default avoids it"
            return {setting: matmul_backend.compile_step(lowered, setting)}
        if self.restored_matmul_backend:
            with contextlib.suppress(ConfigError):  # else this jaxlib cannot: choose afresh
                step = matmul_backend.compile_step(lowered, self.restored_matmul_backend)
                self.matmul_backend = self.restored_matmul_backend
                self.matmul_note = "as the checkpoint's run chose on this CPU"
                return {self.matmul_backend: step}
        default = lowered.compile()
        why = matmul_backend.why_not_trial(
            self.config,
            jax.devices()[0].platform,
            jax.process_count(),
            self.start_step,
            dtype,
            host_cpu(),
        )
        steps = {"default": default} if why else matmul_backend.candidates(lowered, default)
        if len(steps) == 1:
            self.matmul_backend = "default"
            self.matmul_note = f"no trial: {why or 'XLA sends no matmul to oneDNN here'}"
        return steps

    def loss_fn(self) -> Any:
        return loss_fn_for(self.config, self.apply)

    def evaluate(self, eval_step: Any, params: Any) -> dict[str, float]:
        """Token-weighted loss and perplexity over the first `eval.batches` validation batches."""
        iterators = data_mod.shard_iterators(
            self.config.data,
            self.tokenizer,
            split="validation",
            shards=self.local_shards,
            num_shards=self.num_shards,
            shuffle=False,
            num_epochs=1,
        )
        loss_sum, tokens = 0.0, 0.0
        for host in data_mod.iterate_eval(iterators, self.config.eval.batches):
            out = jax.device_get(eval_step(params, self.put_batch(host)))
            loss_sum += float(out["loss_sum"])
            tokens += float(out["num_tokens"])
        loss = loss_sum / tokens if tokens else float("nan")
        return {
            "eval_loss": loss,
            "eval_perplexity": math.exp(min(loss, 80.0)) if tokens else float("nan"),
            "eval_tokens": tokens,
        }

    def save(
        self,
        step: int,
        state: dict[str, Any],
        data_states: list[dict[str, Any]],
        metrics: dict[str, float],
    ) -> None:
        metadata = {"config": self.config.to_dict(), "versions": _versions()}
        if self.matmul_backend:
            metadata["matmul_backend"] = matmul_backend.record(self.matmul_backend)
        self.manager.save(
            step,
            state,
            data_state={"shards": data_states, "num_shards": self.num_shards},
            metadata=metadata,
            metrics={k: v for k, v in metrics.items() if isinstance(v, float) and math.isfinite(v)},
        )

    def sample(self, params: Any) -> str | None:
        """A short continuation of `log.sample_prompt` with the trained parameters."""
        n = self.config.log.sample_tokens
        if n <= 0 or not all(x.is_fully_addressable for x in jax.tree.leaves(params)):
            return None
        from flax import nnx

        from jaxstack import nnlib

        nnx.update(self.model, jax.device_get(params))
        prompt = self.tokenizer.encode(self.config.log.sample_prompt)
        if not prompt:
            prompt = [self.tokenizer.bos_id or 0]
        n = min(n, self.model_config.max_seq_len - len(prompt))
        temperature = self.config.log.sample_temperature
        tokens = nnlib.generate(
            self.model,
            jnp.asarray([prompt], jnp.int32),
            n,
            temperature=temperature,
            top_k=40 if temperature > 0 else None,
            rng=jax.random.key(self.config.train.seed),
        )
        return self.tokenizer.decode([int(t) for t in np.asarray(tokens)[0]])

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()


def enable_compile_cache(directory: str | None) -> None:
    """Turns on JAX's persistent compilation cache in `directory` (`train.compile_cache`; None:
    off): a restarted run loads its compiled steps instead of compiling them again."""
    if directory is None:
        return
    path = pathlib.Path(directory).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def build_session(config: Config) -> Session:
    """The run's mesh, model, optimiser, state, data and checkpoints, or a clear error first."""
    process_count = jax.process_count()
    run_dir = _run_dir(config, process_count)
    data_mod.check_data_path(config.data)
    extras.check(config)
    quant.rules(config)  # a missing extra or bad rules fail before anything is built
    enable_compile_cache(config.train.compile_cache)
    tokenizer = data_mod.build_tokenizer(config.data)
    mcfg = model_mod.model_config(config, tokenizer.vocab_size)
    layout = _Layout.plan(config, process_count)

    model = model_mod.build_model(
        mcfg, config.train.seed, extras.attention_function(config.train.attention)
    )
    model = quant.apply(config, model)
    apply, params, tx, opt_abs, shardings = plan_state(
        config, mcfg, model, layout.mesh, layout.rules
    )
    iterators = data_mod.shard_iterators(
        config.data,
        tokenizer,
        split="train",
        shards=layout.local_shards,
        num_shards=layout.num_shards,
    )
    notes: list[str] = []
    with _checkpoint_warnings(notes):
        manager = _checkpoint_manager(config, run_dir)
        restored = _restore(config, manager, params, opt_abs, shardings)
    if restored is None and notes:
        notes.append("WARNING: starting from scratch because no checkpoint could be restored")
    if restored is not None:
        state, start_step = restored.state, int(restored.step)
        if restored.data_state:
            data_mod.restore_iterator_states(iterators, restored.data_state["shards"])
    else:
        state, start_step = _initial_state(tx, params, shardings), 0

    is_chief = jax.process_index() == 0
    if is_chief:
        run_dir.mkdir(parents=True, exist_ok=True)
        config.save(run_dir / "config.yaml")
    peak_flops, peak_source = _device_peak(config, mcfg.dtype)
    # CPU "devices" of one process share the same cores, so the measured peak is per process.
    units = process_count if jax.devices()[0].platform == "cpu" else jax.device_count()
    return Session(
        config=config,
        run_dir=run_dir,
        is_chief=is_chief,
        mesh=layout.mesh,
        mesh_sizes=layout.sizes,
        model_config=mcfg,
        model=model,
        apply=apply,
        tx=tx,
        tokenizer=tokenizer,
        state=state,
        state_shardings=shardings,
        batch_sharding=mesh_mod.batch_sharding(layout.mesh, layout.rules),
        start_step=start_step,
        restored=restored is not None,
        manager=manager,
        train_iterators=iterators,
        data_states=data_mod.iterator_states(iterators),
        local_shards=layout.local_shards,
        num_shards=layout.num_shards,
        peak_source=peak_source,
        peak_units=units,
        total_peak_flops=peak_flops * units,
        flops_per_token=model_mod.flops_per_token(mcfg, config.data.seq_len),
        num_params=model_mod.param_count(params),
        notes=notes,
        restored_matmul_backend=matmul_backend.recorded(restored and restored.metadata),
    )


def _run_dir(config: Config, process_count: int) -> pathlib.Path:
    if process_count > 1 and config.log.run_dir is None:
        raise ConfigError(
            "a multi-process run needs the same log.run_dir on every process; set log.run_dir"
        )
    return pathlib.Path(config.log.run_dir) if config.log.run_dir else default_run_dir()


@dataclasses.dataclass(frozen=True)
class _Layout:
    """The mesh, its logical-axis rules, and which data shards this process reads."""

    sizes: dict[str, int]
    mesh: jax.sharding.Mesh
    rules: dict[str, Any]
    num_shards: int
    local_shards: list[int]

    @classmethod
    def plan(cls, config: Config, process_count: int) -> _Layout:
        sizes = mesh_mod.resolve_axes(config.mesh, jax.device_count())
        mesh_mod.check_batch(config, sizes, process_count)
        num_shards = config.data.num_shards or process_count
        if num_shards % process_count or config.data.batch_size % num_shards:
            raise MeshError(
                f"data.num_shards={num_shards} must be a multiple of the {process_count} "
                f"processes and divide data.batch_size={config.data.batch_size}"
            )
        per_process = num_shards // process_count
        first = jax.process_index() * per_process
        return cls(
            sizes=sizes,
            mesh=mesh_mod.build_mesh(config.mesh),
            rules=mesh_mod.logical_rules(config.mesh),
            num_shards=num_shards,
            local_shards=list(range(first, first + per_process)),
        )


def _checkpoint_manager(config: Config, run_dir: pathlib.Path) -> Any:
    if not config.checkpoint.enabled:
        return None
    from jaxstack import ckptlib

    return ckptlib.CheckpointManager(
        run_dir / "checkpoints",
        max_to_keep=config.checkpoint.max_to_keep,
        async_save=config.checkpoint.async_save,
    )


@contextlib.contextmanager
def _checkpoint_warnings(notes: list[str]) -> Any:
    """ckptlib's warnings (damaged steps moved aside, restore falling back past them) become
    WARNING lines of the run log, where they are seen, instead of Python warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        if w.category.__module__.startswith("jaxstack.ckptlib"):
            notes.append(f"WARNING: {w.message}")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _restore(
    config: Config, manager: Any, params: Any, opt_abs: Any, shardings: dict[str, Any]
) -> Any:
    """The newest good checkpoint restored into the run's shardings, or None to start afresh.

    ckptlib skips damaged checkpoints (moving them aside for inspection) and warns about each.
    """
    if manager is None or not config.checkpoint.resume:
        return None
    from jaxstack import ckptlib

    target = {
        "params": abstract_like(params, shardings["params"]),
        "opt_state": abstract_like(opt_abs, shardings["opt_state"]),
        "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=shardings["step"]),
    }
    directory = manager.directory
    if manager.latest_step() is None:
        return None
    try:
        restored = manager.restore(target=target)
    except ckptlib.CheckpointNotFoundError as e:
        message = f"no checkpoint in {directory} could be restored: {e}"
        warnings.warn(message, ckptlib.CheckpointFallbackWarning, stacklevel=1)
        return None
    if restored is not None and int(restored.step) > config.train.steps:
        raise ResumeError(
            f"the run in {directory} is already at step {int(restored.step)}, past "
            f"train.steps={config.train.steps}; raise train.steps to continue it, or use a new "
            "log.run_dir (or checkpoint.resume=false) to start another run"
        )
    return restored


def _initial_state(tx: Any, params: Any, shardings: dict[str, Any]) -> dict[str, Any]:
    """Fresh parameters and optimiser state, created directly in their shardings."""
    params_dev = put_global(params, shardings["params"])
    return {
        "params": params_dev,
        "opt_state": jax.jit(tx.init, out_shardings=shardings["opt_state"])(params_dev),
        "step": jax.device_put(jnp.zeros((), jnp.int32), shardings["step"]),
    }


def _device_peak(config: Config, dtype: str) -> tuple[float, str]:
    """Per-device peak FLOP/s for `dtype` and where it came from (xprof-lite's one table)."""
    if config.log.peak_flops:
        return float(config.log.peak_flops), "set in config (log.peak_flops)"
    from jaxstack import xprof_lite

    peak = xprof_lite.device_peak()
    value = peak.flops_for(dtype)
    if not value or not math.isfinite(value):
        return float("nan"), f"no peak known for {peak.name!r}; set log.peak_flops"
    return value, f"{peak.name}: {peak.source}"


def _versions() -> dict[str, str]:
    out = {"jax": jax.__version__}
    for name in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out
