"""The RL dataflow: PPO, GRPO, RLOO, REINFORCE++ and ReMax on one loop.

One step is the algorithm box of the papers:
    generate -> score -> old log-probs -> reference log-probs -> values -> advantages
    -> critic update -> actor update
Each stage is a call on a worker group (in-process on one device, Ray processes on several);
this file knows the order of the stages and nothing about devices or sharding.
"""

from __future__ import annotations

import os
import signal
import time

import torch

from hybridrl.algorithms import apply_kl_penalty, get_adv_estimator, make_kl_controller
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.rollout import SamplingParams
from hybridrl.tracking.timer import StageTimer
from hybridrl.trainer.metrics import compute_data_metrics
from hybridrl.trainer.rollout_log import log_val_samples
from hybridrl.trainer.scoring import evaluate, last_token_scores, score
from hybridrl.trainer.setup import RunContext, build_run


class NonFiniteError(RuntimeError):
    pass


class PPOTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.run: RunContext = build_run(cfg)
        algo = cfg.algorithm
        self.kl_ctrl = make_kl_controller(algo.kl_ctrl.type, algo.kl_ctrl.kl_coef, algo.kl_ctrl.target_kl, algo.kl_ctrl.horizon)
        if self.run.trainer_state.get("kl_ctrl"):
            self.kl_ctrl.load_state_dict(self.run.trainer_state["kl_ctrl"])
        r = cfg.actor_rollout_ref.rollout
        self.sampling = SamplingParams(r.n, r.temperature, r.top_p, r.top_k, r.do_sample, cfg.data.max_response_length)
        v = r.val_kwargs
        self.val_sampling = SamplingParams(v.n, v.temperature, v.top_p, v.top_k, v.do_sample, cfg.data.max_response_length)

    # -- the loop ------------------------------------------------------------------------------
    def fit(self) -> dict:
        run, cfg = self.run, self.cfg
        if run.global_step == 0:
            before = dict(run.trainer_state.pop("warmup_metrics", {}))
            if cfg.trainer.val_before_train and run.val_records:
                before.update(self.validate())
            if before:
                run.tracker.log(before, step=0)
        metrics: dict = {}
        while run.global_step < run.total_steps:
            run.global_step += 1
            t0 = time.perf_counter()
            with run.profiled():
                metrics = self.step(run.loader.next_batch())
            metrics["timing_s/step"] = time.perf_counter() - t0
            metrics["perf/throughput"] = metrics["perf/total_num_tokens"] / metrics["timing_s/step"]
            metrics["training/global_step"] = run.global_step
            metrics["training/epoch"] = run.loader.epoch
            last = run.is_last_step()
            if run.val_records and (last or (cfg.trainer.test_freq > 0 and run.global_step % cfg.trainer.test_freq == 0)):
                metrics.update(self.validate())
            run.tracker.log(metrics, step=run.global_step)
            self._check_nonfinite(metrics)
            if last or (cfg.trainer.save_freq > 0 and run.global_step % cfg.trainer.save_freq == 0):
                run.save_checkpoint(self.kl_ctrl.state_dict())
                _fault_injection_point(run.global_step)
            if last:
                break
        run.finish()
        return metrics

    def step(self, prompts: Batch) -> dict:
        """One RL step on a batch of prompts; returns its metrics."""
        run, cfg, algo = self.run, self.cfg, self.cfg.algorithm
        timer, metrics = StageTimer(), {}
        with timer("gen"):
            batch = run.actor.generate(prompts, self.sampling)
        metrics.update(batch.meta.pop(K.ROLLOUT_METRICS, {}))
        with timer("reward"):
            scores, reward_metrics = score(batch, run.compute_score)
            batch[K.TOKEN_LEVEL_SCORES] = last_token_scores(scores, batch[K.RESPONSE_MASK])
            if algo.adv_estimator == "remax":
                batch[K.REWARD_BASELINES] = self._greedy_baselines(prompts)
        # Critic calls are submitted first: with split placement they run while the actor works.
        if run.critic is not None:
            with timer("values"):
                values = run.critic.submit("compute_values", batch)
        with timer("old_log_prob"):
            batch = run.actor.compute_log_prob(batch)
        if run.need_ref:
            with timer("ref"):
                batch = run.actor.compute_ref_log_prob(batch)
        if run.critic is not None:
            with timer("values"):
                batch[K.VALUES] = values.get()[K.VALUES]
        with timer("adv"):
            metrics.update(self.compute_advantages(batch))
        if run.critic is not None:
            with timer("update_critic"):
                critic_update = run.critic.submit("update_critic", batch)
        with timer("update_actor"):
            metrics.update(run.actor.update_actor(batch))
        if run.critic is not None:
            with timer("update_critic"):
                metrics.update(critic_update.get())
        metrics.update(reward_metrics)
        metrics.update(compute_data_metrics(batch, cfg.data.max_response_length))
        metrics.update(timer.metrics())
        run.log_samples(batch, scores)
        return metrics

    # -- stages that run on the controller -----------------------------------------------------
    def compute_advantages(self, batch: Batch) -> dict:
        """TOKEN_LEVEL_SCORES (-> KL-penalized TOKEN_LEVEL_REWARDS) -> ADVANTAGES, RETURNS."""
        algo, metrics = self.cfg.algorithm, {}
        rewards = batch[K.TOKEN_LEVEL_SCORES]
        if algo.use_kl_in_reward:
            beta = self.kl_ctrl.value
            rewards, current_kl = apply_kl_penalty(
                rewards, batch[K.OLD_LOG_PROBS], batch[K.REF_LOG_PROBS], batch[K.RESPONSE_MASK], beta, algo.kl_penalty
            )
            self.kl_ctrl.update(current_kl, n_steps=len(batch))
            metrics.update({"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta})
        batch[K.TOKEN_LEVEL_REWARDS] = rewards
        estimator = get_adv_estimator(algo.adv_estimator)
        advantages, returns = estimator(
            token_level_rewards=rewards,
            response_mask=batch[K.RESPONSE_MASK],
            index=batch[K.UID],
            values=batch[K.VALUES] if K.VALUES in batch else None,
            reward_baselines=batch[K.REWARD_BASELINES] if algo.adv_estimator == "remax" else None,
            gamma=algo.gamma,
            lam=algo.lam,
            norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
        )
        batch[K.ADVANTAGES], batch[K.RETURNS] = advantages, returns
        return metrics

    def _greedy_baselines(self, prompts: Batch) -> torch.Tensor:
        """ReMax (Li et al. 2023): the reward of the greedy response is each prompt's baseline."""
        greedy = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=self.sampling.max_new_tokens)
        out = self.run.actor.generate(prompts, greedy)
        baseline, _ = score(out, self.run.compute_score)
        return baseline.repeat_interleave(self.sampling.n)  # (B*n,)

    def validate(self) -> dict:
        run = self.run
        rows, metrics = evaluate(
            run.actor, run.val_records, self.val_sampling, run.val_batch_size, run.compute_score, run.pad_token_id
        )
        log_val_samples(run.dir, self.cfg.trainer, run.global_step, rows)
        return metrics

    def _check_nonfinite(self, metrics: dict) -> None:
        limit = self.cfg.trainer.max_nonfinite_steps
        for role in ("actor", "critic"):
            if metrics.get(f"{role}/nonfinite_in_a_row", 0) >= limit:
                raise NonFiniteError(
                    f"{role}: {int(metrics[f'{role}/nonfinite_in_a_row'])} updates in a row had a non-finite loss or "
                    f"gradient norm (trainer.max_nonfinite_steps={limit}); the last good checkpoint is intact. "
                    f"Lower the learning rate ({role} optim.lr), check the reward for inf/NaN, or enable grad_clip."
                )


def _fault_injection_point(step: int) -> None:
    """Tests kill the process right after a checkpoint to prove resume is exact."""
    if os.environ.get("HYBRIDRL_KILL_AFTER_SAVE_STEP") == str(step):
        os.kill(os.getpid(), signal.SIGKILL)
