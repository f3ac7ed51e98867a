"""Checks of the rollout keys (actor_rollout_ref.rollout.*): sampling, multi-turn agent loops, tensor parallelism."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

from ..extensions import feature_rule
from ..layout import layout_problem
from ..problem import Problem, get, suggest
from ..schema import Config
from .batch import batch_sizes, role_world

_R = "actor_rollout_ref.rollout"
_NODES, _GPUS = "trainer.nnodes", "trainer.n_gpus_per_node"
TP_KEY = f"{_R}.tensor_model_parallel_size"
TP1_ONLY = ("enable_prefix_caching", "enable_chunked_prefill")  # native-engine keys that TP switches off


# The engine rules `rollout.factory.build_rollout` applies, kept here once so the checks below apply
# the same ones (torch-free).
def pick_engine(name: str, *, cuda: bool, multi_turn: bool = False, record_routing: bool = False) -> str:
    """`rollout.name` with `auto` resolved: native on a GPU, for multi-turn rollouts or to record a
    mixture of experts' routing (router replay R3), hf otherwise."""
    if name != "auto":
        return name
    return "native" if cuda or multi_turn or record_routing else "hf"


def tp_problem(name: str, tp: int, asked: str | None = None) -> str | None:
    """Why engine `name` cannot run at tensor-parallel size `tp` (None: it can). `asked`: the
    configured `rollout.name`, when it differs (auto)."""
    if tp <= 1 or name == "native":
        return None
    auto = " (auto is hf on CPU)" if asked == "auto" else ""
    return (
        f"{TP_KEY}={tp} needs the native engine, not rollout.name={asked or name}{auto}; "
        f"set actor_rollout_ref.rollout.name=native, or {TP_KEY}=1"
    )


def tp1_only_ignored(rollout, name: str | None = None) -> list[str]:
    """The keys of `TP1_ONLY` that are set and do nothing with this engine and TP size."""
    name = name or rollout.name
    native_tp1 = name in ("native", "auto") and rollout.tensor_model_parallel_size <= 1
    return [] if native_tp1 else [k for k in TP1_ONLY if getattr(rollout, k)]


def notices(cfg: Config) -> list[str]:
    """Engine features that do nothing with the engine or TP size chosen."""
    r = cfg.actor_rollout_ref.rollout
    return [
        f"actor_rollout_ref.rollout.{key}=true applies to the native engine at tensor_model_parallel_size=1; "
        f"with rollout.name={r.name} and tensor_model_parallel_size={r.tensor_model_parallel_size} it does nothing"
        for key in tp1_only_ignored(r)
    ]


def sampling_problems(cfg: Config) -> list[Problem]:
    """Sampling settings that cannot run: greedy-or-sample contradictions, a group wider than the engine's batch."""
    out = []
    for prefix in (_R, f"{_R}.val_kwargs"):
        sampling = get(cfg, prefix)
        if sampling.do_sample and sampling.temperature == 0:
            out.append(
                Problem(
                    f"{prefix}.temperature=0 with {prefix}.do_sample=true cannot sample; use {prefix}.do_sample=false "
                    f"for greedy decoding, or a temperature such as 1.0",
                    (f"{prefix}.do_sample", f"{prefix}.temperature"),
                    {f"{prefix}.do_sample": False},
                )
            )
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name in ("native", "auto") and max(rollout.n, rollout.val_kwargs.n) > rollout.max_num_seqs:
        n = max(rollout.n, rollout.val_kwargs.n)
        out.append(
            suggest(
                f"{_R}.max_num_seqs",
                rollout.max_num_seqs,
                f"must be >= rollout.n={n} with rollout.name=native or auto (a prompt's samples run "
                "together in the native engine)",
                n,
            )
        )
    return out


def forced_length_problems(cfg: Config) -> list[Problem]:
    """rollout.forced_response_lengths: the distribution (rollout/lengths.py's own checks) and the engines that run it."""
    from_config = feature_rule("forced_response_lengths")  # rollout/lengths.py (numpy only)

    r, key = cfg.actor_rollout_ref.rollout, f"{_R}.forced_response_lengths"
    try:
        if from_config(r.forced_response_lengths, cfg.data.max_response_length) is None:
            return []
    except ValueError as e:
        return [Problem(str(e), (f"{key}.distribution",))]
    if r.name == "vllm" or r.multi_turn.enable:
        what = f"{_R}.name=vllm" if r.name == "vllm" else f"{_R}.multi_turn.enable=true"
        return [Problem(f"{key} runs on the native and hf engines, single-turn; not with {what}", (f"{key}.distribution",))]
    return []


