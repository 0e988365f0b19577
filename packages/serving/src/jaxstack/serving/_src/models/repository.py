"""The model repository: `<root>/<model>/<version>/` artifacts and how each model is served.

A version is an integer-named directory holding a `manifest.json`; hidden directories (an
export in progress) and directories without a manifest (a copy in progress) are not versions
yet. A model's `ModelConfig` says which versions to serve (its `VersionPolicy`) and how to batch.
Configuration comes from one JSON (or YAML, with PyYAML installed) file:

    {"defaults": {"max_batch_size": 32, "max_queue_delay_ms": 2},
     "models": {"mnist": {"version_policy": {"latest": 2}},
                "ranker": {"version_policy": {"specific": [3, 5]}, "max_queue_size": 64}}}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxstack.serving._src.errors import ConfigError
from jaxstack.serving._src.models import artifact_format as fmt

CONFIG_FILES = ("serving.json", "serving.yaml", "serving.yml")


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions of a model to serve: the `latest` N, or exactly the `specific` ones."""

    latest: int | None = 1
    specific: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if (self.latest is None) == (self.specific is None):
            raise ConfigError("version_policy needs exactly one of 'latest' or 'specific'")
        if self.latest is not None and (isinstance(self.latest, bool) or self.latest < 1):
            raise ConfigError(f"version_policy.latest {self.latest!r} must be >= 1")

    def select(self, available: Sequence[int]) -> list[int]:
        if self.specific is not None:
            return sorted(set(available) & set(self.specific))
        return sorted(available)[-self.latest :]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VersionPolicy:
        if not isinstance(d, Mapping) or set(d) - {"latest", "specific", "all"} or len(d) != 1:
            raise ConfigError(
                f"version_policy {d!r} must be one of {{'latest': N}}, {{'specific': [v, ...]}}"
                ", {'all': true}"
            )
        if "all" in d:
            return cls(latest=1 << 30)
        if "latest" in d:
            if not isinstance(d["latest"], int):
                raise ConfigError(f"version_policy.latest {d['latest']!r} must be an integer")
            return cls(latest=d["latest"])
        versions = d["specific"]
        if not isinstance(versions, list) or not all(isinstance(v, int) for v in versions):
            raise ConfigError(f"version_policy.specific {versions!r} must be a list of integers")
        return cls(latest=None, specific=tuple(versions))


@dataclass(frozen=True)
class ModelConfig:
    """How one model is served (dynamic batching and version policy)."""

    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    max_batch_size: int = 32
    batch_sizes: tuple[int, ...] | None = None
    max_queue_delay_ms: float = 2.0
    max_queue_size: int = 256
    trim_padding: bool = True
    warm_up: bool = True

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size {self.max_batch_size} must be >= 1")
        if self.max_queue_size < 1:
            raise ConfigError(f"max_queue_size {self.max_queue_size} must be >= 1")
        if self.max_queue_delay_ms < 0:
            raise ConfigError(f"max_queue_delay_ms {self.max_queue_delay_ms} must be >= 0")
        if self.batch_sizes is not None and (
            min(self.batch_sizes) < 1 or max(self.batch_sizes) < self.max_batch_size
        ):
            raise ConfigError(
                f"batch_sizes {list(self.batch_sizes)} must be >= 1 and include a size >= "
                f"max_batch_size {self.max_batch_size}"
            )

    def updated(self, d: Mapping[str, Any], where: str) -> ModelConfig:
        """This config with the keys of `d` replaced; `where` names `d` in error messages."""
        known = {f.name for f in dataclasses.fields(self)}
        if not isinstance(d, Mapping) or set(d) - known:
            unknown = sorted(set(d) - known) if isinstance(d, Mapping) else d
            raise ConfigError(f"{where}: unknown keys {unknown}; known keys {sorted(known)}")
        changes = dict(d)
        if "version_policy" in changes:
            changes["version_policy"] = VersionPolicy.from_dict(changes["version_policy"])
        if changes.get("batch_sizes") is not None:
            changes["batch_sizes"] = tuple(int(s) for s in changes["batch_sizes"])
        try:
            return dataclasses.replace(self, **changes)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from e


@dataclass(frozen=True)
class RepositoryConfig:
    """Per-model configs over shared defaults."""

    defaults: ModelConfig = field(default_factory=ModelConfig)
    models: Mapping[str, ModelConfig] = field(default_factory=dict)

    def for_model(self, name: str) -> ModelConfig:
        return self.models.get(name, self.defaults)

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], *, base: ModelConfig | None = None
    ) -> RepositoryConfig:
        if not isinstance(d, Mapping) or set(d) - {"defaults", "models"}:
            raise ConfigError(f"serving config must have only 'defaults' and 'models', got {d!r}")
        defaults = (base or ModelConfig()).updated(d.get("defaults", {}), "defaults")
        models = {
            name: defaults.updated(m, f"models.{name}") for name, m in d.get("models", {}).items()
        }
        return cls(defaults, models)

    @classmethod
    def from_file(cls, path: str | Path, *, base: ModelConfig | None = None) -> RepositoryConfig:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read serving config {str(path)!r}: {e}") from e
        if path.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as e:
                raise ConfigError(
                    f"{str(path)!r} is YAML but PyYAML is not installed; pip install pyyaml or "
                    "write the config as JSON"
                ) from e
            try:
                doc = yaml.safe_load(text) or {}
            except yaml.YAMLError as e:
                raise ConfigError(f"{str(path)!r} is not valid YAML: {e}") from e
        else:
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{str(path)!r} is not valid JSON: {e}") from e
        return cls.from_dict(doc, base=base)


def find_config(root: Path) -> Path | None:
    return next((root / n for n in CONFIG_FILES if (root / n).is_file()), None)


def scan(root: Path) -> dict[str, list[int]]:
    """Complete versions of every model under `root`: `{model: [versions ascending]}`."""
    models: dict[str, list[int]] = {}
    if not root.is_dir():
        return models
    for model_dir in sorted(root.iterdir()):
        if not model_dir.is_dir() or not fmt.NAME_PATTERN.fullmatch(model_dir.name):
            continue
        versions = [
            version
            for v in model_dir.iterdir()
            if (version := fmt.parse_version(v.name)) is not None
            and (v / fmt.MANIFEST_FILE).is_file()
        ]
        if versions:
            models[model_dir.name] = sorted(versions)
    return models
