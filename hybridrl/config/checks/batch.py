"""Checks of the batch sizes: the rules the batch plan (batch_plan.py) needs, and the search for a fix.

Every batch-size problem names the keys involved and suggests a value that works (`Problem.fix`),
chosen so that applying it does not break any other batch-size rule (`_removes`).
"""

import math
from typing import Any

from ..names import ALGORITHM_NAMES, GROUP_ESTIMATORS
from ..problem import Problem, get
from ..schema import Config, show

_A, _R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
# The keys the batch plan is computed from.
_TRAIN, _N = "data.train_batch_size", f"{_R}.n"
_NODES, _GPUS = "trainer.nnodes", "trainer.n_gpus_per_node"
_POOL = {"actor": "resource_pool.actor_rollout_ref", "critic": "resource_pool.critic"}
_MINI = {"actor": f"{_A}.ppo_mini_batch_size", "critic": "critic.ppo_mini_batch_size"}
_MICRO = {"actor": f"{_A}.ppo_micro_batch_size_per_gpu", "critic": "critic.ppo_micro_batch_size_per_gpu"}
_LOG_PROB_MICRO = {
    "rollout": f"{_R}.log_prob_micro_batch_size_per_gpu",
    "ref": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
}
PLAN_INPUTS = {_TRAIN, _N, _NODES, _GPUS, *_MINI.values(), *_MICRO.values(), *_POOL.values()}
BATCH_KEYS = {
    _TRAIN,
    _N,
    _NODES,
    _GPUS,
    *_MINI.values(),
    *_MICRO.values(),
    *_LOG_PROB_MICRO.values(),
    *_POOL.values(),
    "data.max_prompt_length",
    "data.max_response_length",
    f"{_R}.max_num_seqs",
    f"{_A}.ppo_epochs",
    "critic.ppo_epochs",
    "algorithm.adv_estimator",
    "algorithm.name",
    f"{_A}.fsdp_config.fsdp_size",
    "critic.model.fsdp_config.fsdp_size",
}

SP_KEYS = {
    "actor": f"{_A}.ulysses_sequence_parallel_size",
    "ref": "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
    "critic": "critic.ulysses_sequence_parallel_size",
}


def role_sp(cfg: Config, role: str) -> int:
    """A role's Ulysses degree (null ref/critic degrees are the actor's); 1 for a value that is no
    positive integer (the range check names it)."""
    a = cfg.actor_rollout_ref
    value = {"actor": a.actor, "ref": a.ref, "critic": cfg.critic}[role].ulysses_sequence_parallel_size
    if value is None:
        value = a.actor.ulysses_sequence_parallel_size
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


# The batch rules work on a flat {key: int} view so that a candidate fix can be tried by
# changing one entry. A critic mini-batch of None inherits the actor's.
_Sizes = dict[str, Any]
_Context = tuple[bool, bool]  # (critic trained, estimator needs groups)


def batch_sizes(cfg: Config) -> _Sizes:
    keys = [_TRAIN, _N, _NODES, _GPUS, *_MINI.values(), *_MICRO.values(), *_POOL.values()]
    s = {k: get(cfg, k) for k in keys}
    if s[_MINI["critic"]] == s[_MINI["actor"]]:  # as after `resolve`: treat as inherited, one report
        s[_MINI["critic"]] = None
    s["sp.actor"] = role_sp(cfg, "actor")
    s["sp.critic"] = role_sp(cfg, "critic") if cfg.resource_pool.critic else s["sp.actor"]
    return s


def role_world(s: _Sizes, role: str) -> int:
    """A role's devices: its devices per node (resource_pool) x nodes. The critic shares the
    actor's devices unless it has its own."""
    per_node = s[_POOL[role]] if role == "critic" and s[_POOL["critic"]] else s[_POOL["actor"]] or s[_GPUS]
    return s[_NODES] * per_node


def _dp(s: _Sizes, role: str) -> int:
    """A role's data-parallel size: its devices / its sequence-parallel degree (the sp devices of
    a group share one batch shard)."""
    world, sp = role_world(s, role), s[f"sp.{role}"]
    return world // sp if world % sp == 0 else world


def _mini(s: _Sizes, role: str) -> int:
    own = s[_MINI[role]]
    return s[_MINI["actor"]] if own is None else own


