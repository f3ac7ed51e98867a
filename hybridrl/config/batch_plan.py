"""The batch plan: how global batch sizes become per-device ones (`plan_batches`).

Users state intent in global terms (prompts per step, samples per prompt, prompts per
optimizer step); `plan_batches` derives what each device does, with verl's semantics, for a
config that passes every check: the batch-size rules and their fix search are in
checks/batch.py, and a plan is refused for any batch-size problem `find_problems` reports.
"""

import copy
import math
from dataclasses import dataclass

from .checks.batch import BATCH_KEYS, batch_sizes, role_sp, role_world
from .layout import ParallelLayout, build_layout
from .names import PREFERENCE_ALGORITHMS
from .schema import Config, ConfigError, resolve
from .validate import find_problems


@dataclass(frozen=True)
class RolePlan:
    """How one trained role (actor or critic) splits a step's sequences."""

    mini_batch_prompts: int  # ppo_mini_batch_size
    mini_batch_sequences: int  # x rollout.n
    per_device_mini_batch: int  # / dp: sequences one device contributes to an optimizer step
    micro_batch: int  # sequences per forward/backward pass on one device
    grad_accum: int  # micro-batches per optimizer step
    num_mini_batches: int  # optimizer steps per epoch = train_batch_size / ppo_mini_batch_size
    epochs: int  # ppo_epochs
    optimizer_steps_per_step: int  # num_mini_batches x epochs
    tokens_per_micro_batch: int  # micro_batch x (max_prompt_length + max_response_length), padded bound
    dp: int = 1  # this role's data-parallel size (its own devices with split placement): layout.dp
    layout: ParallelLayout = ParallelLayout(1)  # how the role's ranks split into dp x sp (FSDP / HSDP), rollout x tp


@dataclass(frozen=True)
class BatchPlan:
    """Per-step and per-device batch sizes derived from the global ones."""

    nnodes: int
    devices_per_node: int  # the actor's: resource_pool.actor_rollout_ref or n_gpus_per_node
    dp: int  # the actor's data-parallel size: nnodes x devices_per_node
    prompts_per_step: int  # data.train_batch_size
    sequences_per_step: int  # x rollout.n
    sequences_per_device: int  # / dp
    max_num_seqs: int  # rollout.max_num_seqs
    generation_rounds: int  # ceil(sequences_per_device / max_num_seqs)
    tokens_per_sequence: int  # max_prompt_length + max_response_length
    actor: RolePlan
    critic: RolePlan | None  # None when no critic is trained (adv_estimator != gae)
    rollout_log_prob_micro_batch: int  # sequences per old-log-prob forward pass on one device
    rollout_log_prob_passes: int
    uses_ref: bool  # a KL term needs reference log-probs (actor.use_kl_loss or algorithm.use_kl_in_reward)
    ref_log_prob_micro_batch: int
    ref_log_prob_passes: int
    reward_model_layout: ParallelLayout | None = None  # its own pool (Config.reward_model_pool); None = the actor's
    rollout_layout: ParallelLayout | None = None  # resource_pool.rollout's replicas, one per rank; None = the actor's (or auto)


def plan_batches(cfg: Config) -> BatchPlan:
    """The batch plan; raises ConfigError naming the keys to change when sizes do not fit."""
    problems = [p for p in find_problems(cfg) if p.keys[0] in BATCH_KEYS]
    if problems:
        raise ConfigError([p.message for p in problems])
    r = resolve(copy.deepcopy(cfg))
    if r.algorithm.name != "rl":
        _as_offline_plan(r)
    a, rollout = r.actor_rollout_ref, r.actor_rollout_ref.rollout
    sizes = batch_sizes(r)
    actor_layout = build_layout(
        role_world(sizes, "actor"), a.actor.fsdp_config.fsdp_size, sp=role_sp(r, "actor"), tp=rollout.tensor_model_parallel_size
    )
    critic_layout = (
        build_layout(role_world(sizes, "critic"), r.critic.model.fsdp_config.fsdp_size, sp=role_sp(r, "critic"))
        if r.critic_enabled and r.resource_pool.critic
        else actor_layout
    )
    dp = actor_layout.dp  # the actor's data-parallel size: rollout and log-probs run there
    per_device = r.data.train_batch_size * rollout.n // dp
    seq_tokens = r.data.max_prompt_length + r.data.max_response_length

    def role(mini: int, micro: int | None, epochs: int, layout: ParallelLayout) -> RolePlan:
        dp = layout.dp
        per_device_mini = mini * rollout.n // dp
        micro = micro or per_device_mini
        steps = r.data.train_batch_size // mini
        return RolePlan(
            mini_batch_prompts=mini,
            mini_batch_sequences=mini * rollout.n,
            per_device_mini_batch=per_device_mini,
            micro_batch=micro,
            grad_accum=per_device_mini // micro,
            num_mini_batches=steps,
            epochs=epochs,
            optimizer_steps_per_step=steps * epochs,
            tokens_per_micro_batch=micro * seq_tokens,
            dp=dp,
            layout=layout,
        )

    def log_prob_micro(configured: int | None) -> int:
        return min(configured or per_device, per_device)

    rollout_micro = log_prob_micro(rollout.log_prob_micro_batch_size_per_gpu)
    ref_micro = log_prob_micro(a.ref.log_prob_micro_batch_size_per_gpu)
    critic = r.critic
    return BatchPlan(
        nnodes=r.trainer.nnodes,
        devices_per_node=actor_layout.world // r.trainer.nnodes,
        dp=dp,
        prompts_per_step=r.data.train_batch_size,
        sequences_per_step=r.data.train_batch_size * rollout.n,
        sequences_per_device=per_device,
        max_num_seqs=rollout.max_num_seqs,
        generation_rounds=math.ceil(per_device / rollout.max_num_seqs),
        tokens_per_sequence=seq_tokens,
        actor=role(a.actor.ppo_mini_batch_size, a.actor.ppo_micro_batch_size_per_gpu, a.actor.ppo_epochs, actor_layout),
        critic=role(critic.ppo_mini_batch_size, critic.ppo_micro_batch_size_per_gpu, critic.ppo_epochs, critic_layout)
        if r.critic_enabled
        else None,
        rollout_log_prob_micro_batch=rollout_micro,
        rollout_log_prob_passes=math.ceil(per_device / rollout_micro),
        uses_ref=a.actor.use_kl_loss or r.algorithm.use_kl_in_reward or r.algorithm.name in PREFERENCE_ALGORITHMS,
        ref_log_prob_micro_batch=ref_micro,
        ref_log_prob_passes=math.ceil(per_device / ref_micro),
        reward_model_layout=build_layout(math.prod(r.reward_model_pool), -1) if r.reward_model_pool else None,
        rollout_layout=build_layout(r.resource_pool.rollout * r.trainer.nnodes, -1)
        if isinstance(r.resource_pool.rollout, int)  # auto: chosen after calibration (trainer/calibration.py)
        else None,
    )


# dpo / kto / sft: the RL plan with rollout.n = 1, one mini-batch of the whole step and one epoch
# (checks/batch.py has their batch rules).
def _as_offline_plan(r: Config) -> None:
    a = r.actor_rollout_ref
    a.rollout.n = 1
    a.actor.ppo_mini_batch_size = r.data.train_batch_size
    a.actor.ppo_epochs = 1
