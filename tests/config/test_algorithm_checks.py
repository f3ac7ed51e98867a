"""Checks of the algorithm keys (DAPO, rollout correction, reward manager), each with its suggested fix."""

import pytest

from hybridrl.config import ConfigError, find_problems, load_config

REQUIRED = ["actor_rollout_ref.model.path=models/tiny", "data.train_files=data/train.parquet"]
RC = "algorithm.rollout_correction"


def load(*overrides, check=True):
    return load_config(None, [*REQUIRED, *overrides], check=check)


@pytest.mark.parametrize(
    "overrides, expected, fix",
    [
        (
            ["algorithm.adv_estimator=grpo_passk", "actor_rollout_ref.rollout.n=1"],
            "grpo_passk rewards the best of a prompt's samples",
            {"actor_rollout_ref.rollout.n": 4},
        ),
        (["algorithm.filter_groups.enable=true"], "keeps prompts whose samples disagree", {"actor_rollout_ref.rollout.n": 8}),
        (["data.gen_batch_size=0"], "data.gen_batch_size=0 must be >= 1", {"data.gen_batch_size": 256}),
        (["trainer.critic_warmup=-1"], "trainer.critic_warmup=-1 must be >= 0", {"trainer.critic_warmup": 0}),
        (["reward_model.reward_manager=batch"], "set custom_reward_function.path", {"reward_model.reward_manager": "naive"}),
        (
            ["reward_model.reward_manager=prm"],
            "is not one of naive, dapo, batch, prime",
            {"reward_model.reward_manager": "naive"},
        ),
        (
            ["reward_model.overlong_buffer.enable=true", "data.max_response_length=64"],
            "overlong_buffer.len=0 must be in [1, data.max_response_length=64]",
            {"reward_model.overlong_buffer.len": 16},
        ),
        ([f"{RC}.rollout_is=geometric"], "is not one of token, sequence", {f"{RC}.rollout_is": "token"}),
        ([f"{RC}.rollout_rs=token_k1"], "rollout_rs_threshold is required", None),
        (
            [f"{RC}.rollout_rs=seq_mean_k2", f"{RC}.rollout_rs_threshold='1_2'"],
            "threshold '1_2' for seq_mean_k2 must be a number",
            None,
        ),
        ([f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=0.5_2"], "YAML reads 0.5_2 as the number 0.52", None),
        ([f"{RC}.bypass_mode=true", f"{RC}.rollout_is=token"], "no mismatch left to correct", {f"{RC}.bypass_mode": False}),
    ],
)
def test_problem_says_what_to_change(overrides, expected, fix):
    with pytest.raises(ConfigError) as e:
        load(*overrides)
    (message,) = e.value.errors
    assert expected in message
    (problem,) = find_problems(load(*overrides, check=False))
    assert problem.fix == fix
    if fix:
        load(*overrides, *(f"{k}={v}" for k, v in fix.items()))  # the fix works


def test_the_dapo_recipe_overlong_buffer_cfg_form_configures_the_reward_manager():
    kw = "custom_reward_function.reward_kwargs"
    cfg = load(
        "data.max_response_length=64",
        f"{kw}.overlong_buffer_cfg={{enable: true, len: 16, penalty_factor: 0.5}}",
        f"{kw}.max_resp_len=64",
    )
    ob = cfg.reward_model.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor) == (True, 16, 0.5)
    assert cfg.custom_reward_function.reward_kwargs == {}  # not passed on to the scorer
    with pytest.raises(ConfigError, match="reward_kwargs.max_resp_len=32 differs from data.max_response_length=64"):
        load("data.max_response_length=64", f"{kw}.max_resp_len=32")


def test_valid_rollout_correction_and_dapo_settings_load():
    cfg = load(
        f"{RC}.rollout_is=sequence",
        f"{RC}.rollout_rs=token_k1,seq_max_k2",
        f"{RC}.rollout_rs_threshold='0.5_2,3'",
        "algorithm.filter_groups.enable=true",
        "actor_rollout_ref.rollout.n=4",
        "data.gen_batch_size=512",
        "data.truncation=middle",
        "data.filter_overlong_prompts=true",
        "trainer.critic_warmup=3",
    )
    assert cfg.algorithm.rollout_correction.rollout_rs_threshold == "0.5_2,3"
