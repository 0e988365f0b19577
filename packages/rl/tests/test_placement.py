"""Roles on meshes: actor, reference and rollout engine each on its configured devices."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from jaxstack import rl

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "grpo_placement.py"


def _placement_runs() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_roles_on_their_own_devices_train_as_on_one_device():
    runs = _placement_runs()
    split, one = runs["split"], runs["one"]
    assert split["actor"] == split["optimizer"] == [0, 1, 2, 3]
    assert split["reference"] == [4, 5]
    assert split["rollout"] == [6, 7]
    assert one["actor"] == one["optimizer"] == one["reference"] == one["rollout"] == [0]
    # the trainer's rules shard the actor's embeddings over fsdp (embed -> fsdp)
    assert any("fsdp" in spec for spec in split["actor_specs"])
    # same samples (the rollout engine got the same weights), same reference, same update
    assert split["rewards"] == one["rewards"]
    assert split["kls"][1] > 1e-4  # the second iteration's KL to the reference is not zero
    # float32 sums split over 4 devices add up in another order: agree to float rounding
    assert split["losses"] == pytest.approx(one["losses"], rel=1e-5, abs=1e-6)
    assert split["kls"] == pytest.approx(one["kls"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["roles.reference.devices=[0]", "roles.reference.mesh={data: 2}"],
            r"roles\.reference\.mesh: .*needs 2 devices but 1 are available",
        ),
        (
            ["roles.rollout.devices=[0, 99]"],
            r"roles\.rollout\.devices=\[0, 99\]: device 99 does not exist; this host has \d+",
        ),
    ],
)
def test_a_placement_that_does_not_fit_the_devices_is_a_config_error(
    tmp_path, tiny, write_jsonl, overrides, message
):
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "12+34="}])
    config = rl.load_config(
        "grpo",
        None,
        [
            *tiny,
            f"data.path={tmp_path / 'prompts.jsonl'}",
            f"log.run_dir={tmp_path / 'run'}",
            *overrides,
        ],
    )
    with pytest.raises(rl.ConfigError, match=message):
        rl.grpo(config, rewards=[lambda prompt, completion: 1.0])
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize(
    "override, message",
    [
        ("roles.critic.devices=[0]", r"roles\.critic"),
        ("roles.actor.devices=[1, 1]", r"^roles\.actor\.devices: .*distinct, got \[1, 1\]$"),
        ("roles.actor.devices=[]", r"^roles\.actor\.devices: .*at least 1 item.*, got \[\]$"),
        ("roles.actor.devices=[-1]", r"^roles\.actor\.devices\.0: .* equal to 0, got -1$"),
        ("roles.actor.mesh={data: 2, dcn: 1}", r"roles\.actor\.mesh\.dcn"),
    ],
)
def test_bad_role_settings_are_refused_when_the_config_loads(override, message):
    with pytest.raises(rl.ConfigError, match=message):
        rl.load_config("grpo", None, [override])
