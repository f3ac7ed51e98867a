"""resource_pool.rollout=auto on Ray CPU workers: calibration steps colocated in sync mode, the split
chosen from their times, the worker groups re-formed from the calibration checkpoint, training on."""

from __future__ import annotations

import json

import pytest
import yaml
from cli_helpers import metrics

from hybridrl.config import ConfigError, config_from_dict, validate
from hybridrl.trainer import calibration
from hybridrl.trainer import checkpoint as ckpt
from hybridrl.trainer.calibration import KEY, STATE, recorded_split
from hybridrl.trainer.ppo import PPOTrainer
from hybridrl.trainer.supervise import fit_with_restarts


def _cfg(model_dir, data, tmp_path, steps=3, min_gain=0.1, **trainer):
    return config_from_dict(
        {
            "data": {"train_files": data["train"], "train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {
                "model": {"path": model_dir, "random_init": True},
                "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "optim": {"lr": 3e-3}},
                "rollout": {"n": 2},
            },
            "algorithm": {"adv_estimator": "grpo"},
            "resource_pool": {"rollout": "auto", "rollout_auto_steps": 1, "rollout_auto_min_gain": min_gain},
            "trainer": {
                "device": "cpu",
                "n_gpus_per_node": 2,
                "mode": "one_step_off",
                "total_training_steps": steps,
                "logger": ["jsonl"],
                "val_before_train": False,
                "default_local_dir": str(tmp_path / "run"),
                **trainer,
            },
        }
    )


def _digits(data_source, solution_str, ground_truth, extra_info=None) -> float:
    return sum(c.isdigit() for c in solution_str) / 4.0


def _rows(tmp_path) -> dict[int, dict]:
    return {r["step"]: r for r in metrics(tmp_path / "run")}


def _fit(cfg):
    return fit_with_restarts(cfg, lambda c: PPOTrainer(c, reward_fn=_digits))


def test_auto_split_calibrates_reforms_and_resumes(ray_session, tiny_model_dir, arith_data, tmp_path, capsys):
    """2 CPU workers. Step 1 trains colocated in sync mode (both ranks are the actor's) and decides;
    rollout_auto_min_gain=-1 takes the best split however the CPU times come out, here the only one,
    1 + 1. Steps 2-5 then run one_step_off on the re-formed groups: the pool's batches, one update
    stale after the first (which the resumed pool generates with the checkpoint's weights). Resumed
    with more steps, the run takes the recorded split without calibrating again."""
    _fit(_cfg(tiny_model_dir, arith_data, tmp_path, steps=5, min_gain=-1.0))
    out = capsys.readouterr().out
    rows = _rows(tmp_path)
    assert sorted(k for k in rows if k > 0) == [1, 2, 3, 4, 5]
    # step 1: calibration, a real training step on the colocated actor, with the decision
    assert rows[1][KEY] == 1.0 and rows[1]["actor/grad_norm"] > 0
    assert rows[1]["timing_s/gen"] > 0 and "rollout_pool/weights_version" not in rows[1]
    assert "async/staleness_max" not in rows[1]  # sync mode
    assert "resource_pool.rollout=auto after 1 step(s): 1 trainer + 1 rollout devices" in out
    assert "resource_pool.rollout=1 resource_pool.actor_rollout_ref=1 trainer.mode=one_step_off" in out
    # steps 2-5: the split, resumed from step 1's checkpoint
    assert "resumed from" in out and "step_1" in out
    assert [rows[s]["async/staleness_max"] for s in (2, 3, 4, 5)] == [0.0, 1.0, 1.0, 1.0]
    assert [rows[s]["rollout_pool/weights_version"] for s in (2, 3, 4, 5)] == [1.0, 1.0, 2.0, 3.0]
    assert abs(rows[2]["rollout_corr/kl"]) < 1e-5  # the pool generated with the checkpoint's weights
    assert all(rows[s]["actor/grad_norm"] > 0 and KEY not in rows[s] for s in (2, 3, 4, 5))
    assert [rows[s]["training/global_step"] for s in (1, 2, 3, 4, 5)] == [1, 2, 3, 4, 5]
    # after 3 steps past the first on the split: colocated sync's step over the split's median
    speedup = rows[1]["timing_s/step"] / sorted(rows[s]["timing_s/step"] for s in (3, 4, 5))[1]
    assert rows[5]["resource_pool/rollout_auto_speedup"] == pytest.approx(speedup)
    assert all("resource_pool/rollout_auto_speedup" not in rows[s] for s in (1, 2, 3, 4))
    assert f"{speedup:.2f}x colocated sync's {rows[1]['timing_s/step']:.2f} s" in out
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["resource_pool"]
    assert (saved["rollout"], saved["actor_rollout_ref"]) == (1, 1)
    root = tmp_path / "run" / "checkpoints"
    saved = [ckpt.load_trainer_state(root / f"step_{s}")[STATE] for s in (1, 5)]
    assert saved == [{"rollout": 1, "devices_per_node": 2}] * 2

    # resumed with a longer budget: the recorded split, no calibration
    _fit(_cfg(tiny_model_dir, arith_data, tmp_path, steps=6))
    out = capsys.readouterr().out
    rows = _rows(tmp_path)
    assert sorted(k for k in rows if k > 0) == [1, 2, 3, 4, 5, 6]
    assert "rollout=auto after" not in out and KEY not in rows[6]
    assert rows[6]["async/staleness_max"] == 0.0 and "rollout_pool/weights_version" in rows[6]


