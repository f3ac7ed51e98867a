"""`hybridrl train` on 2 CPU worker processes (Ray + gloo + FSDP2), resumed on 1, then exported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_all_finite, cli, metrics, weights

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _quickstart(out, data, *overrides, check=True):
    return cli(
        "train",
        ROOT / "configs/quickstart.yaml",
        "trainer.device=cpu",
        f"trainer.default_local_dir={out}",
        f"data.train_files={data['train']}",
        f"data.val_files={data['test']}",
        f"warmup.files={data['sft']}",
        "warmup.steps=4",
        "trainer.test_freq=-1",
        "trainer.logger=[console,jsonl]",
        *overrides,
        check=check,
    )


def test_two_workers_train_resume_on_one_and_export(arith_data, tmp_path):
    out = tmp_path / "run"
    first = _quickstart(
        out,
        arith_data,
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "trainer.total_training_steps=2",
        "trainer.save_freq=1",
        "trainer.profile_steps=[2]",
    )
    assert "Ray, device cpu (colocated: 2 ranks)" in first.stdout
    # each worker process profiled step 2 on its own (trainer.profile_steps)
    assert sorted(p.name for p in (out / "profile" / "step_2").iterdir()) == [
        "actor_rank0.json",
        "actor_rank0.txt",
        "actor_rank1.json",
        "actor_rank1.txt",
    ]
    # each worker method is a named range of the trace (benchmarks/trace_summary.py splits the step by them)
    summary = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/trace_summary.py"), str(out / "profile" / "step_2")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for rank in (0, 1):
        for method in ("generate", "update_actor"):
            assert f"| actor_rank{rank} | {method} | 1 |" in summary, summary
    ckpt = out / "checkpoints"
    assert sorted(p.name for p in (ckpt / "step_2").glob("rng_*.pt")) == ["rng_colocated_0.pt", "rng_colocated_1.pt"]
    # the same run continues on one device from the 2-rank checkpoint
    second = _quickstart(
        out, arith_data, "trainer.n_gpus_per_node=1", "trainer.total_training_steps=3", "trainer.resume_mode=auto"
    )
    assert f"resumed from {ckpt / 'step_2'} at step 2/3" in second.stdout
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert_all_finite(rows)
    step2, step3 = weights(ckpt / "step_2" / "actor"), weights(ckpt / "step_3" / "actor")
    assert any(not torch.equal(step2[k], step3[k]) for k in step2), "step 3 did not train"

    # export: a plain HF directory whose weights are the checkpoint's, read back independently
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM, AutoTokenizer

    exp = cli("export", out, tmp_path / "hf")  # the run directory: its latest checkpoint
    assert "step_3" in exp.stdout
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").decode([5, 6]) == "34"
    dcp_to_torch_save(ckpt / "step_3" / "actor" / "model", tmp_path / "flat.pt")
    saved = torch.load(tmp_path / "flat.pt", weights_only=True)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, saved[name], rtol=0, atol=0)
    cli("export", ckpt / "step_2", tmp_path / "hf16", "--dtype", "bfloat16")  # a given step, in bf16 (for vLLM)
    half = AutoModelForCausalLM.from_pretrained(tmp_path / "hf16", dtype="auto")
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(
        half.state_dict()["model.embed_tokens.weight"], step2["model.embed_tokens.weight"].bfloat16(), rtol=0, atol=0
    )
    bad = cli("export", tmp_path / "nowhere", tmp_path / "x", check=False)
    assert bad.returncode == 2 and "is not a hybridrl checkpoint" in bad.stderr


def test_one_device_never_imports_ray(tiny_model_dir, arith_data, tmp_path):
    """The GPU image has no Ray: the single-device path must not need it."""
    code = f"""
import sys
from hybridrl.config import config_from_dict
from hybridrl.trainer.ppo import PPOTrainer
cfg = config_from_dict({{"data": {{"train_files": {arith_data["train"]!r}, "train_batch_size": 2, "max_prompt_length": 8,
                                   "max_response_length": 2}},
    "actor_rollout_ref": {{"model": {{"path": {tiny_model_dir!r}, "random_init": True}}, "actor": {{"ppo_mini_batch_size": 2}},
                          "rollout": {{"n": 2}}}},
    "algorithm": {{"adv_estimator": "grpo"}},
    "trainer": {{"device": "cpu", "total_training_steps": 1, "logger": ["jsonl"], "default_local_dir": {str(tmp_path)!r}}}}})
