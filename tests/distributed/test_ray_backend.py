"""The Ray backend on CPU: 2 worker processes in a gloo group, one shared Ray session.

- dp dispatch returns results in input order, whether or not the batch divides;
- FSDP2 on 2 ranks computes the log-probs, values, losses and gradient norms of one device
  (actor, critic, SFT), and its checkpoints resume at the other world size (2 -> 1, 1 -> 2)
  with the same next step;
- `hybridrl export` of a 2-rank checkpoint is an HF model with the trained weights;
- a killed worker stops the run within seconds, naming it; max_restarts recovers.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
import torch.distributed as dist

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.distributed.groups import WorkerDiedError
from hybridrl.distributed.local import LocalWorkerGroup
from hybridrl.distributed.resource_pool import ACTOR, CRITIC
from hybridrl.workers.actor import ActorRolloutRefWorker
from hybridrl.workers.critic import CriticWorker

pytestmark = pytest.mark.slow


class RankEcho:
    """A toy worker: answers with its rank, and checks the process group works."""

    def __init__(self, cfg, plan, device):
        pass

    @register(Dispatch.DP)
    def tag(self, batch: Batch) -> Batch:
        total = torch.tensor([float(batch["x"].sum())])
        dist.all_reduce(total)  # the group's sum of the (padded) shards
        return Batch({"y": batch["x"] * 2, "rank": torch.full((len(batch),), dist.get_rank()), "total": total.expand(len(batch))})

    @register(Dispatch.ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ALL)
    def fail_on_rank1(self) -> None:
        if dist.get_rank() == 1:
            raise ValueError("bad input on rank 1")


def _cfg(model_dir, data, gpus, actor=None, rollout=None, **trainer):
    return config_from_dict(
        {
            "data": {"train_files": data["train"], "train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {
                "model": {"path": model_dir},
                "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "clip_ratio": 0.1, **(actor or {})},
                "rollout": {"n": 2, **(rollout or {})},
            },
            "algorithm": {"adv_estimator": "grpo"},
            "trainer": {"device": "cpu", "n_gpus_per_node": gpus, "logger": ["jsonl"], "val_before_train": False, **trainer},
        }
    )


def test_dp_dispatch_keeps_input_order(ray_session, tiny_model_dir, arith_data):
    from ray import cloudpickle

    from hybridrl.distributed.ray_backend import RayBackend

    cloudpickle.register_pickle_by_value(__import__(__name__))  # the toy worker travels by value
    cfg = _cfg(tiny_model_dir, arith_data, 2)
    backend = RayBackend(cfg, plan_batches(cfg), {"echo": RankEcho})
    try:
        group = backend.groups["echo"]
        assert len(set(group.pid())) == 2  # two processes
        for rows in (6, 5, 1):
            out = group.tag(Batch({"x": torch.arange(rows)}))
            assert out["y"].tolist() == [2 * i for i in range(rows)]
            half = -(-rows // 2)  # rank 0 holds the first ceil(rows / 2) rows
            assert out["rank"].tolist() == [0] * half + [1] * (rows - half)
            padded = list(range(rows)) + list(range((-rows) % 2))
            assert out["total"].tolist() == [float(sum(padded))] * rows
        # non-blocking: both calls are in flight before either is collected
        a, b = group.submit("tag", Batch({"x": torch.arange(4)})), group.submit("tag", Batch({"x": torch.arange(3)}))
        assert b.get()["y"].tolist() == [0, 2, 4] and a.get()["y"].tolist() == [0, 2, 4, 6]
        with pytest.raises(ValueError, match="bad input on rank 1"):  # a worker's exception keeps its type
            group.fail_on_rank1()
    finally:
        backend.shutdown()


def test_missing_gpus_are_named_before_any_worker_starts(ray_session, tiny_model_dir, arith_data):
    from hybridrl.distributed.groups import BackendError
    from hybridrl.distributed.ray_backend import RayBackend

    cfg = _cfg(tiny_model_dir, arith_data, 2)
    cfg.trainer.device = "cuda"  # this cluster has CPUs only
    with pytest.raises(BackendError, match=r"asks for 1 node\(s\) with 2 \(colocated\) = 2 GPUs each") as err:
        RayBackend(cfg, plan_batches(cfg), {ACTOR: ActorRolloutRefWorker})
    assert "the cluster has no GPUs: use trainer.device=cpu" in str(err.value)


def _rollouts(seed: int, vocab: int, rows: int = 8, P: int = 4, R: int = 5) -> Batch:
    """Fixed rollouts with uneven response lengths (rank 0's shard holds more tokens)."""
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.tensor([4, 2, 3, 4, 1, 4, 2, 3])[:rows]
    resp_len = torch.tensor([5, 5, 4, 5, 1, 2, 1, 3])[:rows]
    prompt_mask = (torch.arange(P) >= P - prompt_len[:, None]).long()
    resp_mask = (torch.arange(R) < resp_len[:, None]).float()
    return Batch(
        {
            K.PROMPTS: torch.randint(2, vocab, (rows, P), generator=g) * prompt_mask,
            K.PROMPT_MASK: prompt_mask,
            K.RESPONSES: torch.randint(2, vocab, (rows, R), generator=g),
            K.RESPONSE_MASK: resp_mask,
            K.ADVANTAGES: torch.randn(rows, R, generator=g) * resp_mask,
        }
    )


def _with_old_log_probs(group, batch: Batch, seed: int) -> Batch:
    old = group.compute_log_prob(batch.select(batch.keys()))[K.OLD_LOG_PROBS]
    g = torch.Generator().manual_seed(seed)  # off-policy by a little: the clip is exercised
    batch[K.OLD_LOG_PROBS] = (old + 0.2 * torch.randn(old.shape, generator=g)) * batch[K.RESPONSE_MASK]
    return batch


def _assert_same_step(a: dict, b: dict) -> None:
    for k in ("actor/pg_loss", "actor/grad_norm", "actor/lr"):
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), (k, a[k], b[k])


