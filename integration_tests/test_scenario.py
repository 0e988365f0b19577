"""The stack end to end, as a user drives it: train the tiny model with `jaxstack-train`, SIGKILL
it and resume, quantise it to int8, serve the int8 model and ask it through the `openai` client,
fine-tune and align it, profile a training step, and serve an exported non-LLM model over KServe
v2.

Each stage runs the packages' console scripts in processes. A stage whose package has not landed
yet is skipped with that package's name; nothing is imitated.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from commands import command, environment, read_jsonl, run, server, wait_until

STEPS, CHECKPOINT_EVERY, KILL_AFTER = 30, 10, 12
TRAIN_ARGS = [
    "--config",
    "tiny",
    f"train.steps={STEPS}",
    f"checkpoint.every={CHECKPOINT_EVERY}",
    "eval.every=0",
    "log.every=1",
    "log.report=false",
    "log.tensorboard=false",
    "log.sample_tokens=0",
]


def train_losses(run_dir: Path) -> dict[int, list[float]]:
    """Every logged loss of each step (a step logged twice was run again after a resume)."""
    losses: dict[int, list[float]] = {}
    for record in read_jsonl(run_dir / "metrics.jsonl"):
        if record.get("kind") == "train":
            losses.setdefault(record["step"], []).append(record["loss"])
    return losses


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A run directory of the tiny model trained for STEPS steps, SIGKILLed once on the way."""
    train = command("jaxstack-train", "trainer")
    work = tmp_path_factory.mktemp("scenario")
    run_dir = work / "run"
    args = [train, *TRAIN_ARGS, f"log.run_dir={run_dir}"]
    process = subprocess.Popen(
        args,
        cwd=work,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        checkpoint = run_dir / "checkpoints" / f"step_{CHECKPOINT_EVERY:08d}"
        wait_until(
            lambda: checkpoint.is_dir() and max(train_losses(run_dir), default=0) >= KILL_AFTER,
            f"checkpoint {checkpoint.name} and step {KILL_AFTER}",
            process,
        )
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    resumed = run(args, cwd=work)
    assert f"resumed from checkpoint step {CHECKPOINT_EVERY}" in resumed.stdout + resumed.stderr
    return run_dir


def test_training_resumes_after_sigkill_with_the_same_losses(trained):
    losses = train_losses(trained)
    assert sorted(losses) == list(range(1, STEPS + 1))
    repeated = {step: values for step, values in losses.items() if len(values) > 1}
    # the steps after the checkpoint that ran before the kill ran again, to the same numbers
    assert set(range(CHECKPOINT_EVERY + 1, KILL_AFTER + 1)) <= set(repeated)
    for step, values in repeated.items():
        assert values[0] == values[1], (step, values)
    assert losses[STEPS][-1] < losses[1][0] - 1.0
    [summary] = [r for r in read_jsonl(trained / "metrics.jsonl") if r.get("kind") == "summary"]
    assert summary["step"] == STEPS


def eval_perplexity(quant: str, path: Path, cwd: Path) -> float:
    result = run([quant, "eval", str(path), "--batches", "4", "--json"], cwd=cwd)
    return json.loads(result.stdout.strip().splitlines()[-1])["perplexity"]


@pytest.fixture(scope="module")
def int8(trained, tmp_path_factory) -> Path:
    """The trained run quantised to int8 weights by `jaxstack-quant ptq`."""
    quant = command("jaxstack-quant", "quantlib")
    out = tmp_path_factory.mktemp("quantised") / "int8"
    command_line = [quant, "ptq", str(trained), "--rules", "int8", "--out", str(out)]
    written = run(command_line, cwd=out.parent)
    assert "quantised" in written.stdout
    return out


def test_int8_model_keeps_the_float_models_perplexity(trained, int8, tmp_path):
    quant = command("jaxstack-quant", "quantlib")
    float_perplexity = eval_perplexity(quant, trained, tmp_path)
    int8_perplexity = eval_perplexity(quant, int8, tmp_path)
    assert float_perplexity < 100  # trained: far below the byte vocabulary's 259
    assert abs(int8_perplexity - float_perplexity) / float_perplexity < 0.05


def test_served_int8_model_answers_the_openai_client(int8, tmp_path):
    serve = command("jaxstack-serve", "serving")
    import openai

    from jaxstack import serving

    offline = (
        serving.LLM(str(int8))
        .generate(["def "], serving.SamplingParams(temperature=0.0, max_tokens=8))[0]
        .outputs[0]
    )
    args = [serve, "--model", str(int8), "--served-model-name", "tiny", "--port", "{port}"]
    with server(args, "/health", tmp_path) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        assert [m.id for m in client.models.list()] == ["tiny"]
        completion = client.completions.create(
            model="tiny", prompt="def ", max_tokens=8, temperature=0.0
        )
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "def "}], max_tokens=4
        )
    [choice] = completion.choices
    assert choice.text == offline.text  # the server answers what the engine computes
    assert completion.usage.completion_tokens == len(offline.token_ids)
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens <= 4


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_sft_then_dpo(trained, tmp_path):
    rl = command("jaxstack-rl", "rl")
    sft_data = write_jsonl(
        tmp_path / "sft.jsonl",
        [{"prompt": f"def add_{i}(a, b):\n", "completion": f"    return a + b + {i}\n"}
         for i in range(16)],
    )  # fmt: skip
    preferences = write_jsonl(
        tmp_path / "preferences.jsonl",
        [{"prompt": f"def add_{i}(a, b):\n", "chosen": f"    return a + b + {i}\n",
          "rejected": f"    return a - b - {i}\n"} for i in range(16)],
    )  # fmt: skip
    # no log.sample_tokens here: jaxstack-rl refuses the trainer settings it does not read
    common = [
        "train.steps=4", "data.seq_len=64", "data.batch_size=4", "eval.every=0",
        "checkpoint.every=4", "log.every=1", "log.report=false", "log.tensorboard=false",
    ]  # fmt: skip
    sft, dpo = tmp_path / "sft", tmp_path / "dpo"
    run([rl, "sft", "--run-dir", str(sft), f"init.checkpoint={trained}",
         f"data.path={sft_data}", *common], cwd=tmp_path)  # fmt: skip
    run([rl, "dpo", "--run-dir", str(dpo), f"init.checkpoint={sft}",
         f"data.path={preferences}", *common], cwd=tmp_path)  # fmt: skip
    sft_losses = [r["loss"] for r in read_jsonl(sft / "metrics.jsonl") if r["kind"] == "train"]
    dpo_losses = [r["loss"] for r in read_jsonl(dpo / "metrics.jsonl") if r["kind"] == "train"]
    assert len(sft_losses) == len(dpo_losses) == 4
    assert sft_losses[-1] < sft_losses[0]
    # the policy starts as its own reference: every preference is a coin flip, loss ln 2
    assert dpo_losses[0] == pytest.approx(0.6931, abs=1e-3)
    assert dpo_losses[-1] < dpo_losses[0]


