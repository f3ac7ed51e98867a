"""Loading: YAML + overrides, typing, unknown keys, errors collected, round trip."""

import pytest

from hybridrl.config import (
    Config,
    ConfigError,
    config_from_dict,
    load_config,
    resolve,
    save_config,
    to_dict,
)

REQUIRED = ["actor_rollout_ref.model.path=models/tiny", "data.train_files=data/train.parquet"]


def load(*overrides, path=None):
    return load_config(path, [*REQUIRED, *overrides])


def errors_of(*overrides, path=None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(*overrides, path=path)
    return info.value.errors


def test_defaults_and_resolved_values():
    cfg = load()
    actor = cfg.actor_rollout_ref.actor
    assert cfg.data.train_batch_size == 256
    assert actor.clip_ratio_low == actor.clip_ratio_high == 0.2
    assert cfg.critic.optim.lr == 1e-5 and actor.optim.lr == 1e-6
    assert cfg.critic.ppo_mini_batch_size == actor.ppo_mini_batch_size == 64
    assert cfg.critic.ppo_epochs == 1
    assert cfg.critic.model.path == "models/tiny" == cfg.actor_rollout_ref.model.tokenizer_path
    assert cfg.trainer.default_local_dir == "runs/hybridrl/run"
    assert cfg.critic_enabled


def test_explicit_values_are_not_overwritten_by_resolution():
    cfg = load(
        "actor_rollout_ref.actor.clip_ratio=0.3",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "critic.ppo_epochs=2",
        "actor_rollout_ref.actor.ppo_epochs=4",
    )
    actor = cfg.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.3, 0.28)
    assert (cfg.critic.ppo_epochs, actor.ppo_epochs) == (2, 4)


def test_override_values_are_parsed_as_yaml():
    cfg = load(
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "critic.optim.lr=3e-5",
        "trainer.logger=[console,wandb]",
        "data.val_batch_size=null",
        "actor_rollout_ref.model.trust_remote_code=true",
        "+trainer.total_training_steps=10",
        "++algorithm.gamma=1",  # int -> float
        "actor_rollout_ref.model.override_config={rope_theta: 1e6}",
        "actor_rollout_ref.model.override_config.attention_dropout=0.1",
        "trainer.experiment_name=007",  # stays the string it was written as
        "data.train_files=[a.parquet, b.jsonl]",
        "data.prompt_key=question=text",  # only the first '=' separates key and value
    )
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert cfg.critic.optim.lr == 3e-5
    assert cfg.trainer.logger == ["console", "wandb"]
    assert cfg.data.val_batch_size is None
    assert cfg.actor_rollout_ref.model.trust_remote_code is True
    assert cfg.trainer.total_training_steps == 10
    assert cfg.algorithm.gamma == 1.0 and isinstance(cfg.algorithm.gamma, float)
    assert cfg.actor_rollout_ref.model.override_config == {"rope_theta": 1e6, "attention_dropout": 0.1}
    assert cfg.trainer.experiment_name == "007"
    assert cfg.data.train_files == ["a.parquet", "b.jsonl"]
    assert cfg.data.prompt_key == "question=text"


def test_yaml_file_is_partial_and_overrides_win(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "data:\n  train_batch_size: 128\n  max_prompt_length: 256\n"
        "actor_rollout_ref:\n  actor:\n    optim:\n      lr: 1e-6\n      betas: [0.9, 0.95]\n"
        "critic:\n"  # an empty section keeps its defaults
    )
    cfg = load("data.train_batch_size=64", path=path)
    assert cfg.data.train_batch_size == 64
    assert cfg.data.max_prompt_length == 256
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert cfg.actor_rollout_ref.actor.optim.betas == [0.9, 0.95]
    assert cfg.critic.optim.lr == 1e-5


def test_a_mapping_override_merges_into_the_section():
    cfg = load("actor_rollout_ref.actor.optim={lr: 2e-6}")
    assert cfg.actor_rollout_ref.actor.optim.lr == 2e-6
    assert cfg.actor_rollout_ref.actor.optim.weight_decay == 0.01


@pytest.mark.parametrize(
    "override, expected",
    [
        ("data.train_batch_size=many", "data.train_batch_size: expected int, got 'many'"),
        ("data.train_batch_size=12.5", "data.train_batch_size: expected int, got 12.5"),
        ("data.shuffle=1", "data.shuffle: expected bool, got 1"),
        ("actor_rollout_ref.actor.optim.lr=fast", "actor_rollout_ref.actor.optim.lr: expected float, got 'fast'"),
        ("actor_rollout_ref.actor.optim.betas=[0.9, x]", "actor_rollout_ref.actor.optim.betas: expected list[float]"),
        ("data.val_batch_size=[1]", "data.val_batch_size: expected int | null, got [1]"),
        ("trainer.logger=5", "trainer.logger: expected list[str], got 5"),
        ("data=5", "data: expected a section of keys (DataConfig), got 5"),
        ("actor_rollout_ref.model.override_config=3", "override_config: expected dict, got 3"),
    ],
)
def test_type_errors_name_the_key_the_type_and_the_value(override, expected):
    assert any(expected in e for e in errors_of(override)), errors_of(override)