def _assert_same_weights_after_step(group, batch: Batch, expected: torch.Tensor) -> None:
    """The policy after an optimizer step gives `expected` log-probs: rtol 1e-5 is far below
    what the step moves them by at lr 1e-3 (a resumed step without the saved Adam state fails)."""
    got = group.compute_log_prob(batch.select(batch.keys()))[K.OLD_LOG_PROBS]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_fsdp2_two_ranks_match_one_device_and_checkpoints_reshard(ray_session, tiny_model_with_weights, arith_data, tmp_path):
    from transformers import AutoModelForCausalLM

    from hybridrl.distributed.checkpoint import export_hf
    from hybridrl.distributed.ray_backend import RayBackend
    from hybridrl.models.logprobs import log_probs_from_logits, response_logits

    # lr 1e-3: an optimizer step moves the log-probs far more than the tolerances below, so a
    # resume that lost the Adam moments or the step count is caught (see the resume checks)
    big_lr = {"optim": {"lr": 1e-3}}
    cfg1 = _cfg(tiny_model_with_weights, arith_data, 1, actor=big_lr)
    cfg2 = _cfg(tiny_model_with_weights, arith_data, 2, actor=big_lr)
    for cfg in (cfg1, cfg2):
        cfg.algorithm.adv_estimator = "gae"  # a critic too
    cfg2.actor_rollout_ref.model.enable_gradient_checkpointing = True  # recomputation changes no number
    cfg2.critic.model.enable_gradient_checkpointing = True
    one = LocalWorkerGroup(ActorRolloutRefWorker(cfg1, plan_batches(cfg1), torch.device("cpu")))
    critic1 = LocalWorkerGroup(CriticWorker(cfg1, plan_batches(cfg1), torch.device("cpu")))
    backend = RayBackend(cfg2, plan_batches(cfg2), {ACTOR: ActorRolloutRefWorker, CRITIC: CriticWorker})
    two, critic2 = backend.groups[ACTOR], backend.groups[CRITIC]
    try:
        # critic: the 1-device value model (its head is freshly initialized) loaded on 2 ranks
        critic1.init_model(tiny_model_with_weights, False, 10)
        critic1.save_checkpoint(str(tmp_path / "c1"))
        critic2.init_model(str(tmp_path / "c1" / "critic"), True, 10)
        critic2.load_checkpoint(str(tmp_path / "c1"))
        b = _rollouts(2, 40)
        values = critic1.compute_values(b.select(b.keys()))[K.VALUES]
        torch.testing.assert_close(critic2.compute_values(b.select(b.keys()))[K.VALUES], values, rtol=1e-5, atol=1e-6)
        b[K.VALUES], b[K.RETURNS] = values, values + b[K.ADVANTAGES]
        m1, m2 = critic1.update_critic(b.select(b.keys())), critic2.update_critic(b.select(b.keys()))
        for k in ("critic/vf_loss", "critic/grad_norm"):
            assert m2[k] == pytest.approx(m1[k], rel=1e-5), (k, m1[k], m2[k])

        for g in (one, two):
            g.init_model(tiny_model_with_weights, False, 10, False)
        vocab = 40
        b1, b2 = _rollouts(0, vocab), _rollouts(1, vocab)
        # log-probs: dp-split over FSDP ranks == one device
        lp1 = one.compute_log_prob(b1.select(b1.keys()))[K.OLD_LOG_PROBS]
        lp2 = two.compute_log_prob(b1.select(b1.keys()))[K.OLD_LOG_PROBS]
        torch.testing.assert_close(lp2, lp1, rtol=1e-5, atol=1e-6)
        # one update: same loss (global token normalizer) and same global gradient norm
        b1 = _with_old_log_probs(one, b1, 10)
        _assert_same_step(two.update_actor(b1.select(b1.keys())), one.update_actor(b1.select(b1.keys())))
        two.save_checkpoint(str(tmp_path / "ws2"), False)
        one.save_checkpoint(str(tmp_path / "ws1"), False)

        # export of the 2-rank checkpoint == the 2-rank model's weights
        hf = AutoModelForCausalLM.from_pretrained(export_hf(tmp_path / "ws2" / "actor", tmp_path / "hf")).eval()
        with torch.no_grad():
            logits = response_logits(hf, *(b1[k] for k in (K.PROMPTS, K.PROMPT_MASK, K.RESPONSES, K.RESPONSE_MASK)))
        exported = log_probs_from_logits(logits, b1[K.RESPONSES]) * b1[K.RESPONSE_MASK]
        torch.testing.assert_close(exported, two.compute_log_prob(b1.select(b1.keys()))[K.OLD_LOG_PROBS], rtol=1e-5, atol=1e-6)

        # the next step, uninterrupted, at both world sizes; the log-probs after it show the
        # weights its optimizer step produced (from the Adam moments of the first step)
        b2 = _with_old_log_probs(one, b2, 11)
        next2, next1 = two.update_actor(b2.select(b2.keys())), one.update_actor(b2.select(b2.keys()))
        _assert_same_step(next2, next1)
        after2, after1 = (g.compute_log_prob(b2.select(b2.keys()))[K.OLD_LOG_PROBS] for g in (two, one))
        torch.testing.assert_close(after2, after1, rtol=1e-5, atol=1e-6)
        # 2 -> 1: one device resumes the 2-rank checkpoint (weights, Adam moments, LR schedule).
        # The step's metrics are computed before its optimizer step, so the weights after it are
        # compared too: they depend on the restored moments and step count (a fresh Adam differs).
        one.init_model(str(tmp_path / "ws2" / "actor"), True, 10, False)
        one.load_checkpoint(str(tmp_path / "ws2"))
        _assert_same_step(one.update_actor(b2.select(b2.keys())), next2)
        _assert_same_weights_after_step(one, b2, after2)
        # 1 -> 2
        two.init_model(str(tmp_path / "ws1" / "actor"), True, 10, False)
        two.load_checkpoint(str(tmp_path / "ws1"))
        _assert_same_step(two.update_actor(b2.select(b2.keys())), next1)
        _assert_same_weights_after_step(two, b2, after1)
        # the supervised update (SFT, warm-up) normalizes by the global token count too
        sft2, sft1 = two.update_sft(b2.select(b2.keys())), one.update_sft(b2.select(b2.keys()))
        for k in ("loss", "mean_token_accuracy", "num_tokens", "actor/grad_norm"):
            assert sft2[k] == pytest.approx(sft1[k], rel=1e-5), (k, sft1[k], sft2[k])
    finally:
        backend.shutdown()


