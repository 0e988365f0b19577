"""The cross-package contracts of docs/api-contracts.md hold: each name is public (in `__all__`)
and accepts the keyword arguments its siblings pass."""

import importlib
import inspect

import pytest

CONTRACTS = {
    "nnlib": {
        "ModelConfig": [],
        "get_preset": [],
        "list_presets": [],
        "Transformer": ["rngs", "attention_fn"],
        "as_function": [],
        "training_flops_per_token": [],
        "logical_axes": [],
        "partition_specs": [],
        "generate": ["temperature", "top_k", "rng", "eos_id"],
    },
    "optlib": {
        "OptimizerConfig": [],
        "build_optimizer": [],
        "build_schedule": [],
        "current_learning_rate": [],
        "cross_entropy_loss": ["z_loss_weight", "label_smoothing"],
        "chunked_cross_entropy_loss": ["chunk_size", "z_loss_weight", "logits_soft_cap"],
    },
    "datalib": {
        "ByteTokenizer": [],
        "BPETokenizer": [],
        "default_corpus": [],
        "lm_batches": [
            "seq_len",
            "batch_size",
            "seed",
            "shard_index",
            "shard_count",
            "num_workers",
            "packing",
            "num_epochs",
            "shuffle",
        ],
    },
    "ckptlib": {
        "CheckpointManager": [
            "max_to_keep",
            "keep_every_n_steps",
            "best_n",
            "best_metric",
            "best_mode",
            "async_save",
        ],
        "Restored": [],
        "PreemptionHandler": [],
        "save_safetensors": ["name_map"],
        "load_safetensors": ["name_map"],
    },
    "kernlib": {
        "attention": [
            "segment_ids",
            "causal",
            "sliding_window",
            "logits_soft_cap",
            "scale",
            "implementation",
        ],
    },
    "xprof_lite": {
        "trace": [],
        "step_annotation": [],
        "StepTraceAnnotation": [],
        "op_profile": [],
        "report": ["out_dir"],
        "device_peak": [],
    },
}


@pytest.mark.parametrize("package", sorted(CONTRACTS))
def test_contract_names_are_public_and_take_the_agreed_keywords(package):
    module = importlib.import_module(f"jaxstack.{package}")
    for name, keywords in CONTRACTS[package].items():
        assert name in module.__all__, f"jaxstack.{package}.{name} is not public"
        if keywords:
            obj = getattr(module, name)
            # NNX module classes hide __init__'s signature behind their metaclass.
            parameters = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj).parameters
            missing = [k for k in keywords if k not in parameters]
            assert not missing, f"jaxstack.{package}.{name} lacks {missing}"


def test_checkpoint_manager_methods():
    from jaxstack.ckptlib import CheckpointManager

    for method in ("save", "wait", "restore", "latest_step", "all_steps", "close", "__enter__"):
        assert callable(getattr(CheckpointManager, method)), method
    assert {"data_state", "metadata", "metrics"} <= set(
        inspect.signature(CheckpointManager.save).parameters
    )
    assert "target" in inspect.signature(CheckpointManager.restore).parameters
