"""Two GRPO iterations under each role placement; prints `RESULT {json}`: per placement, each
role's devices, the losses, rewards and KLs.

Run with XLA_FLAGS forcing 8 host devices. Placements: "split" (actor on devices 0-3 as
data 2 x fsdp 2, reference on 4-5 as fsdp 2, rollout on 6-7) and "one" (every role on device 0).
"""

import json
import pathlib
import sys
import tempfile

import jax

from jaxstack import rl
from jaxstack.rl._src.online import GrpoUpdate, Rollouter
from jaxstack.rl._src.placement import place_roles
from jaxstack.rl._src.policy import build_policy
from jaxstack.rl._src.rewards import as_rewards

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from conftest import TINY

PLACEMENTS = {
    "split": [
        "roles.actor.devices=[0, 1, 2, 3]",
        "roles.actor.mesh={data: 2, fsdp: 2}",
        "roles.reference.devices=[4, 5]",
        "roles.reference.mesh={data: 1, fsdp: 2}",
        "roles.rollout.devices=[6, 7]",
    ],
    "one": [f"roles.{role}.devices=[0]" for role in ("actor", "reference", "rollout")],
}


def devices(tree) -> list[int]:
    return sorted({d.id for x in jax.tree.leaves(tree) for d in x.sharding.device_set})


def run(placement: str) -> dict:
    root = pathlib.Path(tempfile.mkdtemp())
    prompts = ["12+34=", "56*7=", "90+11=", "3*45="]
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    config = rl.load_config(
        "grpo",
        None,
        [
            *TINY,
            f"data.path={root / 'prompts.jsonl'}",
            "data.seq_len=16",
            "data.batch_size=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=4",
            # SGD with momentum, not Adam: Adam's step is about lr wherever a gradient is near
            # zero, whatever its sign, so the float rounding in which the sharded run differs
            # flips such steps and the second loss moves by ~0.5% (seen on an AVX-512 CPU);
            # SGD's step follows the gradient, and the runs agree to float rounding.
            "optim.name=sgd",
            "optim.momentum=0.9",
            "optim.lr=1.0",
            "grpo.kl_coef=0.5",
            *PLACEMENTS[placement],
        ],
    )
    roles = place_roles(config)
    policy = build_policy(config)
    length = as_rewards([lambda prompt, completion: float(len(completion))])
    rollouter = Rollouter(config, policy, length, roles)
    update = GrpoUpdate(config, policy, roles)
    state = update.initial_state()
    losses, rewards, kls = [], [], []
    for iteration in range(2):
        # the second round starts beside the first update, its params sent across meshes
        state, metrics = update.iteration(state, iteration, rollouter, iteration == 0)
        losses.append(metrics["loss"])
        rewards.append(metrics["reward"])
        kls.append(metrics["kl"])
    engine_params = rollouter.sampler.llm.engine.runner.params
    return {
        "actor": devices(state["params"]),
        "optimizer": devices(state["opt_state"]),
        "reference": devices(update.ref_params),
        "rollout": devices(engine_params),
        "actor_specs": sorted({str(x.sharding.spec) for x in jax.tree.leaves(state["params"])}),
        "losses": losses,
        "rewards": rewards,
        "kls": kls,
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps({placement: run(placement) for placement in PLACEMENTS}))
