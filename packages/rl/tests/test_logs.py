"""What a run logs, under TRL's names, in metrics.jsonl, TensorBoard and the console."""

import struct

import numpy as np
import pytest

from jaxstack import rl
from jaxstack.rl._src.online import completion_metrics
from jaxstack.rl._src.run import console_line
from jaxstack.trainer import read_jsonl


def tensorboard_tags(run_dir):
    """{tag: [values]} of the scalar summaries in run_dir/tb (TFRecord framing, by hand)."""
    from tensorboardX.proto import event_pb2

    tags = {}
    for path in sorted((run_dir / "tb").glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (length,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event.FromString(data[i + 12 : i + 12 + length])
            i += 12 + length + 4
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(value.simple_value)
    return tags


def test_completion_metrics_are_trls():
    rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.0, 2.0], np.float32)  # 2 groups of 4
    valid = np.array([1, 1, 1, 1, 1, 1, 0, 1], np.float32)
    eos = 2
    ids = [np.array(t) for t in ([5, 2], [5, 5, 5], [5, 5, 2], [5], [5, 5], [5, 2], [2], [5, 5, 5])]
    m = completion_metrics(rewards, valid, ids, group_size=4, max_new_tokens=3, eos_id=eos)
    kept = rewards[valid > 0]
    assert m["reward"] == pytest.approx(kept.mean())
    # the mean over prompts of each group's std (completion 7 left out of its group)
    assert m["reward_std"] == pytest.approx((np.std([1, 0, 1, 1]) + np.std([0.5, 0.5, 2])) / 2)
    assert m["completions/mean_length"] == pytest.approx(17 / 8)
    assert (m["completions/min_length"], m["completions/max_length"]) == (1.0, 3.0)
    assert m["completions/clipped_ratio"] == pytest.approx(2 / 8)  # 3 tokens without eos


def test_console_line_shows_each_reward_function():
    line = console_line(
        "grpo",
        {
            "reward": 0.5,
            "reward_std": 0.25,
            "kl": 0.001,
            "completions/mean_length": 3.5,
            "clip_ratio": 0.0,
            "rewards/exact/mean": 0.4,
            "rewards/exact/std": 0.2,
        },
    )
    assert line == "reward 0.500  std 0.250  kl 0.0010  len 3.5  clip 0.0%  exact 0.400±0.200"
    assert console_line("sft", {"loss": 1.0}) == ""


@pytest.mark.slow
def test_grpo_and_dpo_log_trls_metrics_to_console_and_tensorboard(
    tmp_path, tiny, write_jsonl, capsys
):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": p} for p in ("1+2=", "3+4=")])
    shared = [*tiny, "log.tensorboard=true", "log.every=1", "checkpoint.enabled=false"]
    grpo = rl.load_config(
        "grpo",
        None,
        [
            *shared,
            f"data.path={prompts}",
            "data.seq_len=16",
            "data.batch_size=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=4",
            "grpo.kl_coef=0.05",
            "train.steps=2",
            f"log.run_dir={tmp_path / 'grpo'}",
        ],
    )

    def length(prompt, completion):
        return float(len(completion))

    def digits(prompt, completion):
        return float(sum(c.isdigit() for c in completion))

    rl.grpo(grpo, rewards=[length, (digits, 0.5)])
    out = capsys.readouterr().out
    records = [r for r in read_jsonl(tmp_path / "grpo" / "metrics.jsonl") if r["kind"] == "train"]
    for key in (
        "reward",
        "reward_std",
        "rewards/length/mean",
        "rewards/length/std",
        "rewards/digits/mean",
        "rewards/digits/std",
        "kl",
        "completions/mean_length",
        "completions/clipped_ratio",
        "clip_ratio",
    ):
        assert all(key in r for r in records), key
    assert "reward " in out and " std " in out and " kl " in out and " len " in out
    assert "length " in out and "digits " in out and "±" in out
    tags = tensorboard_tags(tmp_path / "grpo")
    for key in ("reward", "reward_std", "rewards/length/mean", "kl", "completions/mean_length"):
        assert len(tags[f"train/{key}"]) == 2, key
    assert tags["train/reward"] == pytest.approx([r["reward"] for r in records])

    pairs = write_jsonl(
        tmp_path / "pref.jsonl",
        [{"prompt": f"{i}+1=", "chosen": "x", "rejected": "y"} for i in range(4)],
    )
    dpo = rl.load_config(
        "dpo",
        None,
        [
            *shared,
            f"data.path={pairs}",
            "data.seq_len=16",
            "data.batch_size=2",
            "train.steps=2",
            "optim.lr=1e-2",
            f"log.run_dir={tmp_path / 'dpo'}",
        ],
    )
    rl.dpo(dpo)
    out = capsys.readouterr().out
    assert "chosen " in out and "rejected " in out and "margin " in out and "acc " in out
    tags = tensorboard_tags(tmp_path / "dpo")
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        assert len(tags[f"train/{key}"]) == 2, key
    assert "train/logps/chosen" in tags
