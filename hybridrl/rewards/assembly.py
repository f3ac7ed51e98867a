"""How a run's reward is put together from the config: which function scores, with which
arguments, and where the calls run (the trainer's setup asks; hybridrl/trainer/setup.py).

`cfg` is the run's config, read by attribute (custom_reward_function.*, reward_model.reward_manager):
this layer imports nothing above it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from .code_sandbox import CODE_SOURCES, SandboxFusionReward, needs_ground_truth_or_code
from .custom import load_custom_reward_fn
from .managers import ManagedScorer
from .pool import Target, WorkerPool
from .registry import check_data_sources, check_reward_kwargs, default_compute_score, needs_ground_truth
from .remote import RemoteReward

# A reward function: (data_source, solution_str, ground_truth, extra_info, **reward_kwargs) -> score
# or a dict with a "score" and extra metrics.
ComputeScore = Callable[..., float | dict[str, float]]


def build_scorer(cfg, reward_fn: ComputeScore | None = None):
    """(compute_score with reward_kwargs bound, whether a data source needs ground truth, the
    custom function or None). `reward_fn`: a function given in Python (hybridrl/api.py) in place of
    custom_reward_function.path; one marked `batched = True` is called once per batch with lists."""
    c = cfg.custom_reward_function
    if c.remote.url and reward_fn is None:
        return RemoteReward.from_config(c.remote), (lambda source: False), None
    if cfg.reward_model.sandbox_fusion.url and reward_fn is None and not c.path:  # code runs on the service
        return SandboxFusionReward.from_configs(cfg.reward_model.sandbox_fusion, c.remote), needs_ground_truth_or_code, None
    if reward_fn is not None:
        custom, fn, need_gt = reward_fn, reward_fn, (lambda source: False)
    elif c.path:
        custom = load_custom_reward_fn(c.path, c.name)
        fn, need_gt = custom, (lambda source: False)
    else:
        custom, fn, need_gt = None, default_compute_score, needs_ground_truth
    if isinstance(fn, RemoteReward):
        return fn, need_gt, None
    fn = functools.partial(fn, **c.reward_kwargs) if c.reward_kwargs else fn
    manager = "batch" if getattr(reward_fn, "batched", False) else cfg.reward_model.reward_manager
    return (fn if manager == "naive" else ManagedScorer(manager, fn)), need_gt, custom


def reward_pool(cfg, compute_score, in_memory: bool = False):
    """Where the reward calls run (hybridrl/rewards/pool.py): a custom function from a file in worker
    processes (loaded there), the built-in scorers and functions given in Python in a thread; each
    call bounded by `custom_reward_function.timeout_s`. The remote scorer and the batch/prime
    managers make their calls their own way (concurrent requests, one call with lists, processes)."""
    c = cfg.custom_reward_function
    if isinstance(compute_score, RemoteReward) or (
        isinstance(compute_score, ManagedScorer) and compute_score.manager in ("batch", "prime")
    ):
        return compute_score
    if c.path and not in_memory:
        return WorkerPool(
            Target(c.path, c.name, dict(c.reward_kwargs)),
            kind="process",
            num_workers=c.num_workers,
            timeout_s=c.timeout_s,
            memory_limit_mb=c.memory_limit_mb,
        )
    fn = compute_score.compute_score if isinstance(compute_score, ManagedScorer) else compute_score
    return WorkerPool(fn, kind="thread", timeout_s=c.timeout_s)


def check_kwargs(cfg, custom, data_sources: list[str]) -> None:
    """custom_reward_function.reward_kwargs against the function that takes them, and the rows'
    data sources against the built-in scorers; ValueError names the mismatch."""
    batched = cfg.reward_model.reward_manager == "batch" or getattr(custom, "batched", False)
    check_reward_kwargs(custom, cfg.custom_reward_function.reward_kwargs, set(data_sources), batched)
    rm = cfg.reward_model  # the built-in scorers score every sample unless a remote or RM-only reward does
    if custom is None and not cfg.custom_reward_function.remote.url and not (rm.enable and rm.rule_weight == 0):
        code = CODE_SOURCES if rm.sandbox_fusion.url else ()
        check_data_sources([s for s in data_sources if s not in code], str(cfg.data.train_files))
