"""`hybridrl explain`: how the global batch sizes of a config turn into per-device work."""

import copy
from collections.abc import Sequence
from pathlib import Path

from .batch_plan import BatchPlan, RolePlan, plan_batches
from .loader import config_from_dict, load_config, to_dict
from .schema import Config, ConfigError, resolve


def explain(cfg_or_path: Config | str | Path | None = None, overrides: Sequence[str] = ()) -> str:
    """The batch plan of a config (a Config, or a YAML path plus overrides), or, when the config
    has problems, every one of them instead. Never raises ConfigError."""
    try:
        if isinstance(cfg_or_path, Config):
            cfg = config_from_dict(to_dict(cfg_or_path), overrides)
        else:
            cfg = load_config(cfg_or_path, overrides)
    except ConfigError as e:
        return str(e)
    return explain_text(cfg)


def _multi_turn_rows(cfg: Config) -> list[str]:
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return []
    parts = [f"format {mt.format}"]
    if mt.tool_config_path:
        parts.append(f"tools from {mt.tool_config_path}")
    if mt.interaction_config_path:
        parts.append(f"interaction from {mt.interaction_config_path}")
    turns = f"up to {mt.max_assistant_turns or 'any number of'} model turn(s)"
    budget = f"{cfg.data.max_response_length} response tokens in all (model + tool/user tokens)"
    return [f"  multi-turn rollouts (rollout.multi_turn): {', '.join(parts)}; {turns}, {budget}"]


def explain_text(cfg: Config) -> str:
    """The batch plan of a valid config as a table; raises ConfigError when it has none."""
    p = plan_batches(cfg)
    if cfg.algorithm.name != "rl":
        return _offline_text(cfg, p)
    a = cfg.actor_rollout_ref
    lines = [
        f"Batch plan (data-parallel size {p.dp} = {p.nnodes} node(s) x {p.devices_per_node} device(s))",
        *_placement(cfg, p),
        _row("prompts per step", "data.train_batch_size", p.prompts_per_step),
        _row("sequences per step", f"x actor_rollout_ref.rollout.n ({a.rollout.n})", p.sequences_per_step),
        _row(
            "...per device",
            f"{p.sequences_per_step} / dp {p.dp}",
            p.sequences_per_device,
            f"generated in {p.generation_rounds} round(s) of up to {p.max_num_seqs} (rollout.max_num_seqs)",
        ),
        *_multi_turn_rows(cfg),
        "",
        "actor (actor_rollout_ref.actor)",
        *_role_rows(cfg, p, p.actor, a.actor.ppo_micro_batch_size_per_gpu),
        *_budget_rows("actor_rollout_ref.actor", a.actor.use_dynamic_bsz, a.actor.ppo_max_token_len_per_gpu),
        "",
    ]
    if p.critic is None:
        lines.append(f"critic: off (algorithm.adv_estimator={cfg.algorithm.adv_estimator})")
    else:
        c = cfg.critic
        lines += [
            "critic (critic)",
            *_role_rows(cfg, p, p.critic, c.ppo_micro_batch_size_per_gpu),
            *_budget_rows("critic", c.use_dynamic_bsz, c.ppo_max_token_len_per_gpu),
        ]
    lines += [
        "",
        "log-prob passes per device (actor_rollout_ref.{rollout,ref}.log_prob_micro_batch_size_per_gpu)",
        _log_prob_row(
            "rollout (old log-probs)",
            "rollout",
            a.rollout.log_prob_micro_batch_size_per_gpu,
            p.sequences_per_device,
            p.rollout_log_prob_micro_batch,
            p.rollout_log_prob_passes,
        ),
    ]
    r = resolve(copy.deepcopy(cfg)).actor_rollout_ref
    lines += _budget_rows(
        "actor_rollout_ref.rollout", r.rollout.log_prob_use_dynamic_bsz, r.rollout.log_prob_max_token_len_per_gpu, "log_prob_"
    )
    if p.uses_ref:
        lines += _budget_rows(
            "actor_rollout_ref.ref", r.ref.log_prob_use_dynamic_bsz, r.ref.log_prob_max_token_len_per_gpu, "log_prob_"
        )
        lines.append(
            _log_prob_row(
                "reference",
                "ref",
                a.ref.log_prob_micro_batch_size_per_gpu,
                p.sequences_per_device,
                p.ref_log_prob_micro_batch,
                p.ref_log_prob_passes,
            )
        )
    else:
        lines.append("  reference: off (actor.use_kl_loss=false, algorithm.use_kl_in_reward=false)")
    return "\n".join(lines + _length_rows(cfg, p, "prompts"))


