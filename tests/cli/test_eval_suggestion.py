"""`hybridrl eval` after a run: the end-of-run summary suggests it only where eval can score as training did,
and eval refuses in one line, before any model loads, rows whose reward it cannot rebuild."""

from __future__ import annotations

import json

from hybridrl.cli.main import main
from hybridrl.tracking.summary import build_summary

CONFIG = {"data": {"val_files": "v.jsonl", "max_response_length": 4}}


def _run(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "critic/score/mean": 0.5, "timing_s/step": 1.0}) + "\n")
    return tmp_path


def test_no_eval_is_suggested_for_a_reward_function_object(tmp_path):
    run, ck = _run(tmp_path), tmp_path / "ck"
    assert build_summary(run, CONFIG, 1, 1, 1.0, ck)["commands"]["eval"] == (
        f"hybridrl eval --model {ck} --data v.jsonl --max-response-length 4"
    )
    commands = build_summary(run, CONFIG, 1, 1, 1.0, ck, reward_object=True)["commands"]
    assert list(commands) == ["report", "export"]


def test_the_suggested_eval_names_a_custom_reward_file_and_none_for_a_service(tmp_path):
    run, ck = _run(tmp_path), tmp_path / "ck"
    custom = {**CONFIG, "custom_reward_function": {"path": "my reward.py", "name": "score"}}
    assert build_summary(run, custom, 1, 1, 1.0, ck)["commands"]["eval"].endswith(
        "--max-response-length 4 --reward-path 'my reward.py' --reward-name score"
    )
    remote = {**CONFIG, "custom_reward_function": {"remote": {"url": "http://scorer"}}}
    assert "eval" not in build_summary(run, remote, 1, 1, 1.0, ck)["commands"]


def test_eval_refuses_rows_without_a_builtin_scorer_before_loading_the_model(tmp_path, capsys):
    data = tmp_path / "val.jsonl"
    rows = [{"prompt": "1+1=", "data_source": "reward_fn", "reward_model": {"ground_truth": "2"}}]
    rows.append({"prompt": "2+2=", "data_source": "arith", "reward_model": {"ground_truth": "4"}})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", "--model", str(tmp_path / "no-model"), "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"hybridrl: error: --data {data}: no built-in scorer for data_source 'reward_fn'"
    )
    assert "pass the reward function with --reward-path FILE --reward-name NAME" in err
    # with --reward-path the file scores every row: the check is not made (the model's absence is the next error)
    assert main(["eval", "--model", str(tmp_path / "no-model"), "--data", str(data), "--reward-path", "r.py"]) == 2
    assert "no built-in scorer" not in capsys.readouterr().err
