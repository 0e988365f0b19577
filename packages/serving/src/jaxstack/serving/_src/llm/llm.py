"""LLM: offline batch generation, `LLM(path).generate(prompts, SamplingParams(...))`.

The same engine the server runs, driven to completion in the caller's thread. RL rollouts
use it as it is, swapping in new policy weights with `update_weights` between rounds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from typing import Any

from flax import nnx

from jaxstack.serving._src.errors import InvalidInputError
from jaxstack.serving._src.llm.engine import EngineConfig, LLMEngine
from jaxstack.serving._src.llm.loading import load_model
from jaxstack.serving._src.llm.outputs import RequestOutput
from jaxstack.serving._src.llm.sampling_params import SamplingParams


class LLM:
    """An nnlib model behind the paged, continuously batched engine.

    Args:
      model: a path (a `jaxstack-train` run directory, a ckptlib checkpoint directory, or an
        HF folder with config.json + safetensors), or an in-memory nnlib Transformer.
      tokenizer: a datalib tokenizer; for paths it is found next to the weights (tokenizer.json,
        or the run's configured tokenizer). Without one, prompts must be token ids and
        outputs have no text.
      adapters: LoRA adapters served over the model, name -> PEFT folder; `generate(...,
        adapter=name)` runs prompts with one.
      **engine_options: fields of `EngineConfig` (max_num_seqs, max_num_batched_tokens,
        block_size, num_blocks, kv_cache_memory_bytes, max_model_len, enable_prefix_caching,
        max_logprobs, seed).

    Example:
      >>> llm = LLM("runs/my-run")
      >>> out = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=32))
      >>> out[0].outputs[0].text
    """

    def __init__(
        self,
        model: str | os.PathLike | nnx.Module,
        tokenizer: Any = None,
        *,
        adapters: Mapping[str, str | os.PathLike] | None = None,
        **engine_options,
    ):
        eos_token_ids = ()
        if isinstance(model, str | os.PathLike):
            loaded = load_model(model)
            model, tokenizer = loaded.model, tokenizer or loaded.tokenizer
            self.chat_template = loaded.chat_template
            eos_token_ids = loaded.eos_token_ids
        else:
            self.chat_template = None
        self.tokenizer = tokenizer
        config = EngineConfig(**engine_options)
        self.engine = LLMEngine(
            model, tokenizer, config, eos_token_ids=eos_token_ids, adapters=adapters
        )

    def generate(
        self,
        prompts: str | Seq[str] | Seq[Seq[int]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        adapter: str | None = None,
    ) -> list[RequestOutput]:
        """Complete every prompt (with the named LoRA adapter, or the base model); outputs
        come back in the order of `prompts`."""
        if isinstance(prompts, str):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(params) != len(prompts):
            raise InvalidInputError(
                f"got {len(params)} SamplingParams for {len(prompts)} prompts; pass one or one each"
            )
        requests = []
        for prompt, p in zip(prompts, params, strict=True):
            text, ids = self._token_ids(prompt)
            requests.append((text, ids, self.engine.add_request(ids, p, adapter=adapter)))
        while self.engine.has_unfinished():
            self.engine.step()
        failed = [q for *_, seqs in requests for q in seqs if q.error is not None]
        if failed:  # the engine failed that request alone, but the caller wants every output
            raise failed[0].error
        return [
            RequestOutput(
                request_id=seqs[0].request_id,
                prompt=text,
                prompt_token_ids=ids,
                outputs=[q.output for q in seqs],
                prompt_logprobs=seqs[0].prompt_logprobs,
                num_cached_tokens=seqs[0].num_cached_tokens,
            )
            for text, ids, seqs in requests
        ]

    def update_weights(self, params: Any) -> None:
        """Generate with new parameter values (`nnx.state(model, nnx.Param)` of the same
        model) from the next call on; no trip through disk, no recompilation."""
        self.engine.update_weights(params)

    def _token_ids(self, prompt: str | Seq[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidInputError("text prompts need a tokenizer; pass token ids or one")
            return prompt, list(self.tokenizer.encode(prompt))
        return None, [int(t) for t in prompt]
