"""The RL dataflow: PPO, GRPO, RLOO, REINFORCE++ and ReMax on one loop.

One step is the algorithm box of the papers:
    generate -> reward.start -> old log-probs -> reference log-probs -> values -> reward.finish
    -> advantages -> critic update -> actor update
Each stage is a call on a worker group (in-process on one device, Ray processes on several), or
the reward stage (hybridrl/rewards/stage.py: rules, functions, services, the reward model, started
before the log-prob passes and joined after them); this file knows the order of the stages and
nothing about devices or sharding.
"""

from __future__ import annotations

import torch

from hybridrl.algorithms import apply_kl_penalty, estimator_needs, get_adv_estimator, make_kl_controller
from hybridrl.config import Config, ConfigError
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.rewards.stage import RewardStage
from hybridrl.rollout import SamplingParams
from hybridrl.rollout.lengths import from_config as forced_lengths
from hybridrl.tracking.timer import StageTimer
from hybridrl.trainer.async_rollout import OffPolicyRollouts, staleness_correction
from hybridrl.trainer.dynamic_sampling import RolloutSampler
from hybridrl.trainer.loop import NonFiniteError, Trainer
from hybridrl.trainer.metrics import compute_data_metrics
from hybridrl.trainer.mismatch import correct_rollout_mismatch
from hybridrl.trainer.mismatch import enabled as correction_enabled
from hybridrl.trainer.rm_scoring import RewardModelScorer
from hybridrl.trainer.rollout_log import log_val_samples
from hybridrl.trainer.scoring import decode_responses, evaluate
from hybridrl.trainer.setup import build_run

__all__ = ["NonFiniteError", "PPOTrainer"]


