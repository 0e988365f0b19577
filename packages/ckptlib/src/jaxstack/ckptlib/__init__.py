"""Atomic, async, verified checkpoints of model, optimiser and data state on Orbax.

from jaxstack.ckptlib import CheckpointManager

with CheckpointManager("/tmp/run/ckpt", max_to_keep=3) as mgr:
    mgr.save(step, {"params": params, "opt_state": opt_state, "step": step},
             data_state=data_iter.get_state(), metadata={"config": config})
    restored = mgr.restore(target=abstract_state)   # newest good step, target's shardings
"""

import lazy_loader

# Public names load on first use (PEP 562), so that importing jaxstack.ckptlib, or a
# command's --help, does not import JAX.
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_src.catalog": [
            "CheckpointInfo",
            "list_checkpoints",
            "read_manifest",
            "verify_checkpoints",
        ],
        "_src.damage": [
            "CheckpointDamagedWarning",
            "CheckpointFallbackWarning",
            "DamagedCheckpoint",
        ],
        "_src.errors": [
            "CheckpointExistsError",
            "CheckpointNotFoundError",
            "CheckpointSaveError",
            "CorruptCheckpointError",
            "Error",
            "TargetMismatchError",
        ],
        "_src.interop": ["export_params", "restore_orbax"],
        "_src.layout": ["atomic_file"],
        "_src.manager": ["CheckpointManager", "Restored"],
        "_src.manifest": ["VerificationResult"],
        "_src.multihost": ["agree_on_signal"],
        "_src.preemption": ["PreemptionHandler", "resume"],
        "_src.safetensors": ["load_safetensors", "save_safetensors"],
    },
)
