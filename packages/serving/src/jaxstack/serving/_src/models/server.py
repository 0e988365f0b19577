"""`ModelServer`: every model version of a repository, loaded, batched, hot-reloaded.

The server keeps a snapshot `{model: {version: LoadedVersion}}` that is replaced, never
mutated, so a request resolves its version without a lock. Reconciling with the repository
(`poll`, run by a background thread every `poll_interval_s`) loads and warms up new versions
first and only then publishes the new snapshot; versions that left the policy or the disk are
unpublished and drained: their queued requests still finish, new ones go to the new snapshot.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jaxstack.serving._src.errors import (
    ArtifactError,
    ConfigError,
    ModelNotFoundError,
    ServerBusyError,
)
from jaxstack.serving._src.models import repository as repo
from jaxstack.serving._src.models.batcher import DynamicBatcher
from jaxstack.serving._src.models.load import Artifact, Signature, load_artifact
from jaxstack.serving._src.models.metrics import ServingMetrics
from jaxstack.serving._src.models.validate import validate_inputs

logger = logging.getLogger("jaxstack.serving.models")


@dataclass
class LoadedVersion:
    """One served model version: its artifact, its batcher and its config."""

    artifact: Artifact
    batcher: DynamicBatcher
    config: repo.ModelConfig
    loaded_at: float = field(default_factory=time.time)

    @property
    def name(self) -> str:
        return self.artifact.name

    @property
    def version(self) -> int:
        return self.artifact.version

    @property
    def signature(self) -> Signature:
        return self.artifact.signature


class ModelServer:
    """Serve every model of a `<model>/<version>/` repository with dynamic batching.

    Args:
      repository: the repository root.
      config: a `RepositoryConfig`, a path to a JSON/YAML config file, or None to read
        `serving.json`/`serving.yaml` in the repository root when present (re-read at each
        poll, so version policies can change without a restart).
      defaults: the `ModelConfig` that config files override.
      poll_interval_s: how often to look for new and removed versions; 0 disables hot reload
        (call `poll()` yourself).

    Example:
      >>> server = ModelServer("models").start()  # doctest: +SKIP
      >>> version, future = server.submit("mnist", {"x": images})  # doctest: +SKIP
      >>> future.result()["output_0"]  # doctest: +SKIP
    """

    def __init__(
        self,
        repository: str | os.PathLike[str],
        *,
        config: repo.RepositoryConfig | str | os.PathLike[str] | None = None,
        defaults: repo.ModelConfig | None = None,
        poll_interval_s: float = 2.0,
        metrics: ServingMetrics | None = None,
    ):
        self.root = Path(repository)
        if not self.root.is_dir():
            raise ConfigError(f"model repository {str(self.root)!r} is not a directory")
        self.defaults = defaults or repo.ModelConfig()
        self.poll_interval_s = poll_interval_s
        self.metrics = metrics or ServingMetrics()
        self._fixed_config = config if isinstance(config, repo.RepositoryConfig) else None
        self._config_path = None if config is None or self._fixed_config else Path(config)
        self._config = self._fixed_config or repo.RepositoryConfig(self.defaults)
        self._models: Mapping[str, Mapping[int, LoadedVersion]] = {}
        self._failed: dict[tuple[str, int], tuple[Any, str]] = {}
        self._reconcile_lock = threading.Lock()
        self._drainers: list[threading.Thread] = []
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._loader: threading.Thread | None = None
        self._config_error: str | None = None
        self.ready = False
        self._read_config(strict=True)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, *, wait: bool = True) -> ModelServer:
        """Load every selected version (warmed up), then start polling for changes.

        With `wait=False` the loading runs in a background thread and `start` returns at once,
        so a front end can listen (and answer liveness) while models load; `ready` turns True
        when they are loaded, and requests meanwhile get `ServerBusyError` (503).
        """
        if wait:
            self._load_then_poll()
        else:
            self._loader = threading.Thread(
                target=self._load_then_poll, name="repo-loader", daemon=True
            )
            self._loader.start()
        return self

    def _load_then_poll(self) -> None:
        self.poll()
        if self._stop.is_set():
            return
        self.ready = True
        logger.info("ready: %s", {m: self.versions(m) for m in self.model_names()})
        if self.poll_interval_s > 0:
            self._poller = threading.Thread(target=self._poll_loop, name="repo-poller", daemon=True)
            self._poller.start()

    def close(self) -> None:
        """Stop polling, drain every version (queued requests still get answers), unload."""
        self.ready = False
        self._stop.set()
        if self._loader is not None:
            self._loader.join()
        if self._poller is not None:
            self._poller.join()
        with self._reconcile_lock:
            old, self._models = self._models, {}
        for versions in old.values():
            for loaded in versions.values():
                self._drain(loaded)
        for t in self._drainers:
            t.join()

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries -------------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        return sorted(self._models)

    def versions(self, model: str) -> list[int]:
        """Ready versions of `model`, ascending."""
        return sorted(self._models.get(model, {}))

    def failures(self) -> dict[str, str]:
        """Versions that failed to load, `{"model/version": reason}`."""
        return {f"{m}/{v}": reason for (m, v), (_, reason) in dict(self._failed).items()}

    def resolve(self, model: str, version: int | None = None) -> LoadedVersion:
        """The served version (`None`: the newest); ModelNotFoundError naming what is served."""
        versions = self._models.get(model)
        if not versions and not self.ready and not self._stop.is_set():
            raise ServerBusyError("the server is still loading models; retry shortly")
        if not versions:
            raise ModelNotFoundError(
                f"model {model!r} is not served; served models: {self.model_names()}"
            )
        if version is None:
            return versions[max(versions)]
        if version not in versions:
            raise ModelNotFoundError(
                f"version {version} of model {model!r} is not served; "
                f"served versions: {sorted(versions)}"
            )
        return versions[version]

    # -- inference -----------------------------------------------------------------------------

    def submit(
        self, model: str, inputs: Mapping[str, np.ndarray], version: int | None = None
    ) -> tuple[LoadedVersion, Future]:
        """Validate `inputs` against the version's signature and queue them for batching.

        Returns the version that took the request and a Future of `{output name: array}`. A
        request racing with a hot reload is retried on the new version rather than refused.
        """
        for _ in range(8):
            loaded = self.resolve(model, version)
            arrays = validate_inputs(inputs, loaded.signature)
            try:
                return loaded, loaded.batcher.submit(arrays)
            except ServerBusyError:
                if version is not None or not loaded.batcher.closed:
                    raise
        raise ServerBusyError(f"model {model!r} is reloading; retry")

    def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], version: int | None = None
    ) -> dict[str, np.ndarray]:
        """Blocking `submit(...)`: the outputs of one request."""
        return self.submit(model, inputs, version)[1].result()

    # -- hot reload ----------------------------------------------------------------------------

    def poll(self) -> dict[str, list[str]]:
        """Reconcile with the repository once; returns `{"loaded": [...], "unloaded": [...]}`."""
        with self._reconcile_lock:
            self._read_config(strict=False)
            available = repo.scan(self.root)
            for key in [k for k in self._failed if k[1] not in available.get(k[0], [])]:
                del self._failed[key]  # deleted from disk: nothing left to report
            loaded_now, unloaded = [], []
            for model in sorted(set(available) | set(self._models)):
                if self._stop.is_set():  # closing: load nothing more
                    break
                config = self._config.for_model(model)
                versions = dict(self._models.get(model, {}))
                for _ in range(64):  # each round marks a failure or loads; bounded anyway
                    candidates = [
                        v for v in available.get(model, []) if not self._still_failed(model, v)
                    ]
                    missing = [v for v in config.version_policy.select(candidates)
                               if v not in versions]  # fmt: skip
                    if not missing:
                        break
                    for v in missing:
                        if (loaded := self._load(model, v, config)) is not None:
                            versions[v] = loaded
                            loaded_now.append(f"{model}/{v}")
                wanted = set(config.version_policy.select(candidates))
                gone = [versions.pop(v) for v in sorted(versions) if v not in wanted]
                unloaded += [f"{g.name}/{g.version}" for g in gone]
                # Publish first, drain after: new requests can no longer reach a gone version.
                if versions:
                    self._models = {**self._models, model: versions}
                else:
                    self._models = {m: v for m, v in self._models.items() if m != model}
                self.metrics.versions_loaded.labels(model).set(len(versions))
                for g in gone:
                    self._drain(g)
            return {"loaded": loaded_now, "unloaded": unloaded}

    def _poll_loop(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            try:
                changes = self.poll()
            except Exception:
                logger.exception("repository poll failed; serving what is loaded")
                continue
            if changes["loaded"] or changes["unloaded"]:
                logger.info("repository changed: %s", changes)

    def _read_config(self, *, strict: bool) -> None:
        if self._fixed_config is not None:
            return
        path = self._config_path or repo.find_config(self.root)
        try:
            self._config = (
                repo.RepositoryConfig.from_file(path, base=self.defaults)
                if path is not None
                else repo.RepositoryConfig(self.defaults)
            )
        except ConfigError as e:
            if strict:
                raise
            # Polled every few seconds: say it once per change of the file, not at every poll.
            if str(e) != self._config_error:
                logger.error("serving config %s is invalid, the last good one stays: %s", path, e)
            self._config_error = str(e)
            return
        if self._config_error is not None:
            logger.info("serving config %s is valid again", path)
        self._config_error = None

    def _fingerprint(self, model: str, version: int) -> Any:
        directory = self.root / model / str(version)
        try:
            return tuple(
                sorted(
                    (p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in directory.iterdir()
                )
            )
        except OSError:
            return None

    def _still_failed(self, model: str, version: int) -> bool:
        failed = self._failed.get((model, version))
        if failed is None:
            return False
        if failed[0] == self._fingerprint(model, version):
            return True
        del self._failed[(model, version)]
        return False

    def _load(self, model: str, version: int, config: repo.ModelConfig) -> LoadedVersion | None:
        directory = self.root / model / str(version)
        fingerprint = self._fingerprint(model, version)
        try:
            artifact = load_artifact(directory)
            if (artifact.name, artifact.version) != (model, version):
                raise ArtifactError(
                    f"{str(directory)!r} holds {artifact.name!r} version {artifact.version}; "
                    f"move it to {artifact.name}/{artifact.version}"
                )
            batcher = DynamicBatcher(
                artifact.call_numpy,
                max_batch_size=config.max_batch_size,
                max_queue_delay_s=config.max_queue_delay_ms / 1000,
                max_queue_size=config.max_queue_size,
                batch_sizes=config.batch_sizes,
                trim_padding=config.trim_padding,
                on_batch=lambda stats: self.metrics.record_batch(model, version, stats),
                name=f"batcher-{model}-{version}",
            )
            if config.warm_up:
                try:
                    artifact.warm_up(batcher.batch_sizes)
                except Exception:
                    batcher.close()
                    raise
        except Exception as e:
            reason = str(e) if isinstance(e, ArtifactError) else f"{type(e).__name__}: {e}"
            self._failed[(model, version)] = (fingerprint, reason)
            self.metrics.load_failures.labels(model, str(version)).inc()
            logger.error("not serving %s/%s: %s", model, version, reason)
            return None
        self.metrics.queue_depth.labels(model, str(version)).set_function(
            lambda: batcher.queue_size
        )
        logger.info("serving %s/%s (batch sizes %s)", model, version, list(batcher.batch_sizes))
        return LoadedVersion(artifact, batcher, config)

    def _drain(self, loaded: LoadedVersion) -> None:
        def drain() -> None:
            loaded.batcher.close()
            with contextlib.suppress(KeyError):
                self.metrics.queue_depth.remove(loaded.name, str(loaded.version))
            logger.info("unloaded %s/%s", loaded.name, loaded.version)

        self._drainers = [t for t in self._drainers if t.is_alive()]
        thread = threading.Thread(target=drain, name=f"drain-{loaded.name}", daemon=True)
        thread.start()
        self._drainers.append(thread)