def _role_failure(s: _Sizes, role: str) -> str | None:
    train, n, dp, mini, micro = s[_TRAIN], s[_N], _dp(s, role), _mini(s, role), s[_MICRO[role]]
    if train % mini:
        return "divides"
    if mini * n % dp:
        return "split"
    if micro is not None and (mini * n // dp) % micro:
        return "micro"
    return None


def _failures(s: _Sizes, ctx: _Context) -> set[tuple[str, str]]:
    critic_on, grouped = ctx
    out = set()
    actor = _role_failure(s, "actor")
    if actor:
        out.add(("actor", actor))
    if critic_on:
        critic = _role_failure(s, "critic")
        same_dp = _dp(s, "critic") == _dp(s, "actor")
        inherited = s[_MINI["critic"]] is None and (
            critic == "divides" or critic == "split" and same_dp
        )  # reported for the actor
        if critic and not inherited:
            out.add(("critic", critic))
    if grouped and s[_N] < 2:
        out.add(("algorithm", "group"))
    return out


def _removes(s: _Sizes, change: dict[str, Any], failure: tuple[str, str], ctx: _Context) -> bool:
    """Whether the change removes `failure` and breaks nothing that was fine: no role (actor,
    critic, algorithm) that passed before fails after it."""
    before = {role for role, _ in _failures(s, ctx) - {failure}}
    after = _failures({**s, **change}, ctx)
    return failure not in after and {role for role, _ in after} <= before


def _working_values(s: _Sizes, key: str, candidates: Any, failure: tuple[str, str], ctx: _Context) -> list[int]:
    """The nearest candidate below and above the current value that remove `failure`
    without breaking anything else."""
    current = s[key] if s[key] is not None else _mini(s, "actor")
    good = [v for v in candidates if v != current and _removes(s, {key: v}, failure, ctx)]
    below = [v for v in good if v < current]
    above = [v for v in good if v > current]
    return ([max(below)] if below else []) + ([min(above)] if above else [])


def _divisors(x: int) -> list[int]:
    return [d for d in range(1, x + 1) if x % d == 0]


def batch_problems(cfg: Config) -> list[Problem]:
    if cfg.algorithm.name not in ALGORITHM_NAMES:
        return []  # reported as a bad choice; no batch plan to check
    if cfg.algorithm.name != "rl":
        return _offline_batch_problems(cfg)
    s = batch_sizes(cfg)
    ctx = (cfg.critic_enabled, cfg.algorithm.adv_estimator in GROUP_ESTIMATORS)
    return [_describe(s, role, kind, ctx, cfg) for role, kind in sorted(_failures(s, ctx))]


def _describe(s: _Sizes, role: str, kind: str, ctx: _Context, cfg: Config) -> Problem:
    train, n, nodes = s[_TRAIN], s[_N], s[_NODES]
    failure = (role, kind)
    if kind == "group":
        values = [5] if _removes(s, {_N: 5}, failure, ctx) else []
        values = values or _working_values(s, _N, range(2, max(4 * n, 16) + 1), failure, ctx)
        text = (
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} compares several responses to the same "
            f"prompt, so it needs {_N} > 1 (got {n})"
        )
        return _with_fix(text, (_N, "algorithm.adv_estimator"), _N, values, f"use {_N}=")

    dp = _dp(s, role)
    gpus_key = _POOL["critic"] if role == "critic" and s[_POOL["critic"]] else _POOL["actor"] if s[_POOL["actor"]] else _GPUS
    gpus = s[gpus_key]
    mini_key = _MINI[role] if s[_MINI[role]] is not None else _MINI["actor"]
    mini, micro_key = _mini(s, role), _MICRO[role]
    mini_text = f"{mini_key}={mini}"
    if kind == "divides":
        verb = "is larger than" if mini > train else "does not divide"
        text = f"{mini_text} {verb} {_TRAIN}={train}"
        keys = (mini_key, _TRAIN)
        values = _working_values(s, mini_key, _divisors(train), failure, ctx)
        if values:
            return _with_fix(text, keys, mini_key, values, "use a divisor such as ")
        values = _working_values(s, _TRAIN, range(mini, 4 * max(train, mini) + 1, mini), failure, ctx)
        if values:
            return _with_fix(text, keys, _TRAIN, values, f"use a multiple of {mini} such as {_TRAIN}=")
        joint = _joint_fix(s, role, mini_key, failure, ctx)
        if joint:
            return Problem(f"{text}; use {_show_fix(joint)}", keys, joint)
        return Problem(f"{text}; change several of {', '.join(keys)} together", keys)
    if kind == "split":
        text = (
            f"{mini_text} x {_N}={n} = {mini * n} sequences per mini-batch cannot be split evenly over "
            f"data-parallel size {dp} ({_NODES}={nodes} x {gpus_key}={gpus})"
        )
        keys = (mini_key, _N, _NODES, _GPUS)
        values = _working_values(s, mini_key, _divisors(train), failure, ctx)
        if values:
            return _with_fix(text, keys, mini_key, values, "use a value such as ")
        # No mini-batch size works with this train batch: change the batch sizes together
        # (keeps the algorithm as it is), or the samples per prompt, or the device count.
        fixes = [f for f in (_joint_fix(s, role, mini_key, failure, ctx),) if f]
        fixes += [{_N: v} for v in _working_values(s, _N, range(1, max(4 * n, 16) + 1), failure, ctx)[:1]]
        options = [_show_fix(f) for f in fixes] + [f"a data-parallel size that divides {mini * n}"]
        return Problem(f"{text}; use {', or '.join(options)}", keys, fixes[0] if fixes else None)
    # kind == "micro"
    micro, per_device = s[micro_key], mini * n // dp
    verb = "is larger than" if micro > per_device else "does not divide"
    text = (
        f"{micro_key}={micro} {verb} the per-device mini-batch of {per_device} sequences "
        f"({mini_text} x {_N}={n} / data-parallel size {dp})"
    )
    values = _working_values(s, micro_key, _divisors(per_device), failure, ctx)
    return _with_fix(text, (micro_key, mini_key, _N, _NODES, _GPUS), micro_key, values, f"use a divisor of {per_device} such as ")