class TunableActor(ActorRolloutRefWorker):
    """The actor worker with one extra method: change update keys between calls."""

    @register(Dispatch.ALL)
    def set_actor_keys(self, **keys) -> None:
        for k, v in keys.items():
            setattr(self.arr.actor, k, v)


def test_fsdp2_token_budgets_every_loss_agg_mode_and_native_rollout_match_one_device(
    ray_session, tiny_model_with_weights, arith_data, tmp_path
):
    """Packed passes (the default) with token-budget micro-batches on 2 ranks: rank 0's shard of
    `_rollouts` needs 4 micro-batches of 12 tokens and rank 1's only 2, so the ranks must agree
    on a count (FSDP runs collectives in every pass). Every loss_agg_mode gives the one-device
    loss and gradient norm (global normalizers). The native engine gets the gathered full weights
    after each update, and after a resume, and generates what one device generates."""
    from hybridrl.distributed.ray_backend import RayBackend
    from hybridrl.rollout import SamplingParams

    budget = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 12}
    cfgs = [_cfg(tiny_model_with_weights, arith_data, gpus, actor=budget, rollout={"name": "native"}) for gpus in (1, 2)]
    assert cfgs[1].actor_rollout_ref.rollout.log_prob_use_dynamic_bsz  # inherited: log-prob passes by budget too
    one = LocalWorkerGroup(TunableActor(cfgs[0], plan_batches(cfgs[0]), torch.device("cpu")))
    backend = RayBackend(cfgs[1], plan_batches(cfgs[1]), {ACTOR: TunableActor})
    two = backend.groups[ACTOR]
    prompts = Batch(
        {
            K.PROMPTS: torch.randint(2, 40, (4, 5), generator=torch.Generator().manual_seed(3)),
            K.PROMPT_MASK: torch.ones(4, 5, dtype=torch.long),
        }
    )
    greedy = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=4)

    def same_generations():
        g1, g2 = one.generate(prompts.select(prompts.keys()), greedy), two.generate(prompts.select(prompts.keys()), greedy)
        assert torch.equal(g2[K.RESPONSES], g1[K.RESPONSES])
        torch.testing.assert_close(g2[K.ROLLOUT_LOG_PROBS], g1[K.ROLLOUT_LOG_PROBS], rtol=1e-5, atol=1e-5)
        return g1

    try:
        for g in (one, two):
            g.init_model(tiny_model_with_weights, False, 10, False)
        first = same_generations()
        b = _rollouts(0, 40)
        lp1 = one.compute_log_prob(b.select(b.keys()))[K.OLD_LOG_PROBS]
        torch.testing.assert_close(two.compute_log_prob(b.select(b.keys()))[K.OLD_LOG_PROBS], lp1, rtol=1e-5, atol=1e-6)
        b = _with_old_log_probs(one, b, 10)
        for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
            for g in (one, two):
                g.set_actor_keys(loss_agg_mode=mode, entropy_coeff=0.01)
            m1, m2 = one.update_actor(b.select(b.keys())), two.update_actor(b.select(b.keys()))
            for k in ("actor/pg_loss", "actor/grad_norm"):
                assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-7), (mode, k, m1[k], m2[k])
        after = same_generations()  # the engines got the updated weights (full tensors on 2 ranks)
        assert not torch.equal(after[K.ROLLOUT_LOG_PROBS], first[K.ROLLOUT_LOG_PROBS])
        # resume: the model is rebuilt with random weights, then loaded from DCP; the engine follows
        two.save_checkpoint(str(tmp_path / "ws2"), False)
        two.init_model(str(tmp_path / "ws2" / "actor"), True, 10, False)
        two.load_checkpoint(str(tmp_path / "ws2"))
        same_generations()
    finally:
        backend.shutdown()


