"""Malformed records are reported with their file and line, before anything is written."""

import json

import pytest

from jaxstack import rl


def test_bad_chat_records_name_file_and_line(tmp_path):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    cases = [
        ("{not json", "bad JSON"),
        (json.dumps({"messages": [{"role": "robot", "content": "x"}]}), "role 'robot'"),
        (
            json.dumps({"messages": [{"role": "user", "content": "only a question"}]}),
            "no assistant",
        ),
        (json.dumps({"messages": [{"role": "user"}]}), "no string 'content'"),
        (json.dumps({"txt": "plain"}), "needs 'messages' or 'text'"),
        (
            json.dumps({"prompt": "p", "completion": [{"role": "assistant", "content": "c"}]}),
            "both",
        ),
        (
            json.dumps(
                {
                    "prompt": [{"role": "user", "content": "p"}],
                    "completion": [{"role": "user", "content": "c"}],
                }
            ),
            "only assistant messages",
        ),
        (json.dumps(["a", "list"]), "expected a JSON object"),
    ]
    for bad, message in cases:
        path = tmp_path / "chat.jsonl"
        path.write_text(json.dumps(good) + "\n\n" + bad + "\n")
        with pytest.raises(rl.RecordError, match=message) as info:
            rl.read_sft_records(path)
        assert info.value.path == str(path)
        assert info.value.line == 3  # the blank line 2 still counts
        assert str(info.value).startswith(f"{path}:3: ")


def test_bad_preference_and_prompt_records(tmp_path, write_jsonl):
    path = write_jsonl(
        tmp_path / "pref.jsonl",
        [{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p", "chosen": "a"}],
    )
    with pytest.raises(
        rl.RecordError, match=r"pref.jsonl:2: a preference record needs 'chosen' and 'rejected'"
    ):
        rl.read_preference_records(path)
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "ok"}, {"prompt": 3}])
    with pytest.raises(rl.RecordError, match=r"prompts.jsonl:2: field 'prompt' is int"):
        rl.read_prompts(path)
    (tmp_path / "latin1.jsonl").write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(rl.RecordError, match=r"latin1.jsonl:2: not UTF-8"):
        rl.read_prompts(tmp_path / "latin1.jsonl")


def test_cli_reports_a_bad_record_with_status_2_and_writes_nothing(
    tmp_path, tiny, capsys, write_jsonl
):
    path = write_jsonl(
        tmp_path / "pref.jsonl",
        [
            {"prompt": "p", "chosen": "a", "rejected": "b"},
            {"prompt": "p", "chosen": 1, "rejected": "b"},
        ],
    )
    run_dir = tmp_path / "run"
    code = rl.main(["dpo", f"data.path={path}", "--run-dir", str(run_dir), *tiny])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{path}:2: field 'chosen' is int, expected a string" in err
    assert len(err.strip().splitlines()) == 1
    assert not run_dir.exists()


def test_cli_config_errors_exit_2(tmp_path, capsys):
    assert rl.main(["grpo", "rollout.group_sise=4"]) == 2
    assert "Did you mean 'rollout.group_size'?" in capsys.readouterr().err
    assert rl.main(["sft", "dpo.reference=sometimes"]) == 2
    choices = "dpo.reference: Input should be 'precompute' or 'live', got 'sometimes'"
    assert choices in capsys.readouterr().err
    assert rl.main(["sft", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml': cannot read the file (No such file" in capsys.readouterr().err


def test_trl_dataset_formats_are_read(tmp_path, write_jsonl):
    user = [{"role": "user", "content": "2+2?"}]
    reply = [{"role": "assistant", "content": "4"}]
    wrong = [{"role": "assistant", "content": "5"}]
    sft = rl.read_sft_records(
        write_jsonl(
            tmp_path / "sft.jsonl",
            [
                {"text": "plain text"},
                {"messages": user + reply},
                {"prompt": "2+2=", "completion": "4"},
                {"prompt": user, "completion": reply},
            ],
        )
    )
    assert sft[0] == rl.SftRecord(text="plain text")
    assert sft[1].messages == user + reply
    assert (sft[2].prompt, sft[2].completion) == ("2+2=", "4")
    assert (sft[3].prompt, sft[3].completion) == (user, reply)
    prefs = rl.read_preference_records(
        write_jsonl(
            tmp_path / "pref.jsonl",
            [
                {"prompt": "2+2=", "chosen": "4", "rejected": "5"},  # standard, explicit
                {"chosen": "2+2= 4", "rejected": "2+2= 5"},  # standard, implicit
                {"prompt": user, "chosen": reply, "rejected": wrong},  # conversational
                {"chosen": user + reply, "rejected": user + wrong},  # conversational, implicit
                {"prompt": user, "chosen": "4", "rejected": "5"},  # string replies to a chat
            ],
        )
    )
    assert prefs[0] == rl.PreferenceRecord("2+2=", "4", "5")
    assert prefs[1] == rl.PreferenceRecord("2+2=", " 4", " 5")  # TRL's extract_prompt split
    for record in prefs[2:]:
        assert record == rl.PreferenceRecord(user, reply, wrong)
    prompts = rl.read_prompts(
        write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": user}])
    )
    assert prompts == ["a", user]


def test_other_formats_name_the_expected_fields(tmp_path, write_jsonl):
    cases = [
        ({"prompt": "p", "chosen": "a"}, "needs 'chosen' and 'rejected'"),  # unpaired
        ({"chosen": "same", "rejected": "same"}, "share a beginning"),
        (
            {"chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]},
            "must both be strings",
        ),
        (
            {"prompt": "p", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"},
            "expected a string",
        ),
    ]
    for record, message in cases:
        path = write_jsonl(tmp_path / "pref.jsonl", [record])
        with pytest.raises(rl.RecordError, match=message):
            rl.read_preference_records(path)
    with pytest.raises(rl.RecordError, match="needs 'prompt'"):
        rl.read_prompts(write_jsonl(tmp_path / "p.jsonl", [{"question": "q"}]))
