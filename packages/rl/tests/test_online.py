"""GRPO/PPO with the serving engine: weight hand-off, reward errors, SIGKILL and resume."""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import yaml
from flax import nnx

from jaxstack import nnlib, rl
from jaxstack.rl._src.encode import Encoder, build_chat_template, sequence_batch
from jaxstack.rl._src.online import Rollouter
from jaxstack.rl._src.placement import place_role, place_roles
from jaxstack.rl._src.policy import build_policy
from jaxstack.rl._src.rewards import as_rewards
from jaxstack.rl._src.rollout import EngineSampler
from jaxstack.trainer import read_jsonl

PROMPTS = ["12+34=", "56*7=", "90+11=", "3*45="]


def test_engine_greedy_follows_handed_off_weights(tiny):
    config = rl.load_config("grpo", None, [*tiny, "lora.rank=4", r"lora.pattern=attn/(q|v)_proj$"])
    policy = build_policy(config)
    sampler = EngineSampler(
        policy, place_role(config, "rollout"), max_model_len=32, max_num_seqs=4, seed=0
    )
    encoder = Encoder(policy.tokenizer, build_chat_template(None))
    texts = ["12+34=", "56+78="]
    prompts = [encoder.prompt(p) for p in texts]  # equal lengths for nnlib

    def reference(params):
        """nnlib's own greedy decode of the model with these (adapter) params."""
        model = nnx.clone(policy.model)
        nnx.update(model, params)
        out = np.asarray(
            nnlib.generate(model, np.stack(prompts), 8, eos_id=policy.tokenizer.eos_id)
        )
        texts = []
        for row in out[:, len(prompts[0]) :]:
            ids = list(row)
            ids = (
                ids[: ids.index(policy.tokenizer.eos_id)] if policy.tokenizer.eos_id in ids else ids
            )
            texts.append(policy.tokenizer.decode(ids))
        return texts

    keys = iter(jax.random.split(jax.random.key(1), 100))
    moved = jax.tree.map(lambda x: x + 2.0 * jax.random.normal(next(keys), x.shape), policy.params)
    before = sampler.greedy_fn(policy.params, encoder, 8)(texts)
    after = sampler.greedy_fn(moved, encoder, 8)(texts)
    assert before == reference(policy.params)
    assert after == reference(moved)
    assert after != before
    assert sampler.greedy_fn(policy.params, encoder, 8)(texts) == before  # and back again


def test_scored_log_probs_are_those_of_the_sampling_temperature(tiny):
    """GRPO and PPO score rollouts with token_logprobs at rollout.temperature: its
    probabilities must be the frequencies the engine samples with at that temperature."""
    config = rl.load_config("grpo", None, tiny)
    policy = build_policy(config)
    sharpen = lambda kp, x: x * 20.0 if nnlib.param_path(kp) == "lm_head/kernel" else x
    params = jax.tree_util.tree_map_with_path(sharpen, policy.params)
    prompt = Encoder(policy.tokenizer, build_chat_template(None)).prompt("12+34=")
    vocab = policy.model.config.vocab_size
    rows = sequence_batch(
        [prompt] * vocab,
        [np.array([v], np.int32) for v in range(vocab)],
        len(prompt) + 1,
        policy.tokenizer.pad_id,
    )

    def probs(temperature):
        """The model's next-token distribution after the prompt, one row per token."""
        logps = rl.token_logprobs(policy.apply, params, rows, temperature=temperature)
        return np.exp(np.asarray(logps)[:, len(prompt) - 1])

    sampler = EngineSampler(
        policy, place_role(config, "rollout"), max_model_len=16, max_num_seqs=256, seed=0
    )
    sampler.update_weights(params)
    n = 4000
    settings = dict(n=n, max_new_tokens=1, temperature=0.5, top_k=None, iteration=0)
    done = sampler.finish(sampler.start([prompt], **settings))
    freq = np.bincount([int(t[0]) for t in done.token_ids], minlength=vocab) / n
    assert probs(0.5).sum() == pytest.approx(1.0, abs=1e-4)
    assert np.abs(freq - probs(0.5)).max() < 0.03  # a frequency's std is <= 0.008 here
    assert np.abs(freq - probs(1.0)).max() > 0.1  # unscaled log-probs would be off-policy


