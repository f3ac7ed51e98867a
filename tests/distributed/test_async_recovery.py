"""trainer.mode=one_step_off on 2 Ray CPU workers: a rollout worker killed mid-generation is restarted
(trainer.max_restarts) and the run resumes from the last checkpoint, its generate-ahead queue rebuilt."""

from __future__ import annotations

import json

from hybridrl.config import config_from_dict
from hybridrl.trainer.ppo import PPOTrainer
from hybridrl.trainer.supervise import fit_with_restarts


def _cfg(model_dir, data, **trainer):
    return config_from_dict(
        {
            "data": {"train_files": data["train"], "train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {
                "model": {"path": model_dir, "random_init": True},
                "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2},
                "rollout": {"n": 2},
            },
            "algorithm": {"adv_estimator": "grpo"},
            "trainer": {"device": "cpu", "n_gpus_per_node": 2, "logger": ["jsonl"], "val_before_train": False, **trainer},
        }
    )


def test_killed_rollout_worker_recovers_with_max_restarts(ray_session, tiny_model_dir, arith_data, tmp_path, monkeypatch):
    cfg = _cfg(
        tiny_model_dir,
        arith_data,
        total_training_steps=4,
        save_freq=2,
        max_restarts=1,
        mode="one_step_off",
        default_local_dir=str(tmp_path / "run"),
    )
    # generate calls: step 1 makes the batches of steps 1 and 2, step 2 that of step 3, step 3 that of
    # step 4. Rank 1 dies in its 4th (step 3, after the step-2 checkpoint).
    flag = tmp_path / "killed"
    monkeypatch.setenv("HYBRIDRL_KILL_WORKER", f"generate:1:4:{flag}")
    fit_with_restarts(cfg, PPOTrainer)
    assert flag.exists()
    rows = {}
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows[r["step"]] = r  # the resumed run rewrites the steps after the checkpoint
    assert sorted(k for k in rows if k > 0) == [1, 2, 3, 4]
    # before the kill: 0 then 1; after the resume the queue is rebuilt from the step-2 weights, so
    # step 3 trains on a fresh batch (staleness 0) and step 4 on one generated a step earlier
    assert [rows[s]["async/staleness_max"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 0.0, 1.0]
    assert all(rows[s]["training/global_step"] == s for s in (1, 2, 3, 4))