def _placement(cfg: Config, p: BatchPlan) -> list[str]:
    """Where the roles run and how their ranks are laid out, when that is more than one device
    (docs/distributed.md); the rollout pool's line last."""
    lines = _roles_placement(cfg, p)
    if cfg.resource_pool.rollout == "auto":
        lines.append(
            f"rollout pool (resource_pool.rollout=auto): chosen after {cfg.resource_pool.rollout_auto_steps} step(s) run "
            "colocated in sync mode, from their generation and training times (docs/async.md)"
        )
    if p.rollout_layout is not None:
        when = (
            "in turn with the actor's training (trainer.mode=sync; one_step_off / async overlap the two)"
            if cfg.trainer.mode == "sync"
            else f"while the actor trains (trainer.mode={cfg.trainer.mode})"
        )
        lines.append(
            f"rollout pool (resource_pool.rollout): {cfg.resource_pool.rollout} device(s) per node apart from the "
            f"actor's, {p.rollout_layout.world} replica(s) generating {when}; the actor's rank 0 sends them the "
            "weights before each generation (docs/async.md)"
        )
    return lines


def _roles_placement(cfg: Config, p: BatchPlan) -> list[str]:
    rm = [] if p.reward_model_layout is None else [f"layout (reward model): {p.reward_model_layout.describe()}"]
    rm_text = f"; reward model on {cfg.reward_model_pool[0]}" if rm else ""
    if p.critic is not None and cfg.resource_pool.critic:
        return [
            f"placement: split (resource_pool): actor, rollout, reference on {p.devices_per_node} device(s) "
            f"per node; critic on {cfg.resource_pool.critic} (data-parallel size {p.critic.dp}){rm_text}",
            f"layout (actor): {p.actor.layout.describe()}",
            f"layout (critic): {p.critic.layout.describe()}",
            *rm,
        ]
    if rm:
        return [
            f"placement: split: actor, rollout, reference{', critic' if p.critic else ''} on {p.devices_per_node} "
            f"device(s) per node{rm_text} (docs/reward_models.md)",
            f"layout (actor): {p.actor.layout.describe()}",
            *rm,
        ]
    if p.actor.layout.world > 1:
        return [
            "placement: colocated: every role on every device, one worker process per device (Ray, FSDP2)",
            f"layout: {p.actor.layout.describe()}",
        ]
    return []


def _length_rows(cfg: Config, p: BatchPlan, rows: str) -> list[str]:
    t = cfg.trainer
    lines = ["", "training length"]
    if t.total_training_steps is not None:
        lines.append(_row("steps", "trainer.total_training_steps", t.total_training_steps))
    else:
        lines.append(
            f"  trainer.total_epochs ({t.total_epochs}) x (training {rows} // {p.prompts_per_step}) "
            "steps; the count is known once the data is loaded"
        )
    return lines


