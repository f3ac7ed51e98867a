"""How a run's reward is put together from the config: one `Scorer` (hybridrl/rewards/scorer.py)
that scores with which function and arguments, and where the calls run; what the data loader must
find in a row; the checks before training (the trainer's setup asks; hybridrl/trainer/setup.py).

`cfg` is the run's config, read by attribute (custom_reward_function.*, reward_model.*): this layer
imports nothing above it. `reward` is what the Python API was given in place of the config's reward
function: a function (verl's form; one marked `batched = True`, `hybridrl.batched_reward`, called
once per batch with lists; TRL-form functions, made into one batched function by
hybridrl/rewards/trl.py), or a ready `Scorer` (a `RemoteReward`), used as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .code_sandbox import CODE_SOURCES, SandboxFusionReward, needs_ground_truth_or_code
from .custom import load_custom_reward_fn
from .pool import Target, WorkerPool
from .registry import check_data_sources, check_reward_kwargs, default_compute_score, needs_ground_truth
from .remote import RemoteReward
from .result import Outcome
from .scorer import BatchScorer, FunctionScorer, Scorer, function_name

# verl's reward managers (reward_model.reward_manager): how the function is called. naive: once per
# response; dapo: the same (verl's also strips the EOS text, which our decoding drops anyway; the
# overlong penalty it adds applies under any manager here, rewards/stage.py); prime: once per response
# in parallel processes, as every function is called here; batch: once per batch, with lists.
REWARD_MANAGERS = {"naive": FunctionScorer, "dapo": FunctionScorer, "prime": FunctionScorer, "batch": BatchScorer}


def build_scorer(cfg, reward: Any = None) -> Scorer:
    """The run's scorer, in this order: the Python API's `reward`; a scoring service
    (custom_reward_function.remote.url); SandboxFusion for code (reward_model.sandbox_fusion.url,
    without a custom function); custom_reward_function.path (in worker processes that load the
    file); the built-in scorers (in a thread). Every function runs in a `WorkerPool` with
    custom_reward_function.timeout_s per call (a batched function: per batch)."""
    c = cfg.custom_reward_function
    if reward is not None:
        if (ready := _ready(reward)) is not None:
            return ready
        pool = WorkerPool(
            _bound(reward, c.reward_kwargs),
            kind="fork",  # a function of the user's script or notebook: in forks of this process
            num_workers=c.num_workers,
            timeout_s=c.timeout_s,
            memory_limit_mb=c.memory_limit_mb,
        )
        return _scorer(cfg, pool, f"reward function {function_name(reward)}", reward)
    if c.remote.url:
        return RemoteReward.from_config(c.remote)
    if cfg.reward_model.sandbox_fusion.url and not c.path:  # code runs on the service
        return SandboxFusionReward.from_configs(cfg.reward_model.sandbox_fusion, c.remote)
    if c.path:
        pool = WorkerPool(
            Target(c.path, c.name, dict(c.reward_kwargs)),
            kind="process",
            num_workers=c.num_workers,
            timeout_s=c.timeout_s,
            memory_limit_mb=c.memory_limit_mb,
        )
        return _scorer(cfg, pool, f"reward function {c.name} ({c.path})")
    # trusted and fast: a thread of this process, the timeout guarding against a pathological input
    pool = WorkerPool(_bound(default_compute_score, c.reward_kwargs), kind="thread", timeout_s=c.timeout_s)
    return FunctionScorer(pool, "the built-in reward")


def ground_truth_rule(cfg, reward: Any = None) -> Callable[[str], bool]:
    """Whether the data loader must find a ground truth in a row of a given data source: for the
    built-in scorers' sources (and SandboxFusion's code sources); a custom function, a service or the
    Python API's reward decides for itself what it needs."""
    c = cfg.custom_reward_function
    if reward is not None or c.remote.url or c.path:
        return _never
    return needs_ground_truth_or_code if cfg.reward_model.sandbox_fusion.url else needs_ground_truth


def check_kwargs(cfg, reward: Any, data_sources: list[str]) -> None:
    """custom_reward_function.reward_kwargs against the function that takes them, and the rows' data
    sources against the built-in scorers; ValueError names the mismatch. `reward`: the Python API's."""
    c, rm = cfg.custom_reward_function, cfg.reward_model
    if reward is not None:
        if _ready(reward) is None:
            check_reward_kwargs(reward, c.reward_kwargs, set(data_sources), _batched(cfg, reward))
        return
    custom = load_custom_reward_fn(c.path, c.name) if c.path else None
    check_reward_kwargs(custom, c.reward_kwargs, set(data_sources), _batched(cfg))
    # the built-in scorers score every sample unless a remote or RM-only reward does
    if custom is None and not c.remote.url and not (rm.enable and rm.rule_weight == 0):
        code = CODE_SOURCES if rm.sandbox_fusion.url else ()
        check_data_sources([s for s in data_sources if s not in code], str(cfg.data.train_files))


def call_once(cfg, reward: Any, call: dict) -> Outcome | None:
    """One call of the Python API's `reward` on one response (`call`: data_source, solution_str,
    ground_truth, extra_info), isolated as in training (a forked worker, custom_reward_function's
    timeout and memory limit), before any model work; None for a ready `Scorer` (a service: its
    failures are counted in training, never fatal). A batched function gets one-element lists."""
    c = cfg.custom_reward_function
    if _ready(reward) is not None:
        return None
    if not callable(reward):
        raise TypeError(f"reward_fn must be a function or a hybridrl Scorer, got {type(reward).__name__}")
    fn = _bound(reward, c.reward_kwargs)
    if _batched(cfg, reward):
        fn = functools.partial(_one_of_batch, fn)
    with WorkerPool(fn, kind="fork", num_workers=1, timeout_s=c.timeout_s, memory_limit_mb=c.memory_limit_mb) as pool:
        return pool.map([call])[0]


def _one_of_batch(fn, data_source, solution_str, ground_truth, extra_info):
    out = list(
        fn(data_sources=[data_source], solution_strs=[solution_str], ground_truths=[ground_truth], extra_infos=[extra_info])
    )
    if len(out) != 1:
        raise ValueError(f"the batched reward function returned {len(out)} results for 1 response")
    return out[0]


def _ready(reward: Any) -> Scorer | None:
    """The Python API's reward when it is a `Scorer` already (the one place a given object is told
    from a function: everything after it speaks the protocol)."""
    return reward if isinstance(reward, Scorer) else None


def _batched(cfg, reward: Any = None) -> bool:
    """Called once per batch with lists: reward_model.reward_manager=batch, or a function marked batched."""
    return cfg.reward_model.reward_manager == "batch" or bool(getattr(reward, "batched", False))


def _scorer(cfg, pool: WorkerPool, name: str, reward: Any = None) -> Scorer:
    manager = "batch" if _batched(cfg, reward) else cfg.reward_model.reward_manager
    return REWARD_MANAGERS[manager](pool, name)


def _bound(fn: Callable, kwargs: dict) -> Callable:
    return functools.partial(fn, **kwargs) if kwargs else fn


def _never(data_source: str) -> bool:
    return False
