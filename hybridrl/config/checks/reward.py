"""Checks of the reward keys: the custom function, the remote scorer, the reward-model worker and the
rule-based reward manager (docs/reward_models.md, hybridrl/rewards/)."""

import math

from ..names import REWARD_MANAGERS, REWARD_MODEL_STRATEGIES
from ..problem import Problem, suggest
from ..schema import Config


def notices(cfg: Config) -> list[str]:
    """launch_reward_fn_async where the step needs the scores at once."""
    a = cfg.algorithm
    if cfg.reward_model.launch_reward_fn_async and (a.filter_groups.enable or cfg.trainer.mode != "sync"):
        why = (
            "algorithm.filter_groups.enable=true (which groups to keep needs the scores)"
            if a.filter_groups.enable
            else f"trainer.mode={cfg.trainer.mode} (the rollout producer scores)"
        )
        return [f"reward_model.launch_reward_fn_async=true: scoring runs in the foreground with {why}"]
    return []


def custom_function_problems(cfg: Config) -> list[Problem]:
    """custom_reward_function.*: the function to call and the processes that call it."""
    out = []
    reward = cfg.custom_reward_function
    if reward.path and not reward.name:
        out.append(suggest("custom_reward_function.name", reward.name, f"must name a function in {reward.path}", "compute_score"))
    if not (isinstance(reward.timeout_s, (int, float)) and 0 < reward.timeout_s < float("inf")):
        out.append(
            suggest(
                "custom_reward_function.timeout_s",
                reward.timeout_s,
                "must be a positive number of seconds (one reward call's limit)",
                10.0,
            )
        )
    if not (isinstance(reward.num_workers, int) and reward.num_workers >= 1):
        out.append(suggest("custom_reward_function.num_workers", reward.num_workers, "must be 1 or more processes", 2))
    return out


def remote_problems(cfg: Config) -> list[Problem]:
    """custom_reward_function.remote.* (hybridrl/rewards/remote.py)."""
    c, key = cfg.custom_reward_function, "custom_reward_function.remote"
    remote, out = c.remote, []
    if remote.url is None:
        return out
    if not (isinstance(remote.url, str) and remote.url.startswith(("http://", "https://"))):
        out.append(suggest(f"{key}.url", remote.url, "must be an http:// or https:// URL", "http://127.0.0.1:8000/score"))
    if c.path:
        out.append(
            Problem(
                f"custom_reward_function.path={c.path} and {key}.url={remote.url} both set: score with one; "
                f"drop the path (custom_reward_function.path=null) or the URL ({key}.url=null)",
                ("custom_reward_function.path", f"{key}.url"),
                {f"{key}.url": None},
            )
        )
    positive = {"timeout_s": 10.0, "max_concurrency": 8, "circuit_breaker_cooldown_s": 30.0}
    for name, fix in positive.items():
        value = getattr(remote, name)
        if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
            out.append(suggest(f"{key}.{name}", value, "must be positive", fix))
    for name, fix in {"retries": 2, "backoff_s": 0.5, "circuit_breaker_failures": 5}.items():
        value = getattr(remote, name)
        if not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
            out.append(suggest(f"{key}.{name}", value, "must be 0 or more", fix))
    return out


