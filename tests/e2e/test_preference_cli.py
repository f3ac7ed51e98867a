"""End-to-end `hybridrl train` runs of DPO, KTO and SFT on a tiny model and a synthetic preference
set it can learn (each problem's correct sum preferred over a wrong one)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hybridrl.data.converters import make_arith_preferences

from cli_helpers import assert_all_finite, cli, metrics, weights, without_volatile

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pref_data(tmp_path_factory):
    return make_arith_preferences(tmp_path_factory.mktemp("arith_pref"), n=32, max_operand=20, seed=0)


def train(tmp_path, model_dir, files, out, algo, steps, env=None, check=True, **extra):
    cfg = tmp_path / "base.yaml"
    cfg.write_text(f"algorithm:\n  name: {algo}\n")
    o = {
        "data.train_files": files,
        "data.train_batch_size": 16,
        "data.max_prompt_length": 8,
        "data.max_response_length": 4,
        "actor_rollout_ref.model.path": model_dir,
        "actor_rollout_ref.model.random_init": "true",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
        "actor_rollout_ref.actor.optim.lr": 3e-3,
        "preference.beta": 0.5,
        "trainer.device": "cpu",
        "trainer.total_training_steps": steps,
        "trainer.default_local_dir": out,
        "trainer.logger": "[console,jsonl]",
        **extra,
    }
    return cli("train", cfg, *[f"{k}={v}" for k, v in o.items()], env=env, check=check)


def mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


def test_dpo_learns_the_preferences_and_resumes_exactly(tiny_model_dir, pref_data, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    common = dict(algo="dpo", steps=30, **{"trainer.save_freq": 15})
    train(tmp_path, tiny_model_dir, pref_data["pairs"], a, **common)
    rows = metrics(a)
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert_all_finite(rows)
    for key in ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                "logps/chosen", "logps/rejected", "actor/grad_norm", "timing_s/ref", "perf/throughput"):  # fmt: skip
        assert all(key in r for r in rows), key
    assert mean(rows[-5:], "rewards/accuracies") > 0.9
    assert mean(rows[-5:], "loss") < mean(rows[:5], "loss") - 0.2
    assert mean(rows[-5:], "rewards/margins") > 0
    assert (a / "checkpoints" / "step_30" / "ref").is_dir()  # random init: the reference travels along

    # Kill right after the step-15 checkpoint, resume: steps 16-30 match the uninterrupted run.
    killed = train(tmp_path, tiny_model_dir, pref_data["pairs"], b, env={"HYBRIDRL_KILL_AFTER_SAVE_STEP": "15"},
                   check=False, **common)  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    resumed = train(tmp_path, tiny_model_dir, pref_data["pairs"], b, **common, **{"trainer.resume_mode": "auto"})
    assert "at step 15/30" in resumed.stdout
    assert [without_volatile(r) for r in metrics(b)] == [without_volatile(r) for r in rows]
    wa, wb = weights(a / "checkpoints" / "step_30" / "actor"), weights(b / "checkpoints" / "step_30" / "actor")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_kto_learns_desirable_over_undesirable(tiny_model_dir, pref_data, tmp_path):
    out = tmp_path / "kto"
    train(tmp_path, tiny_model_dir, pref_data["kto"], out, "kto", 30, **{"preference.precompute_ref_log_probs": "true"})
    rows = metrics(out)
    assert_all_finite(rows)
    assert all("kl" in r and "rewards/accuracies" in r and "timing_s/ref" not in r for r in rows)  # precomputed
    assert mean(rows[-5:], "loss") < mean(rows[:5], "loss") - 0.1
    last = [r for r in rows[-5:] if "rewards/margins" in r]
    assert last and mean(last, "rewards/chosen") > mean(last, "rewards/rejected")


def test_sft_loss_falls_on_response_tokens(tiny_model_dir, pref_data, tmp_path):
    out = tmp_path / "sft"
    proc = train(tmp_path, tiny_model_dir, pref_data["sft"], out, "sft", 20)
    assert "token_acc" in proc.stdout
    rows = metrics(out)
    assert_all_finite(rows)
    assert rows[-1]["loss"] < 0.6 * rows[0]["loss"]
    assert rows[-1]["mean_token_accuracy"] > rows[0]["mean_token_accuracy"]
    assert not (out / "checkpoints" / "step_20" / "ref").exists()  # SFT builds no reference
    saved = json.loads((out / "checkpoints" / "step_20" / "trainer_state.json").read_text())
    assert saved["global_step"] == 20 and saved["data"] == {"epoch": 9, "position": 2}  # 32 rows / 16 = 2 per epoch


def test_malformed_preference_row_stops_with_its_index(tiny_model_dir, pref_data, tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text(Path(pref_data["pairs"]).read_text() + json.dumps({"prompt": "1+1=", "chosen": "2"}) + "\n")
    proc = train(tmp_path, tiny_model_dir, broken, tmp_path / "r", "dpo", 1, check=False)
    assert proc.returncode == 2 and f"{broken}, row 32: missing 'rejected'" in proc.stderr


@pytest.mark.parametrize("config", ["dpo", "kto"])
def test_shipped_preference_config_learns(config, tmp_path):
    """configs/{dpo,kto}.yaml as shipped: accuracy over the last 20 steps > 0.9, the loss falls."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "hybridrl", "train", f"configs/{config}.yaml", f"trainer.default_local_dir={tmp_path}",
         "trainer.logger=[jsonl]", "trainer.save_freq=-1"],
        cwd=root, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in metrics(tmp_path) if "rewards/accuracies" in r]
    acc, loss = [r["rewards/accuracies"] for r in rows], [r["loss"] for r in rows]
    assert sum(acc[-20:]) / 20 > 0.9, acc[-20:]
    assert sum(loss[-10:]) / 10 < sum(loss[:10]) / 10 - 0.15, (loss[:10], loss[-10:])


