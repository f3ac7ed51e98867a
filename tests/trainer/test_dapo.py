"""DAPO on the quickstart task (CPU, tiny model): dynamic sampling, overlong shaping, the dapo manager,
critic warm-up and rollout correction through the real loop."""

import json
import textwrap

import numpy as np
import pytest

from hybridrl.config import config_from_dict
from hybridrl.data import keys as K
from hybridrl.trainer.dynamic_sampling import DynamicSamplingError
from hybridrl.trainer.ppo import PPOTrainer

# The tiny model rarely gets a sum right, so the reward is the response length's parity: it varies
# within most groups, but not all, and needs no training to do so.
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(len(solution_str) % 2), "parity": float(len(solution_str) % 2)}
"""
CONSTANT = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"


def dapo_config(model, data, tmp_path, reward, **algorithm):
    path = tmp_path / "reward.py"
    path.write_text(textwrap.dedent(reward))
    return config_from_dict(
        {
            "data": {
                "train_files": data["train"],
                "train_batch_size": 4,
                "gen_batch_size": 3,
                "max_prompt_length": 8,
                "max_response_length": 4,
            },
            "actor_rollout_ref": {
                "model": {"path": model},
                "actor": {"ppo_mini_batch_size": 2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "optim": {"lr": 1e-3}},
                "rollout": {"n": 4},
            },
            "algorithm": {"adv_estimator": "grpo", **algorithm},
            "custom_reward_function": {"path": str(path)},
            "reward_model": {
                "reward_manager": "dapo",
                "overlong_buffer": {"enable": True, "len": 2, "penalty_factor": 0.5, "log": True},
            },
            "trainer": {
                "device": "cpu",
                "total_training_steps": 2,
                "default_local_dir": str(tmp_path / "run"),
                "logger": ["jsonl"],
                "val_before_train": False,
            },
        }
    )


def test_dapo_keeps_generating_until_enough_groups_vary(tiny_model_with_weights, arith_data, tmp_path):
    cfg = dapo_config(
        tiny_model_with_weights,
        arith_data,
        tmp_path,
        REWARD,
        filter_groups={"enable": True, "metric": "parity", "max_num_gen_batches": 20},
    )
    trainer = PPOTrainer(cfg)
    seen, rounds_scored = [], []
    real = trainer.compute_advantages
    trainer.compute_advantages = lambda batch: (seen.append(batch), real(batch))[1]
    score = trainer.reward.score
    trainer.reward.score = lambda batch: rounds_scored.append((None, score(batch))) or rounds_scored[-1][1]
    trainer.fit()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if m.get("training/global_step")]
    assert len(steps) == 2
    for m, batch in zip(steps, seen):
        rounds = m["train/num_gen_batches"]
        assert rounds >= 2  # 3 prompts per round cannot fill a batch of 4
        assert m["train/num_groups_generated"] == 3 * rounds
        assert 4 <= m["train/num_groups_kept"] <= m["train/num_groups_generated"]
        # exactly train_batch_size groups of n, each with responses of both parities
        assert len(batch) == 16
        parity = np.array([len(t) % 2 for t in batch[K.RESPONSE_TEXT]])  # the reward's metric
        uids = list(batch[K.UID])
        for g in range(4):
            assert uids[4 * g : 4 * g + 4] == [uids[4 * g]] * 4
            assert len(set(parity[4 * g : 4 * g + 4])) == 2
        # the score is the parity plus the overlong penalty: 0 up to 2 tokens, -0.25 at 3, -0.5 at 4
        lengths = batch[K.RESPONSE_MASK].sum(-1).numpy()
        penalty = np.minimum(-(lengths - 2) / 2 * 0.5, 0)
        np.testing.assert_allclose(batch[K.TOKEN_LEVEL_SCORES].sum(-1).numpy(), parity + penalty, atol=1e-6)
        assert m["reward/overlong_reward/mean"] <= 0
        # dynamic sampling keeps only prompts that teach something: none of the kept groups scored alike
        assert m["critic/groups/no_signal_frac"] == 0.0 and m["critic/groups/all_top_frac"] == 0.0
        # every generated group is counted before the filter: the dropped ones are those without signal
        dropped = 1 - m["train/num_groups_kept"] / m["train/num_groups_generated"]
        assert m["train/generated/no_signal_frac"] == pytest.approx(dropped, abs=1e-12)
        assert 0.0 <= m["train/generated/all_top_frac"] <= m["train/generated/no_signal_frac"]
    # the mean score over every response of each step's rounds (the rounds come in order, step by step)
    done = 0
    for m in steps:
        rounds = [s for _, s in rounds_scored[done : done + m["train/num_gen_batches"]]]
        done += len(rounds)
        expect = float(np.concatenate([s.values.numpy() for s in rounds]).astype(np.float64).mean())
        assert m["train/generated/score_mean"] == pytest.approx(expect, abs=1e-6)
        # the reward/* metrics are the last round's, every response of it (docs/algorithms.md)
        reward_keys = [k for k in rounds[-1].metrics if k.startswith("reward/") and not k.endswith("_s")]
        assert "reward/overlong_reward/mean" in reward_keys
        assert {k: m[k] for k in reward_keys} == pytest.approx({k: rounds[-1].metrics[k] for k in reward_keys})
    assert done == len(rounds_scored)


def test_dapo_gives_up_with_a_clear_error_when_no_group_varies(tiny_model_with_weights, arith_data, tmp_path):
    cfg = dapo_config(
        tiny_model_with_weights,
        arith_data,
        tmp_path,
        CONSTANT,
        filter_groups={"enable": True, "metric": "acc", "max_num_gen_batches": 2},
    )
    with pytest.raises(
        DynamicSamplingError, match="after 2 generation rounds \\(6 prompts\\) only 0 prompts had responses whose acc differed"
    ):
        PPOTrainer(cfg).fit()


def test_critic_warmup_and_rollout_correction_run_through_the_loop(tiny_model_with_weights, arith_data, tmp_path):
    cfg = dapo_config(
        tiny_model_with_weights,
        arith_data,
        tmp_path,
        REWARD,
        adv_estimator="gae",
        rollout_correction={"rollout_is": "token", "rollout_rs": "token_k1", "rollout_rs_threshold": 10.0},
    )
    cfg.trainer.critic_warmup = 2
    trainer = PPOTrainer(cfg)
    before = {n: p.detach().clone() for n, p in trainer.run.actor.worker.model.named_parameters()}
    trainer.fit()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first, second = [m for m in lines if m.get("training/global_step")]
    assert "critic/vf_loss" in first and "actor/pg_loss" not in first  # step 1 < critic_warmup: critic only
    assert "actor/pg_loss" in second
    for m in (first, second):
        assert m["rollout_corr/rollout_is_mean"] > 0 and "rollout_corr/kl" in m
        assert m["rollout_corr/rollout_rs_masked_fraction"] == 0.0  # ratios within [0.1, 10]
    after = dict(trainer.run.actor.worker.model.named_parameters())
    assert any(not before[n].equal(p) for n, p in after.items())  # the actor updated once, at step 2