class PPOTrainer(Trainer):
    """The RL trainer; the loop around `step` (cadence, logging, checkpoints) is `Trainer.fit`."""

    # Inputs an estimator may declare (`register_adv_estimator(..., needs=)`) and the loop can produce.
    PRODUCIBLE_NEEDS = (K.REWARD_BASELINES,)

    def __init__(self, cfg: Config, **objects):
        """`objects`: the Python API's in-memory pieces, passed to `build_run` (reward_fn, reward_models)."""
        algo = cfg.algorithm
        self.estimator_needs = estimator_needs(algo.adv_estimator)  # extra inputs, e.g. ReMax's greedy baseline
        if unmet := [n for n in self.estimator_needs if n not in self.PRODUCIBLE_NEEDS]:
            raise ConfigError(
                [
                    f"algorithm.adv_estimator={algo.adv_estimator} needs {unmet}, which the RL loop does not "
                    f"produce (it can produce {list(self.PRODUCIBLE_NEEDS)}); register it with those only"
                ]
            )
        super().__init__(cfg, build_run(cfg, **objects))
        self.kl_ctrl = make_kl_controller(algo.kl_ctrl.type, algo.kl_ctrl.kl_coef, algo.kl_ctrl.target_kl, algo.kl_ctrl.horizon)
        if self.run.trainer_state.get("kl_ctrl"):
            self.kl_ctrl.load_state_dict(self.run.trainer_state["kl_ctrl"])
        r = cfg.actor_rollout_ref.rollout
        forced = forced_lengths(r.forced_response_lengths, cfg.data.max_response_length)  # benchmarks' workload, or None
        self.sampling = SamplingParams(r.n, r.temperature, r.top_p, r.top_k, r.do_sample, cfg.data.max_response_length, forced)
        v = r.val_kwargs
        self.val_sampling = SamplingParams(v.n, v.temperature, v.top_p, v.top_k, v.do_sample, cfg.data.max_response_length)
        run = self.run
        model = None if run.reward_model is None else RewardModelScorer(run.reward_model, cfg.reward_model.generative.enable)
        self.reward = RewardStage.from_config(cfg, run.scorer, model, decode_responses(run))
        # the actor's group, or the rollout pool of resource_pool.rollout
        self.sampler = RolloutSampler(cfg, run.rollout, self.reward, self.sampling, run.loader.next_batch)
        if cfg.trainer.mode != "sync":  # generate ahead of the trainer; the loss corrects the staleness
            pool = run.rollout if run.rollout is not run.actor else None  # generates while the actor trains
            self.sampler = OffPolicyRollouts(
                cfg, self.sampler, run.loader.next_batch, lambda: run.global_step, run.total_steps, pool
            )
        self.correction = staleness_correction(cfg)
        self.reuse_log_prob = reuses_on_policy_log_prob(cfg, self.correction)

    def step(self, prompts: Batch) -> dict:
        """One RL step on a batch of prompts; returns its metrics."""
        run, cfg = self.run, self.cfg
        timer, metrics = StageTimer(), {}
        # generate; with DAPO dynamic sampling, more rounds (scored) until enough prompts' samples differ
        batch, prompts, rollout_metrics, early = self.sampler.sample(prompts, timer)
        metrics.update(rollout_metrics)
        if K.REWARD_BASELINES in self.estimator_needs:
            with timer("reward"):
                batch[K.REWARD_BASELINES] = self._greedy_baselines(prompts)
        # The reward's and the critic's calls start first: they run while the actor works.
        reward = self.reward.start(batch, early, timer)
        if run.critic is not None:
            with timer("values"):
                values = run.critic.submit("compute_values", batch)
        with timer("old_log_prob"):
            batch, correction = self.old_log_probs(batch)
        metrics.update(correction)
        if run.need_ref:
            with timer("ref"):
                batch = run.actor.compute_ref_log_prob(batch)
        if run.critic is not None:
            with timer("values"):
                batch[K.VALUES] = values.get()[K.VALUES]
        metrics.update(self.reward.finish(batch, reward, timer))  # TOKEN_LEVEL_SCORES
        with timer("adv"):
            metrics.update(self.compute_advantages(batch))
        if run.critic is not None:
            with timer("update_critic"):
                critic_update = run.critic.submit("update_critic", batch)
        if run.global_step >= cfg.trainer.critic_warmup:  # verl's test: the actor waits for a warmed-up critic
            with timer("update_actor"):
                metrics.update(run.actor.update_actor(batch))
        if run.critic is not None:
            with timer("update_critic"):
                metrics.update(critic_update.get())
        metrics.update(compute_data_metrics(batch, cfg.data.max_response_length))
        metrics.update(timer.metrics())
        run.log_samples(batch, batch[K.TOKEN_LEVEL_SCORES].sum(-1))
        return metrics

    # -- stages that run on the controller -----------------------------------------------------
    def old_log_probs(self, batch: Batch) -> tuple[Batch, dict]:
        """OLD_LOG_PROBS, recomputed by the trainer or (rollout_correction.bypass_mode) the engine's
        own; then the train/rollout mismatch correction when one is configured (trainer/mismatch.py)."""
        rc = self.correction
        if self.reuse_log_prob:  # on-policy: the update's own forward is pi_old (actor.reuse_on_policy_log_prob)
            return batch, {}
        if rc.bypass_mode:
            batch[K.OLD_LOG_PROBS] = batch[K.ROLLOUT_LOG_PROBS]
        else:
            batch = self.run.actor.compute_log_prob(batch)
        return batch, (correct_rollout_mismatch(batch, rc) if correction_enabled(rc) else {})

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
            **{key: batch[key] for key in self.estimator_needs},
            gamma=algo.gamma,
            lam=algo.lam,
            norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
        )
        batch[K.ADVANTAGES], batch[K.RETURNS] = advantages, returns
        return metrics

    def _greedy_baselines(self, prompts: Batch) -> torch.Tensor:
        """ReMax (Li et al. 2023): the reward of the greedy response is each prompt's baseline."""
        greedy = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=self.sampling.max_new_tokens)
        out = self.run.rollout.generate(prompts, greedy)
        baseline = self.reward.score(out).raw  # (B,)
        return baseline.repeat_interleave(self.sampling.n)  # (B*n,)

    def validate(self) -> dict:
        run = self.run
        rows, metrics = evaluate(
            run.rollout, run.val_records, self.val_sampling, run.val_batch_size, self.reward, run.pad_token_id
        )
        log_val_samples(run.dir, self.cfg.trainer, run.global_step, rows)
        return metrics

    def state_dict(self) -> dict:
        return {"kl_ctrl": self.kl_ctrl.state_dict()}


def reuses_on_policy_log_prob(cfg: Config, correction) -> bool:
    """actor.reuse_on_policy_log_prob applies: one epoch over the mini-batches in order (the first
    mini-batch's log-probs in the update are pi_old's; the update computes the later ones' before
    its first optimizer step) and nothing reads pi_old before the update."""
    a = cfg.actor_rollout_ref.actor
    one_pass = a.ppo_epochs == 1 and not a.shuffle
    before_update = cfg.algorithm.use_kl_in_reward or correction_enabled(correction) or correction.bypass_mode
    return a.reuse_on_policy_log_prob and one_pass and not before_update and cfg.trainer.mode == "sync"
