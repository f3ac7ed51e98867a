"""Checks of where roles run and how their ranks split: resource_pool placement, FSDP/HSDP layouts,
Ulysses sequence parallelism, and the dynamic-batch token budgets."""

import json
from pathlib import Path

from ..layout import layout_problem
from ..problem import Problem, suggest
from ..schema import Config
from .batch import SP_KEYS, batch_sizes, role_sp, role_world
from .modes import auto_split_problems, partial_rollout_problems

_A, _R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
_NODES, _GPUS = "trainer.nnodes", "trainer.n_gpus_per_node"


def placement_problems(cfg: Config) -> list[Problem]:
    """resource_pool against the devices there are, and warm-up batches against the dp size."""
    pool, gpus, out = cfg.resource_pool, cfg.trainer.n_gpus_per_node, []
    actor, critic = pool.actor_rollout_ref, pool.critic
    if actor is not None and actor > gpus:
        out.append(suggest("resource_pool.actor_rollout_ref", actor, f"is more than trainer.n_gpus_per_node={gpus}", None))
    if critic is not None:
        if not cfg.critic_enabled:
            out.append(
                Problem(
                    f"resource_pool.critic={critic} but no critic is trained (algorithm.adv_estimator="
                    f"{cfg.algorithm.adv_estimator}); use resource_pool.critic=null",
                    ("resource_pool.critic", "algorithm.adv_estimator"),
                    {"resource_pool.critic": None},
                )
            )
        elif actor is None:
            out.append(_actor_share_missing("resource_pool.critic", critic, gpus))
        elif actor + critic > gpus:
            out.append(
                Problem(
                    f"resource_pool.actor_rollout_ref={actor} + resource_pool.critic={critic} devices per node is more than "
                    f"trainer.n_gpus_per_node={gpus}; use e.g. trainer.n_gpus_per_node={actor + critic}",
                    ("resource_pool.critic", "resource_pool.actor_rollout_ref", "trainer.n_gpus_per_node"),
                    {"trainer.n_gpus_per_node": actor + critic},
                )
            )
    out += _rollout_pool_problems(cfg) + partial_rollout_problems(cfg)
    w, dp = cfg.warmup, cfg.trainer.nnodes * (actor or gpus)
    if w.steps > 0 and w.batch_size % dp:
        fix = max(dp, w.batch_size - w.batch_size % dp)
        out.append(suggest("warmup.batch_size", w.batch_size, f"must divide by the actor's data-parallel size {dp}", fix))
    return out + _layout_problems(cfg)


def _actor_share_missing(key: str, apart: int, gpus: int) -> Problem:
    """A pool apart from the actor's (`key`=`apart` devices per node) with resource_pool.actor_rollout_ref unset."""
    fix = max(gpus - apart, 1)
    return Problem(
        f"{key}={apart} splits the devices, so resource_pool.actor_rollout_ref must say how many of the {gpus} "
        f"per node the actor gets; use e.g. resource_pool.actor_rollout_ref={fix}",
        ("resource_pool.actor_rollout_ref", key),
        {"resource_pool.actor_rollout_ref": fix},
    )


def _rollout_pool_problems(cfg: Config) -> list[Problem]:
    """resource_pool.rollout: rollout replicas on devices of their own (workers/rollout.py)."""
    pool, gpus, out = cfg.resource_pool, cfg.trainer.n_gpus_per_node, []
    rollout, actor = pool.rollout, pool.actor_rollout_ref
    if rollout is None or not (rollout == "auto" or isinstance(rollout, int)):  # a bad value: its range rule says so
        return out
    if rollout == "auto":
        out += auto_split_problems(cfg)
    elif actor is None:
        out.append(_actor_share_missing("resource_pool.rollout", rollout, gpus))
    else:
        used = actor + rollout + (pool.critic or 0 if cfg.critic_enabled else 0) + (pool.reward_model or 0)
        if used > gpus:
            out.append(
                Problem(
                    f"the actor, rollout (and critic / reward model) pools take {used} devices per node, more than "
                    f"trainer.n_gpus_per_node={gpus}; use e.g. trainer.n_gpus_per_node={used}",
                    ("trainer.n_gpus_per_node", "resource_pool.rollout"),
                    {"trainer.n_gpus_per_node": used},
                )
            )
    if cfg.algorithm.name != "rl":
        out.append(
            suggest(
                "resource_pool.rollout",
                rollout,
                f"places rollout replicas, but algorithm.name={cfg.algorithm.name} does not generate",
                None,
            )
        )
    tp = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
    if tp > 1:
        out.append(
            suggest(
                "actor_rollout_ref.rollout.tensor_model_parallel_size",
                tp,
                "is not supported with resource_pool.rollout yet (each rollout rank is one replica)",
                1,
            )
        )
    return out


