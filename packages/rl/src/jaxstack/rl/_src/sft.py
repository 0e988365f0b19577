"""Supervised fine-tuning on chat or prompt-completion JSONL: loss on the assistant's tokens.

records (checked, file:line errors) -> ChatTemplate.encode (assistant-only loss_mask)
  -> datalib lm_batches (packing, shuffling, exact JSON iterator state)
  -> the trainer's train step over the trainable params (all, or LoRA adapters)
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax

from jaxstack.rl._src.config import RLConfig
from jaxstack.rl._src.encode import trim_padding
from jaxstack.rl._src.errors import ConfigError
from jaxstack.rl._src.policy import build_policy
from jaxstack.rl._src.records import read_sft_records
from jaxstack.rl._src.run import (
    Evaluate,
    Run,
    RunResult,
    StopFn,
    initial_state,
    optimizer,
    prepare_host,
)


def require_data(config: RLConfig) -> str:
    if config.base.data.path is None:
        raise ConfigError(
            f"{config.algorithm} needs data.path: a JSONL file of records "
            "(see docs/rl.md for the formats)"
        )
    return config.base.data.path


def sft(
    config: RLConfig,
    *,
    evaluate: Evaluate | None = None,
    stop: StopFn | None = None,
    max_new_tokens: int = 32,
) -> RunResult:
    """Fine-tunes on `data.path`; returns the run's result (the model is in run_dir/model).

    Args:
      evaluate: called as `evaluate(step, generate)` every `eval.every` steps and after the
        last, with a greedy `generate(prompts) -> completions` (at most `max_new_tokens`) of
        the current params on the serving engine; the metrics it returns are logged.
      stop: `stop(step, metrics) -> bool` after each step; true saves the step and ends the
        run there (e.g. once an evaluation reaches a target accuracy).
    """
    from jaxstack import datalib, trainer

    records = read_sft_records(require_data(config))
    allocator = prepare_host(config)
    policy = build_policy(config)
    encoder = policy.encoder()
    documents = [encoder.sft_document(r, config.sft.train_on) for r in records]
    data = config.base.data
    batches = datalib.lm_batches(
        datalib.InMemorySource(documents),
        policy.tokenizer,
        seq_len=data.seq_len,
        batch_size=data.batch_size,
        seed=data.seed,
        packing=data.packing,
    )
    tx = optimizer(config, policy.params)
    loss_fn = trainer.loss_fn_for(config, policy.apply)  # with train.z_loss_weight, moe_*
    train_step = jax.jit(
        trainer.make_train_step(loss_fn, tx, grad_accum=config.base.train.grad_accum),
        donate_argnums=0,
    )
    run = Run(config, allocator)
    try:
        start, state, data_state = run.restore(initial_state(policy.params, tx))
        if data_state is not None:
            batches.set_state(data_state)

        sampler = None

        def step_fn(state: dict[str, Any], step: int):
            nonlocal sampler
            batch = trim_padding(next(batches))
            state, metrics = train_step(state, batch)
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            metrics["tokens"] = batch["tokens"].size
            if evaluate is not None and run.evaluation_due(step + 1):
                sampler = sampler or evaluation_sampler(config, policy)
                generate = sampler.greedy_fn(state["params"], encoder, max_new_tokens)
                metrics.update(evaluate(step + 1, generate))
            return state, metrics

        result = run.loop(state, step_fn, start=start, data_state=batches.get_state, stop=stop)
        export_model(policy, result.state["params"], run)
        run.finish(result)
        return result
    finally:
        run.close()


def evaluation_sampler(config: RLConfig, policy: Any) -> Any:
    """The serving engine on the rollout role's devices, for rows of at most data.seq_len."""
    from jaxstack.rl._src.placement import place_role
    from jaxstack.rl._src.rollout import EngineSampler

    return EngineSampler(
        policy,
        place_role(config, "rollout"),
        max_model_len=min(policy.model.config.max_seq_len, config.base.data.seq_len),
        max_num_seqs=256,
        seed=config.base.train.seed,
    )


def export_model(policy: Any, params: Any, run: Run) -> None:
    """The trained model as a complete HF folder `run_dir/model` (adapters merged; config.json
    with the special-token ids, generation_config.json, tokenizer files, chat template): the
    `init.hf` of a following stage, or what transformers, vLLM and `LLM(run_dir/model)` load.
    A LoRA run also writes its adapters in PEFT's layout to `run_dir/adapter`. Over a quantised
    (QLoRA) base only the adapters are written: `run_dir/adapter` and
    `run_dir/adapters.safetensors` (`nnlib.load_lora` onto the same base)."""
    from flax import nnx

    from jaxstack import nnlib
    from jaxstack.rl._src.hf_folder import write_adapter_folder

    model = nnx.clone(policy.model)
    nnx.update(model, params)
    assets = policy.assets
    if policy.lora:
        init_hf = run.config.init.hf
        base = str(pathlib.Path(init_hf).resolve()) if init_hf else None
        try:
            path = write_adapter_folder(
                model, run.dir / "adapter", base_model=base, files=assets.files
            )
            run.log.info(f"PEFT adapter: {path}")
        except ConfigError as e:
            run.log.info(f"no PEFT adapter written: {e}")
    if policy.quantized:
        nnlib.save_lora(model, run.dir / "adapters.safetensors")
        run.log.info(f"adapters: {run.dir / 'adapters.safetensors'}")
        return
    path = nnlib.save_hf_checkpoint(
        model,
        run.dir / "model",
        special_token_ids=assets.special_token_ids(),
        generation_config=assets.generation_config,
        files=assets.files,
    )
    run.log.info(f"model: {path}")