def test_dpo_and_sft_validate_on_held_out_rows(tiny_model_dir, pref_data, tmp_path):
    # DPO: before training the policy is the reference, so every margin is exactly 0, no pair is
    # ranked right, and the sigmoid loss is log 2; training on the pairs moves all three.
    dpo = tmp_path / "dpo"
    train(tmp_path, tiny_model_dir, pref_data["pairs"], dpo, "dpo", 10,
          **{"data.val_files": pref_data["pairs"], "trainer.test_freq": 5})  # fmt: skip
    rows = metrics(dpo)
    val = {r["step"]: r for r in rows if "val/rewards/accuracies" in r}
    assert sorted(val) == [0, 5, 10] and val[0]["val/rows"] == 32
    assert val[0]["val/rewards/margins"] == 0.0 and val[0]["val/rewards/accuracies"] == 0.0
    assert val[0]["val/loss"] == pytest.approx(0.6931472, abs=1e-6)
    assert val[10]["val/rewards/accuracies"] > 0.6 and val[10]["val/rewards/margins"] > 0 and val[10]["val/loss"] < 0.69

    # SFT: the held-out loss before training equals the first step's training loss on the same rows.
    sft = tmp_path / "sft"
    train(tmp_path, tiny_model_dir, pref_data["sft"], sft, "sft", 4,
          **{"data.val_files": pref_data["sft"], "data.val_max_samples": 16, "data.shuffle": "false", "trainer.test_freq": 2})  # fmt: skip
    rows = metrics(sft)
    assert rows[0]["step"] == 0 and rows[0]["val/loss"] == pytest.approx(rows[1]["loss"], rel=1e-4)
    assert rows[0]["val/perplexity"] == pytest.approx(math.exp(rows[0]["val/loss"]))
    assert [r["step"] for r in rows if "val/loss" in r] == [0, 2, 4] and rows[-1]["val/loss"] < rows[0]["val/loss"]