PPOTrainer(cfg).fit()
print("ray imported:", "ray" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ray imported: False" in proc.stdout


def test_lora_on_two_workers_saves_and_resumes_on_two(arith_data, tmp_path):
    """LoRA under FSDP2 from the CLI: 2 workers train adapters, checkpoint (merged actor/ + adapter/
    + sharded optimizer), and a resumed run continues the adapters from the checkpoint."""
    out = tmp_path / "lora"
    lora = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32"]
    lora += ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16", "trainer.save_freq=1"]
    _quickstart(out, arith_data, *lora, "trainer.total_training_steps=2")
    step2 = out / "checkpoints" / "step_2"
    assert (step2 / "actor" / "adapter" / "adapter_model.safetensors").is_file() and (step2 / "lora_base").is_dir()
    second = _quickstart(out, arith_data, *lora, "trainer.total_training_steps=3", "trainer.resume_mode=auto")
    assert f"resumed from {step2} at step 2/3" in second.stdout
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert_all_finite(rows)
    from safetensors.torch import load_file

    a2 = load_file(step2 / "actor" / "adapter" / "adapter_model.safetensors")
    a3 = load_file(out / "checkpoints" / "step_3" / "actor" / "adapter" / "adapter_model.safetensors")
    assert a2.keys() == a3.keys() and any(not torch.equal(a2[k], a3[k]) for k in a2), "step 3 did not train the adapters"
    base2, base3 = weights(step2 / "lora_base"), weights(out / "checkpoints" / "step_3" / "lora_base")
    assert all(torch.equal(base2[k], base3[k]) for k in base2)  # the base stays frozen


def test_rollout_pool_in_async_mode_from_the_cli(arith_data, tmp_path):
    """resource_pool.rollout from `hybridrl train`: 1 actor + 1 rollout process, async with max_staleness 2,
    validation on the pool (with the weights after the step's update) and the pool's profile."""
    out = tmp_path / "pool"
    run = _quickstart(
        out,
        arith_data,
        "trainer.n_gpus_per_node=2",
        "resource_pool.actor_rollout_ref=1",
        "resource_pool.rollout=1",
        "trainer.mode=async",
        "async_training.max_staleness=2",
        "trainer.total_training_steps=4",
        "trainer.test_freq=2",
        "trainer.profile_steps=[3]",
        "actor_rollout_ref.rollout.update_weights_staging=host",
    )
    assert "Ray, device cpu (actor_rollout_ref: 1 ranks, rollout: 1 ranks)" in run.stdout
    rows = {r["step"]: r for r in metrics(out)}
    assert [rows[s]["async/staleness_max"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 2.0, 2.0]
    assert all("val-core/arith/reward/mean@1" in rows[s] for s in (0, 2, 4))  # validated by the pool
    assert [rows[s]["rollout_pool/weights_version"] for s in (1, 2, 3, 4)] == [1.0, 1.0, 1.0, 2.0]
    # the policy moved since push 1: step 4's batch came with a push, staged on the host as the CLI asked
    assert rows[4]["rollout_pool/bytes_sent"] > 0 and rows[4]["rollout_pool/device_staging"] == 0.0
    assert_all_finite(list(rows.values()))
    names = sorted(p.name for p in (out / "profile" / "step_3").iterdir())
    assert "rollout_rank0.json" in names and "actor_rank0.json" in names


def test_replicated_data_parallel_trains_actor_and_critic_and_resumes_sharded(arith_data, tmp_path):
    """fsdp_size=1 on 2 workers: PPO with a critic and a reference, every model a whole replica (no
    FSDP, gradients all-reduced); the checkpoint resumes under FSDP (fsdp_size=-1)."""
    out = tmp_path / "replicated"
    ppo = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32", "trainer.save_freq=1"]
    ppo += ["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true"]
    first = _quickstart(
        out, arith_data, *ppo, "actor_rollout_ref.actor.fsdp_config.fsdp_size=1", "trainer.total_training_steps=2"
    )
    assert "Ray, device cpu (colocated: 2 ranks)" in first.stdout
    step2 = out / "checkpoints" / "step_2"
    second = _quickstart(out, arith_data, *ppo, "trainer.total_training_steps=3", "trainer.resume_mode=auto")
    assert f"resumed from {step2} at step 2/3" in second.stdout
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert_all_finite(rows)
    train = [r for r in rows if r["step"] > 0]
    assert all(r["actor/grad_norm"] > 0 and r["critic/grad_norm"] > 0 and "critic/vf_loss" in r for r in train)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    def saved(role_dir):  # the DCP weights as written (the critic's have a value head, no LM head)
        dcp_to_torch_save(role_dir / "model", tmp_path / "w.pt")
        return torch.load(tmp_path / "w.pt", weights_only=True)

    for role in ("actor", "critic"):
        w1, w2 = saved(out / "checkpoints" / "step_1" / role), saved(step2 / role)
        assert any(not torch.equal(w1[k], w2[k]) for k in w1), f"replicated step 2 did not train the {role}"


def test_replicated_policy_feeds_a_tensor_parallel_rollout_without_communication(arith_data, tmp_path):
    """fsdp_size=1 with a native tp=2 rollout: each rank cuts its TP slices from its own whole copy
    after every optimizer step (reshard/bytes_per_rank = 0, where FSDP would exchange pieces)."""
    out = tmp_path / "tp"
    _quickstart(
        out,
        arith_data,
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.actor.fsdp_config.fsdp_size=1",
        "actor_rollout_ref.rollout.name=native",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "trainer.total_training_steps=3",
    )
    rows = metrics(out)
    assert_all_finite(rows)
    pushed = [r for r in rows if "reshard/full_gather_bytes_per_rank" in r]
    assert len(pushed) >= 2 and all(r["reshard/bytes_per_rank"] == 0 < r["reshard/full_gather_bytes_per_rank"] for r in pushed)