def _offline_text(cfg: Config, p: BatchPlan) -> str:
    """DPO / KTO / SFT: no generation; one optimizer step per data.train_batch_size rows."""
    name, pref = cfg.algorithm.name, cfg.preference
    rows = "pairs" if name in ("dpo", "rm") else "examples"
    seqs = 2 if name in ("dpo", "rm") else 1  # chosen + rejected
    r, micro = p.actor, cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    lengths = f"({cfg.data.max_prompt_length} + {cfg.data.max_response_length})"
    lines = [
        f"Batch plan for algorithm.name={name} (data-parallel size {p.dp} = {p.nnodes} node(s) x {p.devices_per_node} device(s))",
        *([f"layout: {p.actor.layout.describe()}"] if p.actor.layout.world > 1 else []),
        _row(f"{rows} per step", "data.train_batch_size", p.prompts_per_step, "= 1 optimizer step per step"),
        _row("...per device", f"{p.prompts_per_step} / dp {p.dp}", r.per_device_mini_batch, rows),
        _row(
            "micro-batches / device",
            f"{r.per_device_mini_batch} / ppo_micro_batch_size_per_gpu ({_given(micro, r.micro_batch)})",
            r.grad_accum,
            f"(gradient accumulation {r.grad_accum})",
        ),
        _row(
            "tokens per micro-batch",
            f"{r.micro_batch}{' x 2' if seqs == 2 else ''} x {lengths}",
            r.tokens_per_micro_batch * seqs,
            "(upper bound, padded)",
        ),
        "",
    ]
    if name == "sft":
        lines.append("loss: token-mean negative log-likelihood of the response tokens; reference: off")
    else:
        loss = (
            f"dpo {pref.loss_type}, beta {pref.beta}, label_smoothing {pref.label_smoothing}"
            if name == "dpo"
            else f"kto, beta {pref.beta}, desirable_weight {pref.desirable_weight}, undesirable_weight {pref.undesirable_weight}"
        )
        lines.append(f"loss: {loss} (preference.*)")
        passes = f"{seqs} x {p.ref_log_prob_passes}" if name == "dpo" else f"2 x {p.ref_log_prob_passes}"
        when = (
            "once for the whole training set before step 1 (preference.precompute_ref_log_probs=true)"
            if pref.precompute_ref_log_probs
            else f"every step: {passes} forward pass(es) of up to "
            f"{p.ref_log_prob_micro_batch} sequences (actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu)"
        )
        lines.append(f"reference log-probs (frozen copy of the initial policy): {when}")
        if name == "kto":
            lines.append("KL reference point z0: every step, a no-grad policy pass over mismatched prompt/completion pairs")
    return "\n".join(lines + _length_rows(cfg, p, rows))


def _row(label: str, formula: str, value: int, note: str = "") -> str:
    return f"  {label:<24}{formula:<48}{value:>8}  {note}".rstrip()


def _given(configured: int | None, used: int) -> str:
    return f"null -> {used}" if configured is None else str(configured)


def _role_rows(cfg: Config, p: BatchPlan, r: RolePlan, micro: int | None) -> list[str]:
    steps = f"per epoch x {r.epochs} epoch(s) = {r.optimizer_steps_per_step} optimizer steps per step"
    lengths = f"({cfg.data.max_prompt_length} + {cfg.data.max_response_length})"
    return [
        _row("mini-batches", f"{p.prompts_per_step} / ppo_mini_batch_size ({r.mini_batch_prompts})", r.num_mini_batches, steps),
        _row(
            "...per device",
            f"{r.mini_batch_prompts} x {cfg.actor_rollout_ref.rollout.n} / dp {r.dp}",
            r.per_device_mini_batch,
            "sequences",
        ),
        _row(
            "micro-batches / device",
            f"{r.per_device_mini_batch} / ppo_micro_batch_size_per_gpu ({_given(micro, r.micro_batch)})",
            r.grad_accum,
            f"(gradient accumulation {r.grad_accum})",
        ),
        _row("tokens per micro-batch", f"{r.micro_batch} x {lengths}", r.tokens_per_micro_batch, "(upper bound, padded)"),
    ]


def _budget_rows(section: str, on: bool, budget: int, prefix: str = "ppo_") -> list[str]:
    """With use_dynamic_bsz the micro-batch rows above do not apply: say what does."""
    if not on:
        return []
    return [
        f"  -> {section}.{prefix.replace('ppo_', '')}use_dynamic_bsz=true: micro-batches are filled up to "
        f"{section}.{prefix}max_token_len_per_gpu={budget} real tokens each, not by sequence count"
    ]


def _log_prob_row(label: str, section: str, configured: int | None, per_device: int, micro: int, passes: int) -> str:
    formula = f"{per_device} / {section} micro-batch ({_given(configured, micro)})"
    return _row(label, formula, passes, f"forward pass(es) of {micro} sequences")
