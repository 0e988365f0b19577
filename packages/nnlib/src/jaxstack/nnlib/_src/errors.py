"""The one exception family of jaxstack.nnlib, so callers can catch all of its errors at once."""

from __future__ import annotations


class Error(Exception):
    """Base class of every error raised by jaxstack.nnlib."""


class ConfigError(Error, ValueError):
    """A ModelConfig (or an HF config.json) has a bad or unsupported value."""


class CheckpointMismatchError(Error):
    """A checkpoint does not fit the model: lists missing, unexpected and mis-shaped tensors."""

    def __init__(
        self,
        missing: list[str],
        unexpected: list[str],
        mis_shaped: list[tuple[str, tuple[int, ...], tuple[int, ...]]],
        *,
        source: str = "checkpoint",
    ):
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.mis_shaped = list(mis_shaped)
        lines = [f"{source} does not match the model config:"]
        if missing:
            lines.append(f"  missing ({len(missing)}): " + ", ".join(missing))
        if unexpected:
            lines.append(f"  unexpected ({len(unexpected)}): " + ", ".join(unexpected))
        if mis_shaped:
            lines.append(
                f"  mis-shaped ({len(mis_shaped)}): "
                + ", ".join(
                    f"{n} (checkpoint {got}, model expects {want})" for n, got, want in mis_shaped
                )
            )
        lines.append("Fix: load with the config.json that belongs to this checkpoint.")
        super().__init__("\n".join(lines))


class CacheError(Error, ValueError):
    """A KV cache is too small or does not match the model."""


class SurgeryError(Error, ValueError):
    """A path regex for LoRA / freeze / replacement matched nothing, or matched the wrong thing."""