def test_yaml_number_in_a_text_key_suggests_quoting(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  experiment_name: 2024\n")
    (error,) = errors_of(path=path)
    assert "trainer.experiment_name: expected str, got 2024; quote it in YAML: '2024'" == error


@pytest.mark.parametrize(
    "key, suggestion",
    [
        ("actor_rollout_ref.actor.lr", "actor_rollout_ref.actor.optim.lr"),
        ("actor_rollout_ref.rollout.temprature", "actor_rollout_ref.rollout.temperature"),
        ("actor_rollout_ref.actr.ppo_epochs", "actor_rollout_ref.actor.ppo_epochs"),
        ("data.train_batch", "data.train_batch_size"),
        ("trainer.n_gpus", "trainer.n_gpus_per_node"),
        ("actor_rollout_ref.actor.optim.lr_warmup_step_ratio", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio"),
        ("algorithm.kl_ctrl.kl_coeff", "algorithm.kl_ctrl.kl_coef"),
    ],
)
def test_unknown_key_suggests_the_nearest_valid_key(key, suggestion):
    (error,) = errors_of(f"{key}=1")
    assert error.startswith(f"unknown key '{key}'; did you mean '{suggestion}'?"), error


def test_unknown_key_without_a_near_match_points_to_the_reference():
    (error,) = errors_of("zzz=1")
    assert error == "unknown key 'zzz' (all keys: docs/config.md, or `hybridrl explain`)"


def test_all_errors_are_collected_into_one_exception():
    errors = errors_of(
        "not-an-override",
        "actor_rollout_ref.actor.lr=1e-6",
        "data.train_batch_size=x",
        "algorithm.adv_estimator=gpro",
        "actor_rollout_ref.actor.clip_ratio_c=0.5",
        "data.train_batch_size.deeper=1",
    )
    assert len(errors) == 6, errors
    assert "not of the form key=value" in errors[0]
    assert "data.train_batch_size holds a value, not a section of keys" in errors[1]
    with pytest.raises(ValueError, match=r"6 problem\(s\) in the config"):
        load(
            "not-an-override",
            "actor_rollout_ref.actor.lr=1e-6",
            "data.train_batch_size=x",
            "algorithm.adv_estimator=gpro",
            "actor_rollout_ref.actor.clip_ratio_c=0.5",
            "data.train_batch_size.deeper=1",
        )


def test_a_rejected_value_does_not_also_produce_misleading_validation_errors():
    # train_batch_size keeps its default when its value is rejected; no batch-plan message
    # about that default should appear.
    errors = errors_of("data.train_batch_size=x", "actor_rollout_ref.actor.ppo_mini_batch_size=48")
    assert errors == ["data.train_batch_size: expected int, got 'x'"]


def test_missing_file_and_non_mapping_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(path)
    path.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_check_false_skips_validation_but_not_typing():
    cfg = load_config(None, check=False)  # model.path is empty, yet no error
    assert cfg.actor_rollout_ref.model.path == ""
    with pytest.raises(ConfigError):
        load_config(None, ["data.shuffle=maybe"], check=False)


def test_save_and_load_round_trip(tmp_path):
    cfg = load(
        "actor_rollout_ref.actor.optim.lr=1e-7",
        "trainer.logger=[console]",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.model.override_config={rope_theta: 10000.0}",
        "data.train_files=[a.parquet, b.parquet]",
    )
    path = tmp_path / "out" / "config.yaml"
    save_config(cfg, path)
    again = load_config(path)
    assert again == cfg
    assert to_dict(again) == to_dict(cfg)
    text = path.read_text()
    assert "clip_ratio_low: 0.2" in text and "default_local_dir: runs/hybridrl/run" in text


def test_save_resolves_a_hand_built_config(tmp_path):
    cfg = Config()
    cfg.actor_rollout_ref.model.path = "m"
    cfg.data.train_files = "t.parquet"
    save_config(cfg, tmp_path / "c.yaml")
    assert cfg.actor_rollout_ref.actor.clip_ratio_low is None  # the caller's object is untouched
    assert load_config(tmp_path / "c.yaml") == resolve(cfg)


def test_config_from_dict():
    cfg = config_from_dict(to_dict(load()), ["data.train_batch_size=128"])
    assert cfg.data.train_batch_size == 128
    with pytest.raises(ConfigError, match="must be a mapping"):
        config_from_dict([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown key 'datta.train_batch_size'; did you mean 'data.train_batch_size'"):
        config_from_dict({"datta": {"train_batch_size": 1}})
    with pytest.raises(ConfigError, match="unknown key 'datta.x'; did you mean 'data'"):
        config_from_dict({"datta": {"x": 1}})
