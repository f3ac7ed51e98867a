"""resource_pool.rollout on Ray CPU workers: rollout replicas apart from the actor, kept current
over the weight channel (gloo here, NCCL on GPUs)."""

from __future__ import annotations

import pytest
from cli_helpers import metrics

from hybridrl.config import ConfigError, config_from_dict
from hybridrl.trainer.ppo import PPOTrainer
from hybridrl.trainer.supervise import fit_with_restarts


def _cfg(model_dir, data, tmp_path, rollout=1, **trainer):
    return config_from_dict(
        {
            "data": {"train_files": data["train"], "train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {
                "model": {"path": model_dir, "random_init": True},
                "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "optim": {"lr": 3e-3}},
                "rollout": {"n": 2},
            },
            "algorithm": {"adv_estimator": "grpo", "rollout_correction": {"rollout_is": "token"}},
            "resource_pool": {"actor_rollout_ref": 1, "rollout": rollout},
            "trainer": {
                "device": "cpu",
                "n_gpus_per_node": 1 + rollout,
                "logger": ["jsonl"],
                "val_before_train": False,
                "default_local_dir": str(tmp_path / "run"),
                **trainer,
            },
        }
    )


def _digits(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """A reward a random policy's samples differ in (so the policy moves every step)."""
    return sum(c.isdigit() for c in solution_str) / 4.0


def _rows(tmp_path) -> dict[int, dict]:
    return {r["step"]: r for r in metrics(tmp_path / "run")}


def test_sync_mode_pool_generates_with_the_current_weights(ray_session, tiny_model_dir, arith_data, tmp_path):
    """Every step's batch comes from the pool with the weights after the previous step's update:
    the engine's log-probs equal the trainer's recomputed ones (kl ~ 0 at every step), although
    the pool's replicas started from weights of their own and the policy moves each step. Every
    second push is verified (rollout.weight_checksum_interval=2)."""
    cfg = _cfg(tiny_model_dir, arith_data, tmp_path, total_training_steps=3)
    cfg.actor_rollout_ref.rollout.weight_checksum_interval = 2
    PPOTrainer(cfg, reward_fn=_digits).fit()
    rows = _rows(tmp_path)
    assert sorted(k for k in rows if k > 0) == [1, 2, 3]
    for s in (1, 2, 3):
        assert abs(rows[s]["rollout_corr/kl"]) < 1e-5, (s, rows[s]["rollout_corr/kl"])
        assert rows[s]["actor/grad_norm"] > 0
        assert rows[s]["rollout_pool/bytes_sent"] > 0  # the policy moved since the last send: all of it again
        assert rows[s]["rollout_pool/weights_version"] == s
    # push s carries the weights of step s: push 2's load was checked against the trainer's (and matched)
    assert [rows[s]["rollout_pool/checksums_verified"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    assert rows[1]["rollout_pool/checksum_ms"] == 0.0 < rows[2]["rollout_pool/checksum_ms"]
    assert rows[2]["rollout_pool/sender_checksum_ms"] > 0.0


def test_one_step_off_pool_overlaps_and_corrects(ray_session, tiny_model_dir, arith_data, tmp_path):
    """one_step_off with a pool: step 1 trains on a batch of the initial weights (kl ~ 0), the later
    ones on a batch one update old, which the engine's log-probs show (kl clearly non-zero: the
    same check as above sees a single update of staleness) and the recorded versions say."""
    cfg = _cfg(tiny_model_dir, arith_data, tmp_path, total_training_steps=4, mode="one_step_off")
    PPOTrainer(cfg, reward_fn=_digits).fit()
    rows = _rows(tmp_path)
    assert [rows[s]["async/staleness_max"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 1.0, 1.0]
    assert abs(rows[1]["rollout_corr/kl"]) < 1e-5
    for s in (2, 3, 4):
        assert abs(rows[s]["rollout_corr/kl"]) > 1e-4, (s, rows[s]["rollout_corr/kl"])
        assert rows[s]["async/idle_s/rollout"] >= 0.0
    # the batch trained at step s was generated with the weights after s - 2 updates (version 1 = initial)
    assert [rows[s]["rollout_pool/weights_version"] for s in (1, 2, 3, 4)] == [1.0, 1.0, 2.0, 3.0]
    # overlap, counted rather than timed: while each step trained, the next step's batch was already
    # submitted to the pool (one queued batch at steps 1-3, none at the last step), and the weights it
    # was generated with (above) are those from before the update it overlapped
    assert [rows[s]["async/queued_batches"] for s in (1, 2, 3, 4)] == [1.0, 1.0, 1.0, 0.0]


def test_killed_rollout_pool_rank_recovers_with_max_restarts(ray_session, tiny_model_dir, arith_data, tmp_path, monkeypatch):
    """A rollout-pool process killed in its 4th generate (step 3, after the step-2 checkpoint): the
    run restarts every pool, reopens the weight channel and resumes from the checkpoint."""
    cfg = _cfg(tiny_model_dir, arith_data, tmp_path, total_training_steps=4, mode="one_step_off", save_freq=2, max_restarts=1)
    flag = tmp_path / "killed"
    monkeypatch.setenv("HYBRIDRL_KILL_WORKER", f"generate:0:4:{flag}")
    fit_with_restarts(cfg, lambda c: PPOTrainer(c, reward_fn=_digits))
    assert flag.exists()
    rows = _rows(tmp_path)
    assert sorted(k for k in rows if k > 0) == [1, 2, 3, 4]
    assert [rows[s]["async/staleness_max"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 0.0, 1.0]
    assert abs(rows[3]["rollout_corr/kl"]) < 1e-5  # the restarted pool got the checkpoint's weights


def test_rollout_pool_config_errors(tiny_model_dir, arith_data, tmp_path):
    cfg = _cfg(tiny_model_dir, arith_data, tmp_path)
    cfg.resource_pool.actor_rollout_ref = None
    with pytest.raises(ConfigError, match="resource_pool.actor_rollout_ref must say"):
        PPOTrainer(cfg)


def test_partial_rollouts_take_new_weights_mid_generation(ray_session, tiny_model_dir, arith_data, tmp_path):
    """async_training.partial_rollout on a pool whose generation outlasts the update (2 sequences at a
    time, 24 tokens): the weights sent at a step's start reach the pool while it still generates the
    batch submitted a step earlier; it loads them between two decode steps and goes on, each token
    tagged with the weights that sampled it. Every send is still received exactly once (the run
    would hang otherwise) and the staleness bound holds."""
    cfg = _cfg(tiny_model_dir, arith_data, tmp_path, total_training_steps=5, mode="one_step_off")
    cfg.async_training.partial_rollout = True
    r = cfg.actor_rollout_ref.rollout
    r.name, r.max_num_seqs, r.enforce_eager = "native", 2, True
    cfg.data.max_response_length = 24
    PPOTrainer(cfg, reward_fn=_digits).fit()
    rows = _rows(tmp_path)
    assert sorted(k for k in rows if k > 0) == [1, 2, 3, 4, 5]
    assert all(rows[s]["async/staleness_max"] <= 1.0 for s in rows if s > 0)
    swaps = [rows[s]["rollout_pool/partial_swaps"] for s in (1, 2, 3, 4, 5)]
    shares = [rows[s]["rollout_pool/partial_token_share"] for s in (1, 2, 3, 4, 5)]
    assert swaps[0] == 0.0 and shares[0] == 0.0  # step 1's batch: the second send carried no change
    assert sum(swaps) >= 1 and max(shares) > 0.0, (swaps, shares)
    assert all(0.0 <= x < 1.0 for x in shares)
