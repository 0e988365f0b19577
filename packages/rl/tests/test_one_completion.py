"""One completion, every stage: SFT trains the tokens DPO/ORPO score after the prompt GRPO uses."""

import numpy as np
import pytest

from jaxstack import rl
from jaxstack.rl._src.policy import build_policy
from jaxstack.rl._src.preference import encode_pairs

USER = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
REPLY = [{"role": "assistant", "content": "4"}]
WRONG = [{"role": "assistant", "content": "5"}]


def learned(tokens, mask):
    return [int(t) for t, m in zip(tokens, mask, strict=True) if m]


def prompt_part(tokens, mask):
    return [int(t) for t in tokens[: int(np.argmax(np.asarray(mask) > 0))]]


def stages(tmp_path, write_jsonl, tiny, overrides):
    """(sft document, DPO chosen row, GRPO prompt ids, policy) for the USER/REPLY exchange."""
    sft_path = write_jsonl(tmp_path / "sft.jsonl", [{"messages": USER + REPLY}])
    pref_path = write_jsonl(
        tmp_path / "pref.jsonl", [{"prompt": USER, "chosen": REPLY, "rejected": WRONG}]
    )
    prompt_path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": USER}])
    sft_config = rl.load_config("sft", None, [*tiny, f"data.path={sft_path}", *overrides])
    policy = build_policy(sft_config)
    encoder = policy.encoder()
    doc = encoder.sft_document(rl.read_sft_records(sft_path)[0])
    dpo_config = rl.load_config(
        "dpo", None, [*tiny, f"data.path={pref_path}", "data.seq_len=96", *overrides]
    )
    pairs = encode_pairs(dpo_config, policy)
    # the DPO row's targets are the tokens after each position: prepend the first input token
    row = np.concatenate([pairs["chosen_tokens"][0][:1], pairs["chosen_targets"][0]])
    mask = np.concatenate([[0.0], pairs["chosen_loss_mask"][0]])
    grpo_prompt = encoder.prompt(rl.read_prompts(prompt_path)[0])
    return doc, (row, mask), grpo_prompt, policy


@pytest.mark.parametrize("tokenizer", ["byte", "hf-chatml"])
def test_dpo_scores_the_tokens_sft_trains(
    tmp_path, write_jsonl, tiny, tiny_hf, hf_folder, tokenizer
):
    overrides = [] if tokenizer == "byte" else [f"init.hf={hf_folder()}"]
    base = tiny if tokenizer == "byte" else tiny_hf
    doc, (row, mask), grpo_prompt, policy = stages(tmp_path, write_jsonl, base, overrides)
    tok = policy.tokenizer
    sft_learned = learned(doc["tokens"], doc["loss_mask"])
    dpo_scored = learned(row, mask)
    assert dpo_scored == sft_learned
    assert prompt_part(row, mask) == prompt_part(doc["tokens"], doc["loss_mask"])
    assert list(grpo_prompt) == prompt_part(doc["tokens"], doc["loss_mask"])
    # reply + end-of-turn + eos, in both
    end_of_turn = "\n" if tokenizer == "byte" else "<|im_end|>\n"
    template = policy.assets.template
    full = template.render(USER + REPLY)
    assert full.endswith("4" + end_of_turn)
    assert sft_learned[-1] == tok.eos_id
    assert sft_learned[:-1] == list(tok.encode("4" + end_of_turn))
    if tokenizer == "hf-chatml":
        assert tok.bos_id is None and grpo_prompt[0] == tok.encode("<|im_start|>")[0]
        assert tok.decode(grpo_prompt) == template.render(USER, add_generation_prompt=True).replace(
            "<|im_start|>", ""
        ).replace("<|im_end|>", "")  # specials are skipped by decode


def test_string_pairs_after_a_chat_prompt_get_the_template_too(tmp_path, write_jsonl, tiny):
    """A conversational prompt with string replies (TRL's mixed form) scores reply + end of turn."""
    path = write_jsonl(tmp_path / "pref.jsonl", [{"prompt": USER, "chosen": "4", "rejected": "5"}])
    config = rl.load_config("dpo", None, [*tiny, f"data.path={path}", "data.seq_len=96"])
    policy = build_policy(config)
    pairs = encode_pairs(config, policy)
    scored = learned(pairs["chosen_targets"][0], pairs["chosen_loss_mask"][0])
    assert scored == [*policy.tokenizer.encode("4\n"), policy.tokenizer.eos_id]