def test_profiled_training_step(tmp_path):
    train = command("jaxstack-train", "trainer")
    prof = command("jaxstack-prof", "xprof-lite")
    run_dir = tmp_path / "run"
    run(
        [
            train,
            "--config",
            "test",
            "train.steps=4",
            "eval.every=0",
            "checkpoint.enabled=false",
            "log.profile_start=2",
            "log.profile_steps=1",
            f"log.run_dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    report = tmp_path / "report"
    run([prof, "report", str(run_dir / "profile"), "--out", str(report)], cwd=tmp_path)
    written = {p.name for p in report.iterdir()}
    assert "report.html" in written, written
    assert (report / "report.html").stat().st_size > 1000


def test_exported_model_serves_over_kserve_v2(tmp_path):
    serve_models = command("jaxstack-serve-models", "serving")
    from jaxstack import serving

    rng = np.random.default_rng(0)
    params = {
        "dense": {"kernel": rng.standard_normal((4, 3), np.float32), "bias": np.ones(3, np.float32)}
    }

    def scores(params, x):
        return jax.nn.softmax(x @ params["dense"]["kernel"] + params["dense"]["bias"])

    repository = tmp_path / "models"
    serving.export(
        scores,
        params,
        {"x": np.zeros((1, 4), np.float32)},
        name="scorer",
        version=1,
        repository=repository,
    )
    x = rng.standard_normal((5, 4)).astype(np.float32)
    body = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [5, 4], "data": x.ravel().tolist()}]
    }
    args = [serve_models, "--repository", str(repository), "--port", "{port}"]
    with server(args, "/v2/health/ready", tmp_path) as url:
        request = urllib.request.Request(
            f"{url}/v2/models/scorer/infer",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
    [output] = answer["outputs"]
    assert output["shape"] == [5, 3]
    expected = scores(jax.tree.map(jnp.asarray, params), jnp.asarray(x))
    np.testing.assert_allclose(np.reshape(output["data"], (5, 3)), expected, rtol=1e-5)