def _joint_fix(s: _Sizes, role: str, mini_key: str, failure: tuple[str, str], ctx: _Context) -> dict | None:
    """When no single key can change: the mini-batch with the micro-batch; failing that, the
    train batch too. Mini-batch sizes nearest the current one first."""
    train, n, dp, micro_key = s[_TRAIN], s[_N], _dp(s, role), _MICRO[role]

    def with_micro(fix: dict[str, int]) -> dict[str, int]:
        micro, per_device = s[micro_key], fix[mini_key] * n // dp
        if micro is not None and per_device % micro:
            fix[micro_key] = max(d for d in _divisors(per_device) if d <= micro)
        return fix

    def nearest_first(values: Any) -> list[int]:
        return sorted(values, key=lambda v: (abs(v - s[mini_key]), v))

    step = dp // math.gcd(n, dp)  # mini-batches that dp can split are multiples of this
    options = [with_micro({mini_key: m}) for m in nearest_first(_divisors(train)) if m % step == 0]
    options += [
        with_micro({_TRAIN: max(m, round(train / m) * m), mini_key: m})
        for m in nearest_first(range(step, 4 * max(train, s[mini_key]) + 1, step))[:256]
    ]
    options = [{k: v for k, v in fix.items() if v != s[k]} for fix in options]
    return next((fix for fix in options if fix and _removes(s, fix, failure, ctx)), None)


def _show_fix(fix: dict[str, Any]) -> str:
    return " and ".join(f"{k}={show(v)}" for k, v in fix.items())


def _with_fix(text: str, keys: tuple[str, ...], key: str, values: list[int], lead: str) -> Problem:
    if not values:  # only with other problems present; fix those first
        return Problem(f"{text}; change several of {', '.join(keys)} together", keys)
    return Problem(f"{text}; {lead}{' or '.join(map(str, values))}", keys, {key: values[0]})


# --------------------------------------------------------------------------- dpo / kto / sft
# No generation: a step is data.train_batch_size rows (pairs for DPO, examples for KTO/SFT), one
# optimizer step, split into micro-batches of ppo_micro_batch_size_per_gpu rows per device. The
# RL plan covers this with rollout.n = 1, one mini-batch of the whole step and one epoch.


def _offline_batch_problems(cfg: Config) -> list[Problem]:
    train, micro_key = cfg.data.train_batch_size, _MICRO["actor"]
    micro, nodes, gpus = (
        get(cfg, micro_key),
        cfg.trainer.nnodes,
        cfg.resource_pool.actor_rollout_ref or cfg.trainer.n_gpus_per_node,
    )
    dp, rows = nodes * gpus, {"dpo": "pairs", "kto": "examples", "sft": "examples", "rm": "pairs"}[cfg.algorithm.name]
    if train % dp:
        fixes = [v for v in range(train - train % dp, train + dp + 1, dp) if v > 0]
        return [
            Problem(
                f"{_TRAIN}={train} {rows} per step cannot be split evenly over data-parallel size {dp} "
                f"({_NODES}={nodes} x {_GPUS}={gpus}); use a multiple of {dp} such as {_TRAIN}={fixes[0]}",
                (_TRAIN, _NODES, _GPUS),
                {_TRAIN: fixes[0]},
            )
        ]
    per_device = train // dp
    if micro is not None and per_device % micro:
        verb = "is larger than" if micro > per_device else "does not divide"
        values = [d for d in _divisors(per_device) if d < micro][-1:] + [d for d in _divisors(per_device) if d > micro][:1]
        return [
            _with_fix(
                f"{micro_key}={micro} {verb} the {per_device} {rows} one device trains on per step "
                f"({_TRAIN}={train} / data-parallel size {dp}; algorithm.name={cfg.algorithm.name} makes one optimizer "
                f"step per {_TRAIN} rows)",
                (micro_key, _TRAIN, _NODES, _GPUS),
                micro_key,
                values,
                f"use a divisor of {per_device} such as ",
            )
        ]
    return []