def _metrics(run_dir) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_killed_worker_is_reported_then_recovered_with_max_restarts(
    ray_session, tiny_model_dir, arith_data, tmp_path, monkeypatch
):
    from hybridrl.trainer.ppo import PPOTrainer
    from hybridrl.trainer.supervise import fit_with_restarts

    def run(name, max_restarts, kill):
        cfg = _cfg(
            tiny_model_dir,
            arith_data,
            2,
            total_training_steps=3,
            save_freq=2,
            max_restarts=max_restarts,
            default_local_dir=str(tmp_path / name),
        )
        cfg.actor_rollout_ref.model.random_init = True
        if kill:  # rank 1 dies in its third update (step 3), after the step-2 checkpoint
            monkeypatch.setenv("HYBRIDRL_KILL_WORKER", f"update_actor:1:3:{tmp_path / (name + '.killed')}")
        else:
            monkeypatch.delenv("HYBRIDRL_KILL_WORKER", raising=False)
        return fit_with_restarts(cfg, PPOTrainer)

    with pytest.raises(WorkerDiedError) as err:
        run("stop", 0, kill=True)
    stopped = time.time()
    pid, killed_at = (tmp_path / "stop.killed").read_text().split()
    msg = str(err.value)
    assert "actor_rollout_ref worker process of rank 1" in msg and f"pid {pid}" in msg and "on node " in msg
    assert f"last good checkpoint is {tmp_path / 'stop' / 'checkpoints' / 'step_2'}" in msg
    assert stopped - float(killed_at) < 10, "the controller must stop within seconds"

    run("recover", 1, kill=True)
    run("straight", 0, kill=False)
    recovered, straight = _metrics(tmp_path / "recover"), _metrics(tmp_path / "straight")
    assert sorted(recovered) == [1, 2, 3]
    # the restarted step continues the same run: data position, weights, Adam, RNG of every rank
    for k in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean"):
        assert recovered[3][k] == pytest.approx(straight[3][k], rel=1e-6), k
    # step 3's metrics come before its optimizer step: the final weights show that the restarted
    # workers also stepped from the checkpoint's Adam moments and LR schedule
    _assert_same_final_weights(tmp_path / "recover", tmp_path / "straight", tmp_path)


