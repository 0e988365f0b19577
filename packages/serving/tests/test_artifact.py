import collections
import json
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import pytest

from jaxstack.serving import ArtifactError, ExportError, export, load_artifact


def test_mlp_artifact_matches_jit_at_every_batch_size(zoo, tmp_path):
    params = zoo.init_mlp(3)
    path = zoo.export_mlp(tmp_path, 1, seed=3)
    artifact = load_artifact(path)
    rng = np.random.default_rng(0)
    for batch in (1, 3, 8):
        x = rng.normal(size=(batch, 12)).astype(np.float32)
        expected = np.asarray(jax.jit(zoo.mlp)(params, x))
        got = artifact.call_numpy({"x": x})["output_0"]
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_cnn_artifact_with_two_inputs_and_named_outputs(zoo, tmp_path):
    params = zoo.init_cnn(1)
    artifact = load_artifact(zoo.export_cnn(tmp_path, 1))
    rng = np.random.default_rng(1)
    image = rng.normal(size=(5, 16, 16, 1)).astype(np.float32)
    scale = rng.uniform(0.5, 2, size=(5, 1)).astype(np.float32)
    expected = jax.jit(zoo.cnn)(params, image, scale)
    got = artifact.call_numpy({"image": image, "scale": scale})
    assert set(got) == {"logits", "probs"}
    for name in got:
        np.testing.assert_allclose(got[name], np.asarray(expected[name]), rtol=1e-5, atol=1e-6)


def test_signature_metadata_and_manifest(zoo, tmp_path):
    path = zoo.export_cnn(tmp_path, 2)
    assert path == tmp_path / "cnn" / "2"
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json", "metadata.json", "model.stablehlo", "signature.json",
        "weights.safetensors",
    ]  # fmt: skip
    signature = json.loads((path / "signature.json").read_text())
    assert signature["inputs"] == [
        {"name": "image", "datatype": "FP32", "shape": [-1, 16, 16, 1]},
        {"name": "scale", "datatype": "FP32", "shape": [-1, 1]},
    ]
    assert signature["outputs"][0] == {"name": "logits", "datatype": "FP32", "shape": [-1, 10]}
    assert {w["name"] for w in signature["weights"]} == {
        f"{layer}/{leaf}" for layer in ("conv1", "conv2", "head") for leaf in ("kernel", "bias")
    }
    metadata = json.loads((path / "metadata.json").read_text())
    assert metadata["jax_version"] == jax.__version__
    assert metadata["platforms"] == ["cpu"]
    assert (metadata["name"], metadata["version"]) == ("cnn", 2)
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["files"]) == {p.name for p in path.iterdir()} - {"manifest.json"}
    assert all(len(entry["sha256"]) == 64 for entry in manifest["files"].values())
    # Nothing was left behind by the atomic write.
    assert [p.name for p in (tmp_path / "cnn").iterdir()] == ["2"]


def test_corrupted_weight_file_is_refused(zoo, tmp_path):
    path = zoo.export_mlp(tmp_path, 1)
    weights = path / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # same size, one flipped byte in a tensor
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"weights\.safetensors.*sha256.*tampered"):
        load_artifact(path)


def test_truncated_and_partial_artifacts_are_refused(zoo, tmp_path):
    path = zoo.export_mlp(tmp_path, 1)
    model = path / "model.stablehlo"
    model.write_bytes(model.read_bytes()[:-10])
    with pytest.raises(ArtifactError, match=r"model\.stablehlo.*truncated"):
        load_artifact(path)
    path2 = zoo.export_mlp(tmp_path, 2)
    (path2 / "signature.json").unlink()
    with pytest.raises(ArtifactError, match=r"partial artifact: signature\.json is missing"):
        load_artifact(path2)
    path3 = zoo.export_mlp(tmp_path, 3)
    (path3 / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match=r"partial artifact: manifest\.json is missing"):
        load_artifact(path3)


