"""Atomic, async, verified checkpoints of model, optimiser and data state on Orbax.

from jaxstack.ckptlib import CheckpointManager

with CheckpointManager("/tmp/run/ckpt", max_to_keep=3) as mgr:
    mgr.save(step, {"params": params, "opt_state": opt_state, "step": step},
             data_state=data_iter.get_state(), metadata={"config": config})
    restored = mgr.restore(target=abstract_state)   # newest good step, target's shardings
"""

from jaxstack.ckptlib._src.catalog import (
    CheckpointInfo,
    list_checkpoints,
    read_manifest,
    verify_checkpoints,
)
from jaxstack.ckptlib._src.damage import (
    CheckpointDamagedWarning,
    CheckpointFallbackWarning,
    DamagedCheckpoint,
)
from jaxstack.ckptlib._src.errors import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    CheckpointSaveError,
    CorruptCheckpointError,
    Error,
    TargetMismatchError,
)
from jaxstack.ckptlib._src.interop import export_params, restore_orbax
from jaxstack.ckptlib._src.manager import CheckpointManager, Restored
from jaxstack.ckptlib._src.manifest import VerificationResult
from jaxstack.ckptlib._src.multihost import agree_on_signal
from jaxstack.ckptlib._src.preemption import PreemptionHandler, resume
from jaxstack.ckptlib._src.safetensors import load_safetensors, save_safetensors

__all__ = [
    "CheckpointDamagedWarning",
    "CheckpointExistsError",
    "CheckpointFallbackWarning",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "CheckpointSaveError",
    "CorruptCheckpointError",
    "DamagedCheckpoint",
    "Error",
    "PreemptionHandler",
    "Restored",
    "TargetMismatchError",
    "VerificationResult",
    "agree_on_signal",
    "export_params",
    "list_checkpoints",
    "load_safetensors",
    "read_manifest",
    "restore_orbax",
    "resume",
    "save_safetensors",
    "verify_checkpoints",
]
