"""An advantage estimator declares the extra inputs it needs; the RL loop produces them only then."""

import importlib

import pytest
import torch

from hybridrl.algorithms import ADV_ESTIMATORS, ESTIMATOR_NEEDS, compute_grpo_advantages, estimator_needs, register_adv_estimator
from hybridrl.config import ConfigError, config_from_dict
from hybridrl.data import keys as K
from hybridrl.trainer.ppo import PPOTrainer


def test_registry_records_the_needs():
    assert estimator_needs("remax") == (K.REWARD_BASELINES,)  # algorithms spell the data key's string
    assert estimator_needs("grpo") == () and estimator_needs("gae") == ()
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'; known: .*'remax'"):
        estimator_needs("nope")


@pytest.fixture
def spy_estimators():
    """Two custom estimators (GRPO underneath) that record the reward_baselines they are given."""
    seen = {}

    def make(name):
        def estimator(*, reward_baselines=None, **kw):
            seen[name] = reward_baselines
            return compute_grpo_advantages(**kw)

        return estimator

    register_adv_estimator("spy_with_baseline", needs=(K.REWARD_BASELINES,))(make("spy_with_baseline"))
    register_adv_estimator("spy_without")(make("spy_without"))
    yield seen
    for name in ("spy_with_baseline", "spy_without"):
        ADV_ESTIMATORS.pop(name), ESTIMATOR_NEEDS.pop(name)


@pytest.mark.parametrize("name", ["spy_with_baseline", "spy_without"])
def test_greedy_baselines_only_for_an_estimator_that_needs_them(
    name, spy_estimators, tiny_model_with_weights, arith_data, tmp_path, monkeypatch
):
    # A user's estimator; until config validation reads the registry, add its name to the choices.
    validate = importlib.import_module("hybridrl.config.validate")  # the module (the package exports a function of that name)
    known = validate.CHOICES.get("algorithm.adv_estimator", ())
    monkeypatch.setitem(validate.CHOICES, "algorithm.adv_estimator", (*known, name))
    cfg = config_from_dict(
        {
            "data": {"train_files": arith_data["train"], "train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {
                "model": {"path": tiny_model_with_weights},
                "actor": {"ppo_mini_batch_size": 2},
                "rollout": {"n": 3},
            },
            "algorithm": {"adv_estimator": name},
            "trainer": {
                "device": "cpu",
                "total_training_steps": 1,
                "default_local_dir": str(tmp_path),
                "logger": ["jsonl"],
                "val_before_train": False,
            },
        }
    )
    trainer = PPOTrainer(cfg)
    made = []
    real = trainer._greedy_baselines
    trainer._greedy_baselines = lambda prompts: made.append(real(prompts)) or made[-1]
    trainer.fit()
    if name == "spy_with_baseline":
        assert len(made) == 1 and made[0].shape == (12,)  # one greedy score per prompt, repeated over n = 3
        assert torch.equal(made[0].view(4, 3), made[0].view(4, 3)[:, :1].expand(4, 3))
        assert spy_estimators[name] is not None and torch.equal(spy_estimators[name], made[0])
    else:
        assert made == [] and spy_estimators[name] is None  # no greedy generation, nothing passed


def test_an_input_the_loop_cannot_produce_is_a_config_error_before_any_worker_starts(
    tiny_model_dir, arith_data, tmp_path, monkeypatch
):
    # registered for this test only (monkeypatch removes the entries again)
    monkeypatch.setitem(ADV_ESTIMATORS, "needs_the_moon", compute_grpo_advantages)
    monkeypatch.setitem(ESTIMATOR_NEEDS, "needs_the_moon", ("moon",))
    validate = importlib.import_module("hybridrl.config.validate")
    monkeypatch.setitem(validate.CHOICES, "algorithm.adv_estimator", ("needs_the_moon",))
    cfg = config_from_dict(
        {
            "data": {"train_files": arith_data["train"], "train_batch_size": 4},
            "actor_rollout_ref": {"model": {"path": tiny_model_dir}, "actor": {"ppo_mini_batch_size": 2}},
            "algorithm": {"adv_estimator": "needs_the_moon"},
            "trainer": {"device": "cpu", "default_local_dir": str(tmp_path / "run")},
        }
    )
    with pytest.raises(ConfigError, match=r"adv_estimator=needs_the_moon needs \['moon'\], .*produce \['reward_baselines'\]"):
        PPOTrainer(cfg)
    assert not (tmp_path / "run").exists()  # nothing built, nothing written