def _assert_same_final_weights(run_a, run_b, tmp_path) -> None:
    from safetensors.torch import load_file

    from hybridrl.distributed.checkpoint import export_hf

    weights = []
    for run in (run_a, run_b):
        out = export_hf(run / "checkpoints" / "step_3" / "actor", tmp_path / f"{run.name}_hf")
        weights.append(load_file(str(out / "model.safetensors")))
    assert weights[0].keys() == weights[1].keys()
    for name, w in weights[0].items():
        torch.testing.assert_close(w, weights[1][name], rtol=1e-6, atol=1e-7, msg=name)


def test_split_placement_runs_actor_and_critic_in_their_own_processes(ray_session, tiny_model_dir, arith_data, tmp_path):
    from hybridrl.trainer.ppo import PPOTrainer

    cfg = _cfg(tiny_model_dir, arith_data, 2, total_training_steps=2, default_local_dir=str(tmp_path))
    cfg.actor_rollout_ref.model.random_init = True
    cfg.algorithm.adv_estimator = "gae"
    cfg.resource_pool.actor_rollout_ref, cfg.resource_pool.critic = 1, 1
    trainer = PPOTrainer(cfg)
    backend = trainer.run.workers.backend
    assert backend.world_sizes() == {"actor_rollout_ref": 1, "critic": 1}
    assert len({pid for pids in backend.pids().values() for pid in pids}) == 2
    last = trainer.fit()
    assert last["training/global_step"] == 2
    for k in ("critic/vf_loss", "critic/grad_norm", "actor/pg_loss", "critic/values/mean"):
        assert k in last and last[k] == last[k], k  # present and not NaN


def test_stalled_worker_is_reported_like_a_dead_one(ray_session, tiny_model_dir, arith_data):
    """SIGSTOP rank 1: rank 0 waits in the all-reduce with it; no heartbeat for worker_timeout_s
    reports rank 1 by pid, as a dead worker is, instead of waiting for the collective timeout."""
    import signal

    from ray import cloudpickle

    from hybridrl.distributed.ray_backend import RayBackend

    cloudpickle.register_pickle_by_value(__import__(__name__))
    cfg = _cfg(tiny_model_dir, arith_data, 2, worker_timeout_s=5.0)
    backend = RayBackend(cfg, plan_batches(cfg), {"echo": RankEcho})
    try:
        group = backend.groups["echo"]
        pids = group.pid()
        assert group.tag(Batch({"x": torch.arange(4)}))["y"].tolist() == [0, 2, 4, 6]  # heartbeats do not disturb
        os.kill(pids[1], signal.SIGSTOP)
        start = time.time()
        with pytest.raises(WorkerDiedError) as err:
            group.tag(Batch({"x": torch.arange(4)}))
        waited = time.time() - start
        msg = str(err.value)
        assert "rank 1 on node" in msg and f"pid {pids[1]}" in msg and "no heartbeat" in msg and "worker_timeout_s=5" in msg
        assert 4.0 <= waited < 60, waited  # silent since the last beat before the stop (beats every 1 s)
    finally:
        backend.shutdown()  # SIGKILL reaches a stopped process