REWARDS_MODULE = """
def length(prompt, completion):
    return float(len(completion))

def ascii_share(prompt, completion):
    return sum(c.isascii() for c in completion) / max(len(completion), 1)

def fails_on_56(prompt, completion):
    if prompt.startswith("56"):
        raise ZeroDivisionError("division by zero")
    return 1.0
"""


@pytest.fixture
def online_setup(tmp_path, tiny, write_jsonl, monkeypatch):
    """A prompts file, an importable rewards module, and the overrides of a tiny GRPO run."""
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": p} for p in PROMPTS])
    (tmp_path / "test_rl_rewards.py").write_text(REWARDS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    overrides = [
        *tiny,
        f"data.path={tmp_path / 'prompts.jsonl'}",
        "data.seq_len=16",
        "data.batch_size=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=4",
        "optim.lr=3e-2",
        "checkpoint.every=1",
        "checkpoint.async_save=false",
    ]
    return tmp_path, overrides


def test_a_raising_reward_stops_or_is_skipped(online_setup):
    tmp_path, overrides = online_setup
    from test_rl_rewards import fails_on_56, length

    stop = rl.load_config(
        "grpo", None, [*overrides, "train.steps=2", f"log.run_dir={tmp_path / 'a'}"]
    )
    with pytest.raises(
        rl.RewardError, match=r"reward 'fails_on_56' raised ZeroDivisionError: .*prompt '56\*7='"
    ):
        rl.grpo(stop, rewards=[length, (fails_on_56, 0.5)])
    skip = rl.load_config(
        "grpo",
        None,
        [
            *overrides,
            "train.steps=2",
            "rollout.on_reward_error=skip",
            f"log.run_dir={tmp_path / 'b'}",
        ],
    )
    result = rl.grpo(skip, rewards=[length, (fails_on_56, 0.5)])
    records = [r for r in read_jsonl(tmp_path / "b" / "metrics.jsonl") if r["kind"] == "train"]
    skipped = [r["rewards_skipped"] for r in records]
    # each iteration draws 2 of the 4 prompts; a draw of "56*7=" skips its 4 completions
    assert all(s in (0.0, 4.0) for s in skipped) and sum(skipped) > 0
    assert result.step == 2


def test_grpo_raises_the_reward_it_is_given(online_setup):
    """The whole loop (sampling, scoring, advantages, update, weight hand-off) climbs a reward
    a random byte-level model can learn: the share of ASCII characters in its completions
    (about half at initialisation). A flipped advantage sign, completions scored against
    the wrong rows or an engine left on the initial weights keep it flat or push it down."""
    tmp_path, overrides = online_setup
    from test_rl_rewards import ascii_share

    config = rl.load_config(
        "grpo",
        None,
        [
            *overrides,
            "train.steps=12",
            "data.batch_size=4",
            "rollout.group_size=8",
            "checkpoint.enabled=false",
            f"log.run_dir={tmp_path / 'climb'}",
        ],
    )
    rl.grpo(config, rewards=[ascii_share])
    rewards = [
        r["reward"]
        for r in read_jsonl(tmp_path / "climb" / "metrics.jsonl")
        if r["kind"] == "train"
    ]
    assert np.mean(rewards[:4]) < 0.65
    assert np.mean(rewards[-4:]) > np.mean(rewards[:4]) + 0.2


TIMING = ("step_time_s", "rollout_s", "update_s", "rollout_tokens_per_sec", "tokens_per_sec")


def _metrics(run_dir):
    by_step = {}
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        if r["kind"] == "train":
            by_step[r["step"]] = {k: v for k, v in r.items() if k not in TIMING}
    return by_step


@pytest.mark.parametrize("algorithm", ["grpo"])
def test_sigkill_and_resume_reproduces_the_uninterrupted_metrics(online_setup, algorithm):
    tmp_path, overrides = online_setup
    steps = 4

    def config(name):
        cfg = rl.load_config(
            algorithm, None, [*overrides, f"train.steps={steps}", f"log.run_dir={tmp_path / name}"]
        ).to_dict()
        cfg["rewards"] = {"test_rl_rewards:length": 1.0}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = lambda name: [
        sys.executable,
        "-m",
        "jaxstack.rl._src.cli",
        algorithm,
        "--config",
        str(config(name)),
    ]
    subprocess.run(command("whole"), env=env, check=True, capture_output=True, timeout=600)

    victim = subprocess.Popen(
        command("killed"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    committed = tmp_path / "killed" / "checkpoints" / "step_00000002"
    deadline = time.monotonic() + 600
    while not committed.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=60)
    assert committed.exists(), "the run ended or timed out before its step-2 checkpoint"
    interrupted = _metrics(tmp_path / "killed")
    assert max(interrupted) < steps  # it really was cut short
    subprocess.run(command("killed"), env=env, check=True, capture_output=True, timeout=600)

    whole, resumed = _metrics(tmp_path / "whole"), _metrics(tmp_path / "killed")
    assert sorted(whole) == sorted(resumed) == list(range(1, steps + 1))
    assert whole[1]["kl"] == 0 < whole[steps]["kl"]  # the policy moved off its start
    for step in whole:
        assert resumed[step] == whole[step], step


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_rounds_started_beside_the_update_change_no_number(online_setup, monkeypatch, algorithm):
    """A round starts while the previous update computes, unless an evaluation samples in
    between: runs that evaluate after every iteration and runs that never do agree."""
    tmp_path, overrides = online_setup
    from test_rl_rewards import length

    from jaxstack.rl._src import online

    events = []
    start, collect = online.Rollouter.start, online.Rollouter.collect

    def logged(name, method):
        def call(self, params, iteration):
            events.append((name, iteration))
            return method(self, params, iteration)

        return call

    monkeypatch.setattr(online.Rollouter, "start", logged("start", start))
    monkeypatch.setattr(online.Rollouter, "collect", logged("collect", collect))
    runs, orders = {}, {}
    for name, evaluate in (("beside", None), ("after", lambda step, generate: {})):
        events.clear()
        run_dir = tmp_path / f"{algorithm}-{name}"
        steps = ["train.steps=3", "eval.every=1", "checkpoint.enabled=false"]
        config = rl.load_config(algorithm, None, [*overrides, *steps, f"log.run_dir={run_dir}"])
        getattr(rl, algorithm)(config, [length], evaluate=evaluate)
        runs[name], orders[name] = _metrics(run_dir), list(events)
    assert orders["beside"] == [
        *[("collect", 0), ("start", 0), ("start", 1), ("collect", 1)],
        *[("start", 2), ("collect", 2)],
    ]
    assert orders["after"] == [(e, i) for i in range(3) for e in ("collect", "start")]
    assert runs["beside"] == runs["after"]
    assert runs["beside"][1]["loss"] != runs["beside"][3]["loss"]


def test_a_round_of_prompts_is_prefilled_in_one_engine_step(tiny):
    from jaxstack.serving import SamplingParams

    config = rl.load_config("grpo", "tiny-grpo", tiny)  # 16 prompts x 8 completions a round
    policy = build_policy(config)
    rollouter = Rollouter(config, policy, as_rewards(config.rewards), place_roles(config))
    engine = rollouter.sampler.llm.engine
    prompts = [rollouter.prompt_ids[i] for i in rollouter.order[0]]
    assert sum(len(p) for p in prompts) * 8 > 256  # more than the engine's smallest budget
    for prompt in prompts:
        engine.add_request([int(t) for t in prompt], SamplingParams(n=8, max_tokens=4, seed=1))
    # One step prefills all 128 sequences and samples their first token (under async
    # scheduling the engine records it while launching the next).
    first = []
    while not first:
        first = engine.step()
    assert len(first) == 128
    assert all(len(update.new_token_ids) == 1 for update in first)