def test_versions_are_immutable_and_names_checked(zoo, tmp_path):
    zoo.export_mlp(tmp_path, 1)
    with pytest.raises(ExportError, match="already exists"):
        zoo.export_mlp(tmp_path, 1)
    with pytest.raises(ExportError, match="version 0"):
        export(zoo.mlp, zoo.init_mlp(0), zoo.MLP_EXAMPLE, name="m", version=0,
               repository=tmp_path)  # fmt: skip
    with pytest.raises(ExportError, match=r"name '\.\./x'"):
        export(zoo.mlp, zoo.init_mlp(0), zoo.MLP_EXAMPLE, name="../x", version=1,
               repository=tmp_path)  # fmt: skip
    with pytest.raises(ExportError, match=r"name 'm\\n'"):
        export(zoo.mlp, zoo.init_mlp(0), zoo.MLP_EXAMPLE, name="m\n", version=1,
               repository=tmp_path)  # fmt: skip


def test_outputs_without_batch_dimension_are_rejected(tmp_path):
    with pytest.raises(ExportError, match=r"output 'output_0'.*batch dimension"):
        export(lambda p, x: x.sum(0), {}, {"x": np.zeros((2, 3), np.float32)},
               name="bad", version=1, repository=tmp_path)  # fmt: skip
    assert not (tmp_path / "bad" / "1").exists()


def test_artifact_runs_with_plain_jax_and_safetensors(zoo, tmp_path):
    """No jaxstack, no pickle, no model code: the artifact is self-describing."""
    path = zoo.export_mlp(tmp_path, 1, seed=7)
    x = np.random.default_rng(2).normal(size=(4, 12)).astype(np.float32)
    script = f"""
import json, sys, numpy as np, jax
from jax import export
from safetensors.numpy import load_file
d = {str(path)!r}
exp = export.deserialize(bytearray(open(d + "/model.stablehlo", "rb").read()))
w = load_file(d + "/weights.safetensors")
x = np.array(json.loads(sys.stdin.read()), np.float32)
print(json.dumps(np.asarray(exp.call(w, {{"x": x}})["output_0"]).tolist()))
assert "jaxstack.serving" not in sys.modules
"""
    out = subprocess.run([sys.executable, "-c", script], input=json.dumps(x.tolist()),
                         capture_output=True, text=True, check=True)  # fmt: skip
    expected = np.asarray(jax.jit(zoo.mlp)(zoo.init_mlp(7), x))
    np.testing.assert_allclose(np.array(json.loads(out.stdout)), expected, rtol=1e-6, atol=1e-6)


def test_bfloat16_params_and_int_inputs(tmp_path):
    params = {"table": np.arange(20).astype(ml_dtypes.bfloat16).reshape(10, 2)}
    path = export(lambda p, ids: p["table"][ids].sum(1), params,
                  {"ids": np.zeros((1, 3), np.int32)}, name="emb", version=1,
                  repository=tmp_path)  # fmt: skip
    artifact = load_artifact(path)
    assert artifact.signature.outputs[0].datatype == "BF16"
    ids = np.array([[0, 1, 2], [9, 9, 9]], np.int32)
    got = artifact.call_numpy({"ids": ids})["output_0"].astype(np.float32)
    np.testing.assert_array_equal(got, [[0 + 2 + 4, 1 + 3 + 5], [54, 57]])


def test_weight_names_follow_the_parameter_path_convention(tmp_path):
    # A trailing `.value` attribute (how a Flax NNX Variable flattens) is dropped; a dict key
    # named "value" is a real name and stays.
    Variable = collections.namedtuple("Variable", ["value"])
    params = {
        "layers": [{"kernel": Variable(np.ones((2, 2), np.float32))}],
        "value": np.zeros((2,), np.float32),
    }
    path = export(lambda p, x: x @ p["layers"][0]["kernel"].value + p["value"], params,
                  {"x": np.zeros((1, 2), np.float32)}, name="conv", version=1,
                  repository=tmp_path)  # fmt: skip
    signature = json.loads((path / "signature.json").read_text())
    assert sorted(w["name"] for w in signature["weights"]) == ["layers/0/kernel", "value"]