def reward_model_problems(cfg: Config) -> list[Problem]:
    """reward_model.* (the worker) and algorithm.name=rm (docs/reward_models.md)."""
    rm, out = cfg.reward_model, []
    if rm.strategy not in REWARD_MODEL_STRATEGIES:
        out.append(suggest("reward_model.strategy", rm.strategy, "is not one of fsdp, fsdp2 (Megatron is not supported)", "fsdp"))
    for key in ("reward_weight", "rule_weight"):
        if not math.isfinite(getattr(rm, key)):
            out.append(
                suggest(
                    f"reward_model.{key}", getattr(rm, key), "must be a finite number", 1.0 if key == "reward_weight" else 0.0
                )
            )
    own = cfg.reward_model_pool
    if own and not rm.enable:
        key = "resource_pool.reward_model" if cfg.resource_pool.reward_model else "reward_model.enable_resource_pool"
        out.append(Problem(f"{key} places a reward model, but reward_model.enable=false; set reward_model.enable=true", (key,)))
    if own and own[1] != cfg.trainer.nnodes:
        out.append(
            suggest(
                "reward_model.nnodes",
                rm.nnodes,
                f"differs from trainer.nnodes={cfg.trainer.nnodes}; pools span the same nodes",
                0,
            )
        )
    # verl's spelling (reward_model.enable_resource_pool) adds the reward model's devices to trainer.n_gpus_per_node,
    # the actor's; resource_pool.reward_model takes them out of trainer.n_gpus_per_node, as resource_pool.critic does.
    if own and cfg.resource_pool.reward_model:
        pool, gpus = cfg.resource_pool, cfg.trainer.n_gpus_per_node
        actor = pool.actor_rollout_ref
        used = (actor or 0) + (pool.critic or 0 if cfg.critic_enabled else 0) + own[0]
        if actor is None:
            out.append(
                Problem(
                    f"the reward model's own pool ({own[0]} devices per node) splits the devices, so "
                    f"resource_pool.actor_rollout_ref must say how many of the {gpus} per node the actor gets; use e.g. "
                    f"resource_pool.actor_rollout_ref={max(gpus - own[0], 1)}",
                    ("resource_pool.actor_rollout_ref", "resource_pool.reward_model"),
                    {"resource_pool.actor_rollout_ref": max(gpus - own[0], 1)},
                )
            )
        elif used > gpus:
            out.append(
                Problem(
                    f"actor + critic + reward model pools take {used} devices per node, more than "
                    f"trainer.n_gpus_per_node={gpus}; use e.g. trainer.n_gpus_per_node={used}",
                    ("trainer.n_gpus_per_node", "resource_pool.reward_model"),
                    {"trainer.n_gpus_per_node": used},
                )
            )
    if cfg.algorithm.name == "rm" and cfg.warmup.steps > 0:
        out.append(suggest("warmup.steps", cfg.warmup.steps, "is a policy warm-up; algorithm.name=rm trains a reward model", 0))
    return out


def manager_problems(cfg: Config, r: Config) -> list[Problem]:
    """reward_model.reward_manager and the DAPO overlong buffer (hybridrl/rewards/assembly.py, rewards/stage.py)."""
    out = []
    rm = r.reward_model
    if rm.reward_manager not in REWARD_MANAGERS:
        out.append(
            Problem(
                f"reward_model.reward_manager={rm.reward_manager} is not one of {', '.join(REWARD_MANAGERS)}; "
                "use e.g. reward_model.reward_manager=naive",
                ("reward_model.reward_manager",),
                {"reward_model.reward_manager": "naive"},
            )
        )
    if rm.reward_manager == "batch" and not r.custom_reward_function.path:
        out.append(
            Problem(
                "reward_model.reward_manager=batch calls custom_reward_function once with lists for the whole batch; set "
                "custom_reward_function.path to a file whose function takes data_sources, solution_strs, ground_truths, "
                "extra_infos, or use reward_model.reward_manager=naive",
                ("reward_model.reward_manager", "custom_reward_function.path"),
                {"reward_model.reward_manager": "naive"},
            )
        )
    ob = rm.overlong_buffer
    max_len = r.data.max_response_length
    if ob.enable and not 0 < ob.len <= max_len:
        fix = max(1, max_len // 4)
        out.append(
            Problem(
                f"reward_model.overlong_buffer.len={ob.len} must be in [1, data.max_response_length={max_len}] when the "
                f"buffer is enabled; use e.g. reward_model.overlong_buffer.len={fix}",
                ("reward_model.overlong_buffer.len",),
                {"reward_model.overlong_buffer.len": fix},
            )
        )
    if ob.penalty_factor < 0:
        out.append(
            Problem(
                f"reward_model.overlong_buffer.penalty_factor={ob.penalty_factor} must be >= 0; use e.g. 1.0",
                ("reward_model.overlong_buffer.penalty_factor",),
                {"reward_model.overlong_buffer.penalty_factor": 1.0},
            )
        )
    given = cfg.custom_reward_function.reward_kwargs.get("max_resp_len")
    if given is not None and given != max_len:
        out.append(
            Problem(
                f"custom_reward_function.reward_kwargs.max_resp_len={given} differs from data.max_response_length={max_len}; "
                "the overlong buffer counts from data.max_response_length: drop max_resp_len or make them equal",
                ("custom_reward_function.reward_kwargs",),
                None,
            )
        )
    return out