def test_auto_split_stays_colocated_without_reforming(ray_session, tiny_model_dir, arith_data, tmp_path, capsys):
    """rollout_auto_min_gain=0.99: no split is predicted 99% faster, so the run goes on colocated in
    sync mode after step 1, in the same worker groups (one run, no resume), and says why."""
    _fit(_cfg(tiny_model_dir, arith_data, tmp_path, min_gain=0.99))
    out = capsys.readouterr().out
    rows = _rows(tmp_path)
    assert sorted(k for k in rows if k > 0) == [1, 2, 3]
    assert rows[1][KEY] == 0.0
    assert "staying colocated: the best split, 1 trainer + 1 rollout devices" in out and "not 99% faster" in out
    assert "resumed from" not in out
    assert all("rollout_pool/weights_version" not in rows[s] and "async/staleness_max" not in rows[s] for s in (1, 2, 3))
    state = ckpt.load_trainer_state(tmp_path / "run" / "checkpoints" / "step_3")
    assert state[STATE] == {"rollout": 0, "devices_per_node": 2}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"trainer.mode": "sync"}, "resource_pool.rollout=auto chooses devices for rollouts that run while the actor trains"),
        ({"trainer.n_gpus_per_node": 1}, "needs two or more devices per node to split, and trainer.n_gpus_per_node=1"),
        ({"resource_pool.actor_rollout_ref": 1}, "resource_pool.actor_rollout_ref must be null"),
        ({"resource_pool.rollout": "two"}, "resource_pool.rollout=two must be >= 1, or auto"),
        ({"resource_pool.rollout_auto_min_gain": 1.0}, "resource_pool.rollout_auto_min_gain=1.0 must be < 1"),
    ],
)
def test_auto_split_config_errors(tiny_model_dir, arith_data, tmp_path, change, message):
    cfg = _cfg(tiny_model_dir, arith_data, tmp_path)
    for key, value in change.items():
        section, name = key.rsplit(".", 1)
        obj = cfg
        for part in section.split("."):
            obj = getattr(obj, part)
        setattr(obj, name, value)
    errors = validate(cfg)
    assert len(errors) == 1 and message in errors[0], errors


def test_auto_needs_the_launch_loop(tiny_model_dir, arith_data, tmp_path):
    with pytest.raises(ConfigError, match="resource_pool.rollout=auto is chosen by fit_with_restarts"):
        PPOTrainer(_cfg(tiny_model_dir, arith_data, tmp_path))


def test_recorded_split_is_for_the_same_devices(tiny_model_dir, arith_data, tmp_path, monkeypatch, capsys):
    """A resumed run takes the checkpoint's split only on as many devices per node as it was chosen for."""
    path = tmp_path / "ckpt"
    path.mkdir()
    state = {"global_step": 3, "data": {"epoch": 0, "position": 12}}
    monkeypatch.setattr(calibration, "find_resume", lambda cfg: path)
    cfg = _cfg(tiny_model_dir, arith_data, tmp_path)
    (path / "trainer_state.json").write_text(json.dumps(state))
    assert recorded_split(cfg) is None  # written before the decision (or by a fixed split)
    (path / "trainer_state.json").write_text(json.dumps({**state, STATE: {"rollout": 1, "devices_per_node": 2}}))
    assert recorded_split(cfg) == 1
    cfg.trainer.n_gpus_per_node = 4
    assert recorded_split(cfg) is None
    assert "was trained split for 2 devices per node, this run has 4: calibrating again" in capsys.readouterr().out


def test_candidates_are_the_splits_the_batch_fits(tiny_model_dir, arith_data, tmp_path, capsys):
    """4 devices, 4 prompts x 2 samples: 3 actor ranks cannot split a mini-batch of 8 sequences."""
    cfg = _cfg(tiny_model_dir, arith_data, tmp_path, n_gpus_per_node=4)
    assert validate(cfg) == []
    assert calibration.candidates(cfg) == [2, 3]
    assert "resource_pool.rollout=auto: 3 + 1 is not a candidate: " in capsys.readouterr().out
