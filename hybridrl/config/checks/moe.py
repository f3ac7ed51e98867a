"""Checks of the mixture-of-experts keys: router replay (`actor.router_replay.mode`) and expert
parallelism (`actor.fsdp_config.expert_parallel_size`); docs/models.md. Whether the model is a
mixture of experts at all is known when it loads (a dense model refuses R3 and expert parallelism
then)."""

from ..problem import Problem, suggest
from ..schema import Config
from .batch import batch_sizes, role_sp, role_world

_A = "actor_rollout_ref.actor"
_MODE, _EP = f"{_A}.router_replay.mode", f"{_A}.fsdp_config.expert_parallel_size"


def moe_problems(cfg: Config) -> list[Problem]:
    return _replay_problems(cfg) + _expert_parallel_problems(cfg)


def _replay_problems(cfg: Config) -> list[Problem]:
    a, out = cfg.actor_rollout_ref.actor, []
    mode, engine = a.router_replay.mode, cfg.actor_rollout_ref.rollout.name
    if mode == "R3" and engine in ("hf", "vllm"):
        out.append(
            Problem(
                f"{_MODE}=R3 replays the routing the native engine records; rollout.name={engine} does not record it. "
                "Use actor_rollout_ref.rollout.name=native (or auto), or router_replay.mode=R2",
                (_MODE, "actor_rollout_ref.rollout.name"),
                {"actor_rollout_ref.rollout.name": "native"},
            )
        )
    if mode != "disabled" and role_sp(cfg, "actor") > 1:
        key = f"{_A}.ulysses_sequence_parallel_size"
        why = f"and {_MODE}={mode} do not combine (each rank runs a slice of the packed row; the routing covers it whole)"
        out.append(suggest(key, role_sp(cfg, "actor"), why, 1))
    if mode == "R2" and (a.reuse_on_policy_log_prob or cfg.algorithm.rollout_correction.bypass_mode):
        key = f"{_A}.reuse_on_policy_log_prob" if a.reuse_on_policy_log_prob else "algorithm.rollout_correction.bypass_mode"
        out.append(
            Problem(
                f"{_MODE}=R2 replays the routing of the trainer's old-log-prob pass, which {key}=true skips; "
                f"set {key}=false, or use router_replay.mode=R3",
                (_MODE, key),
                {key: False},
            )
        )
    return out


def _expert_parallel_problems(cfg: Config) -> list[Problem]:
    arr, out = cfg.actor_rollout_ref, []
    if arr.ref.fsdp_config.expert_parallel_size != 1:
        key = "actor_rollout_ref.ref.fsdp_config.expert_parallel_size"
        out.append(suggest(key, arr.ref.fsdp_config.expert_parallel_size, f"is not read: the reference uses {_EP}", 1))
    critic_ep = cfg.critic.model.fsdp_config.expert_parallel_size
    if critic_ep != 1:
        key = "critic.model.fsdp_config.expert_parallel_size"
        out.append(suggest(key, critic_ep, "is not read: a critic's experts stay FSDP-sharded", 1))
    ep = arr.actor.fsdp_config.expert_parallel_size
    if not isinstance(ep, int) or ep <= 1:
        return out
    world = role_world(batch_sizes(cfg), "actor")
    sp, f = role_sp(cfg, "actor"), arr.actor.fsdp_config
    if world % ep:
        out.append(suggest(_EP, ep, f"must divide the actor's {world} ranks (trainer.nnodes x devices per node)", 1))
    if sp > 1:
        why = f"and {_EP}={ep} do not combine (the all-to-all splits tokens by rank)"
        out.append(suggest(f"{_A}.ulysses_sequence_parallel_size", sp, why, 1))
    if f.fsdp_size not in (-1, world):
        out.append(suggest(f"{_A}.fsdp_config.fsdp_size", f.fsdp_size, f"must be -1 (FSDP over all ranks) with {_EP}={ep}", -1))
    if f.param_offload:
        out.append(suggest(f"{_A}.fsdp_config.param_offload", True, f"does not offload the experts of {_EP}={ep}", False))
    m = arr.model
    if m.lora_rank > 0 or m.lora_adapter_path:
        out.append(suggest(_EP, ep, "does not run LoRA (adapters over expert-parallel weights)", 1))
    return out