def _layout_problems(cfg: Config) -> list[Problem]:
    """Sizes that cannot be laid out on a role's ranks (config/layout.py), with a value that works."""
    out, s = [], batch_sizes(cfg)
    roles = [("actor", f"{_A}.fsdp_config.fsdp_size", cfg.actor_rollout_ref.actor.fsdp_config.fsdp_size)]
    if cfg.critic_enabled and cfg.resource_pool.critic:  # colocated, the critic uses the actor's layout
        roles.append(("critic", "critic.model.fsdp_config.fsdp_size", cfg.critic.model.fsdp_config.fsdp_size))
    for role, key, fsdp_size in roles:
        problem = layout_problem(role_world(s, role), fsdp_size, role_sp(cfg, role))
        if problem:
            which, what, fix = problem
            if which == "sp":
                key = SP_KEYS[role]
            out.append(Problem(f"{key}{what}; use e.g. {key}={fix}", (key, _NODES, _GPUS), {key: fix}))
    return out + _replicated_offload_problems(cfg) + _sp_problems(cfg)


def _replicated_offload_problems(cfg: Config) -> list[Problem]:
    """fsdp_size=1 on several ranks replicates the model with no FSDP (distributed/replicate.py), and
    param_offload is FSDP2's CPU offload of the sharded parameters: there is nothing to offload it with.
    (optimizer_offload works on a whole model, as on one device.)"""
    out, s, a, c = [], batch_sizes(cfg), cfg.actor_rollout_ref, cfg.critic.model.fsdp_config
    own_critic = cfg.critic_enabled and cfg.resource_pool.critic
    actor_offload = {f"{_A}.fsdp_config.param_offload": a.actor.fsdp_config.param_offload}
    actor_offload["actor_rollout_ref.ref.fsdp_config.param_offload"] = a.ref.fsdp_config.param_offload
    critic_offload = {"critic.model.fsdp_config.param_offload": c.param_offload} if cfg.critic_enabled else {}
    groups = [("actor", f"{_A}.fsdp_config.fsdp_size", a.actor.fsdp_config.fsdp_size, actor_offload)]
    if own_critic:  # its own ranks, its own fsdp_size
        groups.append(("critic", "critic.model.fsdp_config.fsdp_size", c.fsdp_size, critic_offload))
    else:  # colocated, the critic uses the actor's layout
        actor_offload.update(critic_offload)
    for role, size_key, fsdp_size, offload in groups:
        world = role_world(s, role)
        if fsdp_size != 1 or world == 1:
            continue
        for key in (k for k, on in offload.items() if on):
            out.append(
                Problem(
                    f"{key}=true needs FSDP's sharded parameters, but {size_key}=1 replicates the whole model on each "
                    f"of the role's {world} ranks (no FSDP); use {key}=false, or {size_key}=-1 to shard",
                    (key, size_key),
                    {key: False},
                )
            )
    return out


