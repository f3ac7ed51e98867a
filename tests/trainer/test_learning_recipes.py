"""benchmarks/learning_table.py's recipes (the learning table, docs/learning.md): each row's config loads and
validates exactly as benchmarks/learning_table.sh runs it, each differs from the GRPO row only in what
names the row, the off-policy modes place the roles as benchmarks/scaling.sh does, and bad input stops
the script with one line."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from hybridrl.config import load_config, plan_batches, to_dict

ROOT = Path(__file__).resolve().parents[2]
TOOL = str(ROOT / "configs" / "tools" / "python.yaml")
REWARD = {"format_score": 0.1, "format_needs_work": True, "flexible_score": 0.2}


sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import each other from there
import learning_table as LT  # noqa: E402


def _model(tmp_path: Path, model_type: str) -> str:
    d = tmp_path / model_type
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"model_type": model_type}))
    return str(d)


def _config(name: str, model: str = "/m", modes: list[str] | None = None):
    args = LT.train_args(name, model, "/d", "/r", 540.0, TOOL, modes or [])
    return load_config(ROOT / args[0], args[1:]), args


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


@pytest.mark.parametrize("name", list(LT.RECIPES))
def test_every_recipe_validates_with_the_run_settings_of_the_table(name, tmp_path):
    model = _model(tmp_path, "llama" if name == "smollm2_grpo" else "qwen2")
    cfg, args = _config(name, model)
    assert args[0] == LT.RECIPES[name].config and (ROOT / args[0]).is_file()
    assert plan_batches(cfg).actor.grad_accum >= 1
    t = cfg.trainer
    assert (t.max_wall_time_s, t.save_freq, t.resume_mode, t.default_local_dir, t.mode) == (540.0, -1, "disable", "/r", "sync")
    assert cfg.actor_rollout_ref.model.path == model and cfg.data.train_files == "/d/train.parquet"
    assert cfg.data.val_files in (None, [])
    assert cfg.custom_reward_function.reward_kwargs == REWARD  # every row learns with the GSM8K recipe's reward
    assert cfg.actor_rollout_ref.rollout.multi_turn.enable == (name == "tool")


# What each row changes against the GRPO row (configs/gsm8k_grpo.yaml + the recipe's overrides): the
# table compares these and nothing else.
DIFFERS = {
    "dapo": {
        "actor_rollout_ref.actor.clip_ratio_c": 10.0,
        "actor_rollout_ref.actor.clip_ratio_high": 0.28,
        "actor_rollout_ref.actor.use_kl_loss": False,
        "algorithm.filter_groups.enable": True,
        "algorithm.filter_groups.max_num_gen_batches": 10,
        "algorithm.filter_groups.metric": "acc",
        "data.gen_batch_size": 48,
        "reward_model.overlong_buffer.enable": True,
        "reward_model.overlong_buffer.len": 128,
        "reward_model.reward_manager": "dapo",
    },
    "grpo_lora": {
        "actor_rollout_ref.actor.optim.lr": 2e-5,
        "actor_rollout_ref.model.lora_alpha": 32,
        "actor_rollout_ref.model.lora_rank": 32,
    },
    "rloo": {
        "algorithm.adv_estimator": "rloo",
        "actor_rollout_ref.actor.use_kl_loss": False,
        "algorithm.use_kl_in_reward": True,
        "actor_rollout_ref.actor.reuse_on_policy_log_prob": False,  # the KL in the reward reads pi_old first
    },
    "notool": {"actor_rollout_ref.rollout.temperature": 0.7, "data.max_response_length": 1024, "trainer.test_freq": 20},
    "smollm2_grpo": {},
    "ppo": {
        "algorithm.adv_estimator": "gae",
        "data.train_batch_size": 256,
        "actor_rollout_ref.rollout.n": 1,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 64,
        "critic.ppo_mini_batch_size": 64,
        "actor_rollout_ref.actor.optim.lr": 1e-6,
        "actor_rollout_ref.actor.use_kl_loss": False,
        "algorithm.use_kl_in_reward": True,
        "actor_rollout_ref.actor.reuse_on_policy_log_prob": False,
    },
}


@pytest.mark.parametrize("name", list(DIFFERS))
def test_each_row_differs_from_the_grpo_row_only_in_what_names_it(name, tmp_path):
    model = _model(tmp_path, "llama")  # the smollm2 row checks its model's architecture
    grpo = _flat(to_dict(_config("grpo", model)[0]))
    other = _flat(to_dict(_config(name, model)[0]))
    changed = {k: other.get(k) for k in set(grpo) | set(other) if grpo.get(k) != other.get(k)}
    changed.pop("trainer.experiment_name")
    assert changed == DIFFERS[name]
    if name == "ppo":
        assert other["critic.optim.lr"] == 1e-5 and grpo["data.max_response_length"] == 512


def test_the_tool_row_is_its_no_tool_twin_plus_the_tool():
    tool, notool = _flat(to_dict(_config("tool")[0])), _flat(to_dict(_config("notool")[0]))
    changed = {k for k in set(tool) | set(notool) if tool.get(k) != notool.get(k)}
    assert changed == {
        "trainer.experiment_name",
        "actor_rollout_ref.rollout.multi_turn.enable",
        "actor_rollout_ref.rollout.multi_turn.format",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path",
        "actor_rollout_ref.rollout.multi_turn.tool_timeout_s",
    }
    assert tool["actor_rollout_ref.rollout.multi_turn.tool_config_path"] == TOOL


@pytest.mark.parametrize(
    ("mode", "gpus", "pool", "partial", "expected"),
    [
        ("sync", 1, None, None, []),
        ("sync", 4, None, None, ["trainer.n_gpus_per_node=4"]),
        ("one_step_off", 1, None, None, ["trainer.mode=one_step_off"]),  # one GPU: colocated
        (
            "one_step_off",
            2,
            None,
            None,
            [
                "trainer.n_gpus_per_node=2",
                "trainer.mode=one_step_off",
                "resource_pool.actor_rollout_ref=1",
                "resource_pool.rollout=1",
            ],
        ),
        ("async", 1, None, None, ["trainer.mode=async", "async_training.max_staleness=2"]),  # no pool: no partial rollouts
        (
            "async",
            4,
            None,
            None,
            [
                "trainer.n_gpus_per_node=4",
                "trainer.mode=async",
                "async_training.max_staleness=2",
                "resource_pool.actor_rollout_ref=2",
                "resource_pool.rollout=2",
                "async_training.partial_rollout=true",
            ],
        ),
        (
            "async",
            4,
            2,
            False,
            [
                "trainer.n_gpus_per_node=4",
                "trainer.mode=async",
                "async_training.max_staleness=2",
                "resource_pool.actor_rollout_ref=2",
                "resource_pool.rollout=2",
            ],
        ),  # PARTIAL=0; fmt: skip
    ],
)
def test_modes_place_the_roles_and_validate(mode, gpus, pool, partial, expected):
    modes = LT.mode_overrides(mode, gpus, pool, partial, 2)
    assert modes == expected
    cfg, _ = _config("grpo", modes=modes)
    assert cfg.trainer.mode == mode and cfg.trainer.n_gpus_per_node == gpus
    assert cfg.async_training.partial_rollout == ("async_training.partial_rollout=true" in modes)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: LT.mode_overrides("fast", 1, None, None, 2), "MODE=fast: one of sync, one_step_off, async"),
        (lambda: LT.mode_overrides("async", 4, 4, None, 2), "POOL=4 must leave at least one of GPUS=4 to the actor"),
        (lambda: LT.mode_overrides("async", 1, None, True, 2), "PARTIAL=1 needs a rollout pool of its own"),
        (lambda: LT.mode_overrides("sync", 2, 1, None, 2), "POOL=1 with MODE=sync"),
        (lambda: LT.recipe("reinforce"), "unknown recipe 'reinforce': one of grpo, ppo, dapo"),
    ],
)
def test_bad_settings_stop_with_one_line(call, message):
    with pytest.raises(SystemExit, match=message):
        call()


def test_the_smollm2_row_refuses_another_architecture(tmp_path):
    with pytest.raises(SystemExit, match="has model_type 'qwen2'; for a Qwen model use recipe grpo"):
        LT.train_args("smollm2_grpo", _model(tmp_path, "qwen2"), "/d", "/r", 540.0, TOOL, [])
    with pytest.raises(SystemExit, match="config.json does not exist"):
        LT.train_args("smollm2_grpo", str(tmp_path / "nowhere"), "/d", "/r", 540.0, TOOL, [])


def test_eval_and_data_flags_follow_the_recipe():
    assert LT.eval_args("grpo", TOOL) == ["--max-response-length", "512", "--batch-size", "512"]
    assert LT.eval_args("notool", TOOL) == ["--max-response-length", "1024", "--batch-size", "512"]
    assert LT.eval_args("tool", TOOL) == ["--max-response-length", "1024", "--batch-size", "512", "--tool-config", TOOL,
                                          "--multi-turn-format", "code", "--max-assistant-turns", "3"]  # fmt: skip
    assert LT.data_args("tool") == ["--tools", "python"] and LT.data_args("notool") == []


def _script(*args, env=None):
    return subprocess.run(
        ["bash", "benchmarks/learning_table.sh", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_script_refuses_bad_stages_recipes_and_mixed_rows(tmp_path):
    proc = _script("evaluate", "grpo", "m", "g", str(tmp_path / "a"))
    assert proc.returncode == 2 and "unknown stage evaluate (before|train|after|row)" in proc.stderr
    proc = _script("train", "grpo2", "m", "g", str(tmp_path / "a"))
    assert proc.returncode != 0 and "unknown recipe 'grpo2'" in proc.stderr
    proc = _script("after", "grpo", "m", "g", str(tmp_path / "a"))
    assert proc.returncode == 2 and "checkpoints/latest does not exist: run the train stage" in proc.stderr
    proc = _script("after", "ppo", "m", "g", str(tmp_path / "a"))  # a's recipe is grpo now
    assert proc.returncode == 2 and "holds the row of recipe grpo, not ppo" in proc.stderr
    proc = _script("train", "grpo", "m", str(tmp_path / "nogsm8k"), str(tmp_path / "b"))
    assert proc.returncode == 2 and "nogsm8k/train.jsonl does not exist" in proc.stderr
    proc = _script("train", "grpo", "m", "g", str(tmp_path / "c"), env={"MODE": "async", "GPUS": "1", "PARTIAL": "1"})
    assert proc.returncode != 0 and "PARTIAL=1 needs a rollout pool" in proc.stderr


def test_the_recipe_list_names_every_config():
    out = subprocess.run([sys.executable, "benchmarks/learning_table.py", "list"], cwd=ROOT, capture_output=True, text=True)
    rows = [line for line in out.stdout.splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == list(LT.RECIPES)
    doc = (ROOT / "docs" / "learning.md").read_text()
    assert all(f"`{name}`" in doc and LT.RECIPES[name].config in doc for name in LT.RECIPES)


def test_the_row_stage_runs_from_a_checkout_where_hybridrl_is_not_installed(tmp_path):
    # The GPU machine runs the scripts from a copy of the repository, hybridrl not installed: `python -S`
    # skips the site directory's .pth files (the editable install's hook) while PYTHONPATH still
    # lends yaml and torch. The row stage imports hybridrl lazily, for the eval's answers.
    out = tmp_path / "row"
    out.mkdir()
    (out / "model_dir").write_text("/models/Qwen2.5-Coder-0.5B-Instruct\n")
    summary = {"openai/gsm8k": {"n": 2, "accuracy": 0.5, "correct": 1, "flexible_accuracy": 0.5}}
    (out / "eval_before.json").write_text(json.dumps(summary))
    answers = [("so 4 + 3 = 7\n#### 7", "7"), ("the answer is 9", "8")]
    (out / "eval_before.jsonl").write_text("".join(json.dumps({"response": r, "ground_truth": g}) + "\n" for r, g in answers))
    lend = os.pathsep.join(site.getsitepackages())
    proc = subprocess.run(
        [sys.executable, "-S", str(ROOT / "benchmarks" / "learning_table.py"), "row", "grpo", str(out)],
        cwd=tmp_path,  # neither the repository nor benchmarks/ on the path by accident
        env={**os.environ, "PYTHONPATH": lend},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads((out / "results" / "row.json").read_text())
    assert (row["strict"], row["flexible"], row["format_rate"], row["n_eval"]) == (0.5, 0.5, 0.5, 2)
    assert row["model"] == "Qwen2.5-Coder-0.5B-Instruct"
