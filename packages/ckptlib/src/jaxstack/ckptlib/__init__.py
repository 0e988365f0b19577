"""Atomic, async, verified checkpoints of model, optimiser and data state on Orbax.

from jaxstack.ckptlib import CheckpointManager

with CheckpointManager("/tmp/run/ckpt", max_to_keep=3) as mgr:
    mgr.save(step, {"params": params, "opt_state": opt_state, "step": step},
             data_state=data_iter.get_state(), metadata={"config": config})
    restored = mgr.restore(target=abstract_state)   # newest good step, target's shardings
"""

import importlib
from typing import Any

# public name -> the module (under _src) that defines it. Imported on first use (PEP 562),
# so that importing jaxstack.ckptlib, or a command's --help, does not import JAX.
_EXPORTS = {
    "CheckpointInfo": "catalog",
    "list_checkpoints": "catalog",
    "read_manifest": "catalog",
    "verify_checkpoints": "catalog",
    "CheckpointDamagedWarning": "damage",
    "CheckpointFallbackWarning": "damage",
    "DamagedCheckpoint": "damage",
    "CheckpointExistsError": "errors",
    "CheckpointNotFoundError": "errors",
    "CheckpointSaveError": "errors",
    "CorruptCheckpointError": "errors",
    "Error": "errors",
    "TargetMismatchError": "errors",
    "export_params": "interop",
    "restore_orbax": "interop",
    "CheckpointManager": "manager",
    "Restored": "manager",
    "VerificationResult": "manifest",
    "agree_on_signal": "multihost",
    "PreemptionHandler": "preemption",
    "resume": "preemption",
    "load_safetensors": "safetensors",
    "save_safetensors": "safetensors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}._src.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