def _sp_problems(cfg: Config) -> list[Problem]:
    """Sequence parallelism: one degree per process, heads divisible by it, not the flex backend."""
    out, a = [], cfg.actor_rollout_ref
    sp = role_sp(cfg, "actor")
    if role_sp(cfg, "ref") != sp:
        key = SP_KEYS["ref"]
        out.append(
            Problem(
                f"{key}={role_sp(cfg, 'ref')}: the reference runs in the actor's processes, so it uses the actor's "
                f"sequence parallelism ({sp}); remove {key} or set it to {sp}",
                (key,),
                {key: sp},
            )
        )
    if cfg.critic_enabled and not cfg.resource_pool.critic and role_sp(cfg, "critic") != sp:
        key = SP_KEYS["critic"]
        out.append(
            Problem(
                f"{key}={role_sp(cfg, 'critic')}: a colocated critic shares the actor's processes and its sequence "
                f"parallelism ({sp}); set {key}={sp}, or give the critic its own resource_pool.critic",
                (key,),
                {key: sp},
            )
        )
    # Padded passes (use_remove_padding=false) run whole sequences on every rank of an sp group:
    # the same values and gradients (the normalizers count every rank), without the memory saving.
    for role in ("actor", "critic") if cfg.critic_enabled else ("actor",):
        degree = role_sp(cfg, role)
        if degree == 1:
            continue
        if a.model.packed_attn_backend == "flex":
            key = "actor_rollout_ref.model.packed_attn_backend"
            out.append(
                Problem(
                    f"{SP_KEYS[role]}={degree} runs the varlen or sdpa packed attention; set {key}=auto", (key,), {key: "auto"}
                )
            )
        path = (cfg.critic.model.path or a.model.path) if role == "critic" else a.model.path
        heads = _model_heads(path)
        if heads and heads % degree:
            fix = max(d for d in range(1, degree + 1) if heads % d == 0)
            out.append(
                Problem(
                    f"{SP_KEYS[role]}={degree}: the model's {heads} attention heads do not split over {degree} "
                    f"devices; use e.g. {SP_KEYS[role]}={fix}",
                    (SP_KEYS[role],),
                    {SP_KEYS[role]: fix},
                )
            )
    return out


def _model_heads(path: str | None) -> int | None:
    """num_attention_heads of the model directory's config.json; None when there is none to read."""
    file = Path(path or "") / "config.json"
    if not path or not file.is_file():
        return None
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    heads = raw.get("text_config", raw).get("num_attention_heads")
    return heads if isinstance(heads, int) and heads > 0 else None


def token_budget_problems(cfg: Config) -> list[Problem]:
    """With use_dynamic_bsz, the longest possible sequence must fit one micro-batch's budget.
    A budget equal to the one it inherits from is treated as inherited (as `_sizes` does, since
    loading resolves the config) and reported once, under the key it comes from."""
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    a, c = cfg.actor_rollout_ref, cfg.critic
    actor = (f"{_A}.ppo_max_token_len_per_gpu", a.actor.use_dynamic_bsz, a.actor.ppo_max_token_len_per_gpu, None)
    # (key, dynamic on, budget, the entry it inherits the budget from)
    budgets = [actor]
    for part, section in ((a.rollout, _R), (a.ref, "actor_rollout_ref.ref")):
        on = a.actor.use_dynamic_bsz if part.log_prob_use_dynamic_bsz is None else part.log_prob_use_dynamic_bsz
        inherited = part.log_prob_max_token_len_per_gpu in (None, a.actor.ppo_max_token_len_per_gpu)
        budget = a.actor.ppo_max_token_len_per_gpu if inherited else part.log_prob_max_token_len_per_gpu
        budgets.append((f"{section}.log_prob_max_token_len_per_gpu", on, budget, actor[0] if inherited else None))
    if cfg.critic_enabled:
        critic_on = a.actor.use_dynamic_bsz if c.use_dynamic_bsz is None else c.use_dynamic_bsz
        budgets.append(("critic.ppo_max_token_len_per_gpu", critic_on, c.ppo_max_token_len_per_gpu, None))
        inherited = c.forward_max_token_len_per_gpu in (None, c.ppo_max_token_len_per_gpu)
        budgets.append(
            (
                "critic.forward_max_token_len_per_gpu",
                critic_on,
                c.ppo_max_token_len_per_gpu if inherited else c.forward_max_token_len_per_gpu,
                "critic.ppo_max_token_len_per_gpu" if inherited else None,
            )
        )
    out, reported = [], set()
    for key, on, budget, source in budgets:
        if not on or budget is None or not 1 <= budget < longest:
            continue
        if source in reported:
            continue  # the same number, already reported under the key it comes from
        key = source or key
        reported.add(key)
        out.append(
            Problem(
                f"{key}={budget} is below the longest possible sequence, data.max_prompt_length + "
                f"data.max_response_length = {longest} tokens, which must fit one micro-batch; use e.g. {key}={longest}",
                (key, "data.max_prompt_length", "data.max_response_length"),
                {key: longest},
            )
        )
    return out
