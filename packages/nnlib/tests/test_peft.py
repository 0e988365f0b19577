"""PEFT LoRA adapters load onto the Dense layers they were trained for."""

import json

import numpy as np
import pytest
from nnlib_testutil import SMALL, batch, forward, make, max_diff
from safetensors.numpy import save_file

from jaxstack import nnlib

# HF module name -> (nnlib Dense, in, out) of some of SMALL's Linear layers, for a PEFT folder
# written by hand (the layout peft's save_pretrained writes: lora_A [r, in], lora_B [out, r]).
MODULES = {
    "model.layers.0.self_attn.q_proj": ("layers/0/attn/q_proj", 32, 32),
    "model.layers.1.self_attn.v_proj": ("layers/1/attn/v_proj", 32, 16),
    "model.layers.1.mlp.down_proj": ("layers/1/mlp/down_proj", 64, 32),
}


def write_peft(folder, rank=4, alpha=8.0, seed=0, **settings):
    rng = np.random.default_rng(seed)
    tensors = {}
    for module, (_, d_in, d_out) in MODULES.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = rng.normal(size=(rank, d_in))
        tensors[f"base_model.model.{module}.lora_B.weight"] = rng.normal(size=(d_out, rank))
    tensors = {k: (0.1 * v).astype(np.float32) for k, v in tensors.items()}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, **settings}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return tensors


def test_a_peft_adapter_changes_the_layers_it_names_by_its_scaled_product(tmp_path):
    tensors = write_peft(tmp_path / "adapter", rank=4, alpha=8.0)
    model = make()
    tokens, positions = batch()
    base, _ = forward(model, tokens, positions)
    paths = nnlib.load_peft_adapter(model, tmp_path / "adapter")
    assert paths == sorted(path for path, _, _ in MODULES.values())
    adapted, _ = forward(model, tokens, positions)
    assert max_diff(adapted, base) > 1e-3

    # The same model with each kernel changed by B @ A * alpha / r (HF [out, in] layout) by hand.
    reference = make()
    layers = dict(nnlib.iter_modules(reference))
    for module, (path, _, _) in MODULES.items():
        a = tensors[f"base_model.model.{module}.lora_A.weight"]
        b = tensors[f"base_model.model.{module}.lora_B.weight"]
        layer = layers[path]
        kernel = np.asarray(layer.kernel[...])
        layer.kernel[...] = kernel + ((b @ a) * 2.0).T.reshape(kernel.shape)
    assert max_diff(adapted, forward(reference, tokens, positions)[0]) < 1e-5


def test_rslora_scales_by_the_square_root_of_the_rank(tmp_path):
    write_peft(tmp_path / "plain", rank=4, alpha=8.0)
    write_peft(tmp_path / "rs", rank=4, alpha=4.0, use_rslora=True)  # 4 / sqrt(4) = 8 / 4
    plain = nnlib.read_peft_adapter(tmp_path / "plain", SMALL)
    rs = nnlib.read_peft_adapter(tmp_path / "rs", SMALL)
    for path, (a, b) in plain.items():
        np.testing.assert_allclose(rs[path][1], b, rtol=1e-6)
        np.testing.assert_array_equal(rs[path][0], a)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"use_dora": True}, "use_dora=True is not supported"),
        ({"peft_type": "IA3"}, "only LoRA adapters load"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ],
)
def test_adapter_settings_that_change_the_tensors_meaning_are_refused(tmp_path, settings, message):
    write_peft(tmp_path / "adapter", **settings)
    with pytest.raises(nnlib.SurgeryError, match=message):
        nnlib.read_peft_adapter(tmp_path / "adapter", SMALL)


def test_an_adapter_for_a_layer_the_model_lacks_names_it(tmp_path):
    write_peft(tmp_path / "adapter")
    with pytest.raises(nnlib.SurgeryError, match=r"model\.layers\.1\.mlp\.down_proj"):
        nnlib.read_peft_adapter(tmp_path / "adapter", SMALL.replace(num_layers=1))