def multi_turn_problems(cfg: Config) -> list[Problem]:
    """rollout.multi_turn.*: sizes, the files it names, and what the agent loop runs on."""
    r, key = cfg.actor_rollout_ref.rollout, f"{_R}.multi_turn"
    mt, out = r.multi_turn, []
    if not mt.enable:
        return out
    for name, fix in {"max_assistant_turns": 4, "max_user_turns": 2, "max_turn_tokens": 512}.items():
        value = getattr(mt, name)
        if value is not None and not (isinstance(value, int) and value >= 1):
            out.append(suggest(f"{key}.{name}", value, "must be >= 1 or null", fix))
    for name, fix in {"max_parallel_calls": 1, "max_tool_response_length": 256}.items():
        value = getattr(mt, name)
        if not (isinstance(value, int) and value >= 1):
            out.append(suggest(f"{key}.{name}", value, "must be >= 1", fix))
    if not (isinstance(mt.tool_timeout_s, (int, float)) and 0 < mt.tool_timeout_s < float("inf")):
        out.append(suggest(f"{key}.tool_timeout_s", mt.tool_timeout_s, "must be positive", 30.0))
    for name in ("tool_config_path", "interaction_config_path"):
        path = getattr(mt, name)
        if path is not None and not os.path.isfile(path):
            out.append(Problem(f"{key}.{name}={path}: no such file", (f"{key}.{name}",)))
    if mt.tool_config_path is None and mt.interaction_config_path is None:
        out.append(
            Problem(
                f"{key}.enable=true needs tools or an interaction: set {key}.tool_config_path (e.g. configs/tools/python.yaml) "
                f"or {key}.interaction_config_path",
                (f"{key}.tool_config_path",),
            )
        )
    if r.name in ("hf", "vllm"):
        out.append(
            Problem(
                f"{key}.enable=true runs on the native engine; {_R}.name={r.name} cannot pause and extend sequences: "
                f"set {_R}.name=native",
                (f"{_R}.name",),
                {f"{_R}.name": "native"},
            )
        )
    if r.tensor_model_parallel_size > 1:
        out.append(
            Problem(
                f"{key}.enable=true with {_R}.tensor_model_parallel_size={r.tensor_model_parallel_size}: multi-turn "
                f"rollouts run at tensor_model_parallel_size=1 for now (the ranks of a replica would have to agree on "
                f"when each tool answers)",
                (f"{_R}.tensor_model_parallel_size",),
                {f"{_R}.tensor_model_parallel_size": 1},
            )
        )
    return out


def tp_problems(cfg: Config) -> list[Problem]:
    """rollout.tensor_model_parallel_size: it must divide the actor's ranks, fit the model's heads
    (read from the model directory's config.json when there is one) and run on the native engine."""
    r, key = cfg.actor_rollout_ref.rollout, f"{_R}.tensor_model_parallel_size"
    tp = r.tensor_model_parallel_size
    if not isinstance(tp, int) or tp <= 1:
        return []
    out, world = [], role_world(batch_sizes(cfg), "actor")
    problem = layout_problem(world, -1, 1, tp)
    if problem:
        fix = problem[2]
        out.append(
            Problem(
                f"{key}={tp} does not divide the actor's {world} rank(s) (trainer.nnodes x n_gpus_per_node): each "
                f"rollout replica is tp consecutive ranks; use e.g. {key}={fix}",
                (key, _NODES, _GPUS),
                {key: fix},
            )
        )
    engine = pick_engine(r.name, cuda=cfg.trainer.device != "cpu", multi_turn=bool(r.multi_turn.enable))
    reason = tp_problem(engine, tp, r.name if r.name != engine else None)
    if reason:
        out.append(Problem(reason, (f"{_R}.name", key), {f"{_R}.name": "native"}))
    reason = _model_tp_problem(cfg.actor_rollout_ref.model.path, tp)
    if reason:
        out.append(Problem(f"{key}: {reason}", (key,), {key: 1}))
    return out


def _model_tp_problem(path: str | None, tp: int) -> str | None:
    """`tp_shards.check_tp` on the model directory's config.json; None when there is none to read."""
    check_tp = feature_rule("tp_shards")  # the shard spec's own rule (pure; no model is built)

    file = Path(path or "") / "config.json"
    if not path or not file.is_file():
        return None
    raw = json.loads(file.read_text())
    raw = raw.get("text_config", raw)
    if not all(k in raw for k in ("num_attention_heads", "intermediate_size", "hidden_size")):
        return None
    raw.setdefault("num_key_value_heads", raw["num_attention_heads"])
    return check_tp(SimpleNamespace(**raw), tp)
