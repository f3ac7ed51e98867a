"""`build_rollout`: the one place that turns `actor_rollout_ref.rollout` into a generation engine.

The actor, the rollout pool, the generative judge and `hybridrl eval` each make one call. The
rules it applies are plain functions of the config's keys, kept once in config/checks/rollout.py
so that the config checks apply the same ones (this module imports torch only inside
`build_rollout`):

- `pick_engine`: `auto` is native on a GPU and for multi-turn rollouts (the agent loop runs on
  the native engine, CPU included), hf on CPU, where HF `generate` is the reference and as fast;
  a model the native engine does not support falls back to hf with a one-line notice.
- `tp_problem`: tensor parallelism (`tensor_model_parallel_size > 1`) runs on the native engine
  only, which then shards; prefix caching and chunked prefill run at TP=1 only (`TP1_ONLY`).
- partial rollouts (`weight_swap`) need the native engine, single-turn.
- multi-turn (`multi_turn.enable`): the engine is wrapped in `AgentRollout`.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

from hybridrl.config.checks.rollout import TP_KEY, pick_engine, tp_problem

# name -> "module:class"; each class builds itself with `from_config(model, tokenizer, EngineArgs)`
ENGINES: dict[str, str] = {
    "native": "hybridrl.rollout.native.engine:NativeRolloutEngine",
    "hf": "hybridrl.rollout.hf:HFRolloutEngine",
    "vllm": "hybridrl.rollout.vllm:VLLMRolloutEngine",
}
NAMES = ("auto", *ENGINES)  # the values of actor_rollout_ref.rollout.name


@dataclass(frozen=True)
class EngineArgs:
    """What an engine class reads besides the model and the tokenizer."""

    rollout: Any  # RolloutConfig: the engines read their keys from it (max_num_seqs, ...)
    max_model_len: int  # prompt + response tokens
    autocast_dtype: Any = None  # hf: generate under this autocast dtype
    # (HF name, tensor) pairs an engine with its own weights starts from instead of the model's
    # parameters (LoRA: the merged policy; FSDP: gathered; TP: full tensors each rank slices)
    named_weights: Any = None
    tp_group: Any = None  # this rank's tensor-parallel group (None: no TP)
    tp: int = 1  # its size
    record_routing: bool = False  # a mixture of experts' routing per token (router replay R3; native only)

    @property
    def tp1_only(self) -> dict[str, bool]:
        """`TP1_ONLY` as the native engine's arguments: off at TP > 1 (the config check warns)."""
        r = self.rollout
        return {
            "prefix_caching": r.enable_prefix_caching and self.tp == 1,
            "chunked_prefill": r.enable_chunked_prefill and self.tp == 1,
        }


def engine_class(name: str) -> type:
    """The engine class `name` (native, hf, vllm) names."""
    if name not in ENGINES:
        raise ValueError(f"unknown actor_rollout_ref.rollout.name={name!r}; choose one of {', '.join(NAMES)}")
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_rollout(
    rollout,
    model,
    tokenizer,
    *,
    max_model_len: int,
    autocast_dtype=None,
    named_weights=None,
    tp_group=None,
    partial_rollout: bool = False,
    record_routing: bool = False,
):
    """The engine `rollout` (a RolloutConfig) asks for, over the trainer's `model`, wrapped in
    `AgentRollout` when `rollout.multi_turn.enable`. `partial_rollout`: the caller will pass `Hooks(weight_swap=...)`.
    `record_routing`: router replay R3 (the native engine records a mixture of experts' routing).
    See `EngineArgs` for the rest."""
    import torch

    tp = torch.distributed.get_world_size(tp_group) if tp_group is not None else 1
    multi_turn = rollout.multi_turn.enable
    cuda = next(model.parameters()).device.type == "cuda"
    name = pick_engine(rollout.name, cuda=cuda, multi_turn=multi_turn, record_routing=record_routing)
    if name == "native":
        from hybridrl.models.native import unsupported_reason

        reason = unsupported_reason(model.config)
        if reason is not None:
            if tp > 1:
                raise ValueError(
                    f"{TP_KEY}={tp} needs the native engine, which does not support this model ({reason}); "
                    "use tensor_model_parallel_size=1"
                )
            print(f"hybridrl: rollout.name=native does not support this model ({reason}); using rollout.name=hf", file=sys.stderr)
            name = "hf"
    problem = tp_problem(name, tp, rollout.name if rollout.name != name else None)
    if problem:
        raise ValueError(problem)
    if record_routing and name != "native":
        raise ValueError(
            f"actor_rollout_ref.actor.router_replay.mode=R3 replays the routing the native engine records; this rollout "
            f"runs rollout.name={name}; set actor_rollout_ref.rollout.name=native"
        )
    if partial_rollout and (name != "native" or multi_turn):
        runs = "multi-turn rollouts" if multi_turn else f"rollout.name={name}"
        raise ValueError(
            f"async_training.partial_rollout needs the native engine, single-turn, and this rollout runs {runs}; "
            "set actor_rollout_ref.rollout.name=native"
        )
    args = EngineArgs(rollout, max_model_len, autocast_dtype, named_weights, tp_group, tp, record_routing)
    engine = engine_class(name).from_config(model, tokenizer, args)
    if multi_turn:  # generate runs multi-turn trajectories with tools / interactions (rollout/agent/)
        from hybridrl.rollout.agent.rollout import AgentRollout

        engine = AgentRollout.from_config(engine, tokenizer, rollout.multi_turn)
    return engine
