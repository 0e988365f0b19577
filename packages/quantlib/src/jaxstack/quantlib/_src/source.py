"""Loading the float model of a `jaxstack-train` run directory or a ckptlib checkpoint.

quantlib sits below the trainer and never imports it: a run is read through what it wrote, the
ckptlib checkpoint whose metadata holds the run config (`model` section: an nnlib preset plus
overrides; `data` section: tokenizer and sequence length), as `jaxstack-train` documents it.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import jax
from flax import nnx

from jaxstack import ckptlib, datalib, nnlib
from jaxstack.quantlib._src.errors import SourceError


@dataclasses.dataclass
class Source:
    """A loaded float model and what is needed to feed it."""

    model: nnlib.Transformer
    model_config: nnlib.ModelConfig
    tokenizer: Any
    tokenizer_spec: str
    seq_len: int
    data: dict[str, Any]  # the run's data section (path, validation_path, ...)
    step: int
    path: str


def checkpoint_dir(path: str | pathlib.Path) -> pathlib.Path:
    """`RUN/checkpoints` for a run directory, else `path` itself if it holds checkpoints."""
    p = pathlib.Path(path)
    for candidate in (p / "checkpoints", p):
        if candidate.is_dir() and ckptlib.list_checkpoints(candidate):
            return candidate
    raise SourceError(
        f"{path}: not a jaxstack-train run directory (with checkpoints/) nor a ckptlib "
        "checkpoint directory; pass the run directory the trainer printed"
    )


def build_tokenizer(spec: str) -> Any:
    if spec == "byte":
        return datalib.ByteTokenizer()
    if not pathlib.Path(spec).is_file():
        raise SourceError(f"tokenizer {spec!r}: no such file; use 'byte' or a BPE tokenizer JSON")
    return datalib.BPETokenizer.from_file(spec)


def model_config(run_config: dict[str, Any], tokenizer_vocab: int) -> nnlib.ModelConfig:
    """The nnlib config the trainer built: preset, then the section's fields, then the vocab."""
    fields = dict(run_config.get("model") or {})
    data = run_config.get("data") or {}
    base = nnlib.get_preset(fields.pop("preset", "tiny"))
    if data.get("vocab_from_tokenizer", True) and "vocab_size" not in fields:
        fields["vocab_size"] = tokenizer_vocab
    seq_len = int(data.get("seq_len", base.max_seq_len))
    if fields.get("max_seq_len", base.max_seq_len) < seq_len:
        fields["max_seq_len"] = seq_len
    return base.replace(**fields)


def load_run(path: str | pathlib.Path, step: int | None = None) -> Source:
    """The float nnlib model of a run directory / checkpoint (newest good step by default)."""
    directory = checkpoint_dir(path)
    try:
        with ckptlib.CheckpointManager(directory, read_only=True, create=False) as manager:
            restored = manager.restore(step, subtree="params")
    except ckptlib.Error as e:
        raise SourceError(f"{path}: {e}") from e
    run_config = (restored.metadata or {}).get("config")
    if not isinstance(run_config, dict) or "model" not in run_config:
        raise SourceError(
            f"{path}: checkpoint step {restored.step} has no run config in its metadata, so it "
            "is not a model checkpoint written by jaxstack-train"
        )
    data = dict(run_config.get("data") or {})
    tokenizer_spec = str(data.get("tokenizer", "byte"))
    tokenizer = build_tokenizer(tokenizer_spec)
    try:
        mcfg = model_config(run_config, tokenizer.vocab_size)
    except (nnlib.Error, TypeError, ValueError) as e:
        raise SourceError(
            f"{path}: the run's model section does not build an nnlib model: {e}"
        ) from e
    model = nnx.eval_shape(lambda: nnlib.Transformer(mcfg, rngs=nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param)
    try:
        nnx.replace_by_pure_dict(state, _variable_values(restored.state))
    except (KeyError, ValueError, TypeError) as e:
        raise SourceError(
            f"{path}: the checkpoint's params do not fit the run's model config ({e})"
        ) from e
    nnx.update(model, state)
    return Source(
        model=model,
        model_config=mcfg,
        tokenizer=tokenizer,
        tokenizer_spec=tokenizer_spec,
        seq_len=int(data.get("seq_len", mcfg.max_seq_len)),
        data=data,
        step=int(restored.step),
        path=str(path),
    )


def _variable_values(tree: Any) -> Any:
    """The saved nnx.State as a pure dict: each Variable's `{"value": array}` becomes the array."""
    if isinstance(tree, dict):
        if set(tree) == {"value"} and not isinstance(tree["value"], dict):
            return jax.numpy.asarray(tree["value"])
        return {k: _variable_values(v) for k, v in tree.items()}
    return tree
