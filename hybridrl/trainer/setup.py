"""Everything a run needs before its first step: data, workers, rewards, tracking, resume.

Kept apart from the loop (`loop.py`) and the steps (`ppo.py`, `offline.py`) so that those read as the
algorithm and this file as the plumbing. `build_run` is the one way to build a run.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybridrl.config import Config, ConfigError, plan_batches, resolve, save_config, to_dict
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.dataset import PromptLoader, PromptRecord, load_prompt_records
from hybridrl.data.preference import load_warmup_pairs
from hybridrl.distributed.groups import WorkerGroups, create_worker_groups, uses_ray
from hybridrl.distributed.resource_pool import ACTOR, CRITIC, REWARD_MODEL, ROLLOUT
from hybridrl.distributed.worker_group import WorkerGroup
from hybridrl.models.loading import load_tokenizer
from hybridrl.rewards import check_reward_kwargs, default_compute_score, load_custom_reward_fn, needs_ground_truth
from hybridrl.rewards.code_sandbox import CODE_SOURCES, SandboxFusionReward, needs_ground_truth_or_code
from hybridrl.rewards.managers import ManagedScorer
from hybridrl.rewards.pool import Target, WorkerPool
from hybridrl.rewards.registry import check_data_sources
from hybridrl.rewards.remote import RemoteReward
from hybridrl.rollout.native.cache import stable_cache_addresses
from hybridrl.tracking.summary import end_of_run_summary
from hybridrl.tracking.tracker import Tracker, notice, truncate_jsonl
from hybridrl.trainer import checkpoint as ckpt
from hybridrl.trainer import rundir
from hybridrl.trainer.determinism import make_deterministic, make_worker_deterministic
from hybridrl.trainer.rollout_log import log_train_samples
from hybridrl.trainer.rollout_pool import RolloutPool
from hybridrl.workers.actor import ActorRolloutRefWorker
from hybridrl.workers.critic import CriticWorker
from hybridrl.workers.judge import JudgeWorker
from hybridrl.workers.reward_model import RewardModelTrainWorker, RewardModelWorker
from hybridrl.workers.rollout import RolloutWorker


def run_dir(cfg) -> Path:
    t = cfg.trainer
    return Path(t.default_local_dir or f"runs/{t.project_name}/{t.experiment_name}")


def checkpoints_dir(cfg) -> Path:
    """A run's `checkpoints/` (step_N/ directories and `latest`): where saves go and resume looks."""
    return run_dir(cfg) / "checkpoints"


# A reward function: (data_source, solution_str, ground_truth, extra_info, **reward_kwargs) -> score
# or a dict with a "score" and extra metrics (hybridrl/rewards).
ComputeScore = Callable[..., float | dict[str, float]]


@dataclass
class RunContext:
    """What a trainer's steps use: the data, the worker groups, the reward, tracking, the step
    counter; and what is done to the whole run (checkpoint, samples, finish)."""

    cfg: Config
    dir: Path
    loader: PromptLoader  # prompts (RL) or preference/SFT rows (RecordLoader)
    val_records: list[PromptRecord]
    actor: WorkerGroup[ActorRolloutRefWorker]
    critic: WorkerGroup[CriticWorker] | None
    compute_score: ComputeScore
    need_ref: bool
    save_ref: bool
    tracker: Tracker
    total_steps: int
    pad_token_id: int
    val_batch_size: int
    workers: WorkerGroups
    global_step: int = 0
    trainer_state: dict[str, Any] = field(default_factory=dict)
    reward_model: WorkerGroup[RewardModelWorker] | None = None  # reward_model.enable: scores responses
    tokenizer: Any = None  # the policy's: decodes responses scored while generating (trainer/stream_scoring.py)
    rollout: Any = None  # what generates: the actor's group, or the RolloutPool of resource_pool.rollout
    closed: bool = False
    started: float = field(default_factory=time.perf_counter)  # trainer.max_wall_time_s counts from here

    @property
    def ckpt_root(self) -> Path:
        return checkpoints_dir(self.cfg)

    def save_checkpoint(self, trainer_state: dict[str, Any]) -> Path:
        """Workers' models, optimizers and RNGs, the data position and the trainer's own state."""
        tmp = ckpt.begin_save(self.ckpt_root, self.global_step)
        self.actor.save_checkpoint(str(tmp), self.save_ref)
        if self.critic is not None:
            self.critic.save_checkpoint(str(tmp))
        if self.workers.backend is not None:  # each worker process's RNG (sampling, shuffles)
            self.workers.backend.run_on_hosts(_save_worker_rng, str(tmp))
        state = {"global_step": self.global_step, "data": self.loader.state_dict(), **trainer_state}
        return ckpt.finish_save(self.ckpt_root, tmp, self.global_step, state, self.cfg.trainer.max_ckpt_to_keep)

    def log_samples(self, batch: Batch, scores: torch.Tensor) -> None:
        log_train_samples(self.dir, self.cfg.trainer, self.global_step, batch, scores)

    def finish(self) -> None:
        """Close the loggers and stop the workers; safe to call twice."""
        if not self.closed:
            self.tracker.close()
            self.closed = True
            end_of_run_summary(
                self.dir,
                to_dict(self.cfg),
                self.global_step,
                self.total_steps,
                time.perf_counter() - self.started,
                ckpt.latest_checkpoint(self.ckpt_root),
            )
        self.shutdown()

    def shutdown(self) -> None:
        """Stop the worker processes (Ray) or drop the in-process workers, and the reward pool."""
        if self.workers is not None:
            self.workers.shutdown()
        if isinstance(self.compute_score, (WorkerPool, RemoteReward)):
            self.compute_score.close()


def _save_worker_rng(pool: str, rank: int, path: str) -> None:
    torch.save(ckpt.rng_state(), Path(path) / f"rng_{pool}_{rank}.pt")


def _load_worker_rng(pool: str, rank: int, path: str) -> None:
    ckpt.restore_rng_file(Path(path) / f"rng_{pool}_{rank}.pt")


def _restore_worker_rng(workers: WorkerGroups, path: Path) -> None:
    """Each worker process's RNG, when the checkpoint was written by the same pools; after a
    change of world size the ranks keep their fresh seeds (the data order is the controller's)."""
    if workers.backend is None:
        return  # in-process: the controller's rng.pt covers the worker
    sizes = workers.backend.world_sizes()
    saved = {pool: len(list(path.glob(f"rng_{pool}_*.pt"))) for pool in sizes}
    if saved == sizes:
        workers.backend.run_on_hosts(_load_worker_rng, str(path))
    else:
        print(
            f"[hybridrl] note: {path} was saved by other worker pools ({saved} vs {sizes} ranks); "
            "worker RNG streams restart from the seed",
            flush=True,
        )


def _reward_fn(cfg, reward_fn: ComputeScore | None = None):
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


def _check_reward_kwargs(cfg, custom, records) -> None:
    try:
        batched = cfg.reward_model.reward_manager == "batch" or getattr(custom, "batched", False)
        check_reward_kwargs(custom, cfg.custom_reward_function.reward_kwargs, {r.data_source for r in records}, batched)
        rm = cfg.reward_model  # the built-in scorers score every sample unless a remote or RM-only reward does
        if custom is None and not cfg.custom_reward_function.remote.url and not (rm.enable and rm.rule_weight == 0):
            code = CODE_SOURCES if rm.sandbox_fusion.url else ()
            check_data_sources([r.data_source for r in records if r.data_source not in code], str(cfg.data.train_files))
    except ValueError as e:
        raise ConfigError([str(e)]) from None


def build_run(
    cfg: Config,
    data: Callable[..., tuple[PromptLoader, list[PromptRecord]]] | None = None,
    need_ref: bool | None = None,
    reward_fn: ComputeScore | None = None,
    reward_models: list | None = None,
) -> RunContext:
    """Data, workers (fresh or resumed from the latest checkpoint), tracking, warm-up.

    The RL loop calls it with the defaults. Other trainers pass `data(tokenizer) -> (loader,
    val_records)` in place of the prompt data and say whether they `need_ref` (the frozen
    reference policy); the rest (workers, checkpoints, resume, tracking) is shared. `reward_fn`:
    a reward function object from the Python API, used in place of the configured one.
    `reward_models` (the Python API's): in place of reward_model.model.path, a list of one reward
    model: a path, an `nn.Module` with forward(input_ids, attention_mask) -> scores (an HF sequence
    classifier is one), or a (model, tokenizer) pair; it turns reward_model.enable on.
    """
    rm_spec = _reward_model_spec(cfg, reward_models)
    resolve(cfg)  # a Config built in code: its "null = inherit" keys filled in, as loading does
    plan = plan_batches(cfg)
    out = run_dir(cfg)
    resume_from = _find_resume(cfg)
    if resume_from is None:
        rundir.claim(out, cfg.trainer.overwrite)
    if cfg.actor_rollout_ref.rollout.name in ("native", "auto") and cfg.trainer.device != "cpu":
        stable_cache_addresses()  # the engine's CUDA graphs survive its cache being freed and re-allocated
    ckpt.seed_everything(cfg.trainer.seed)
    if cfg.trainer.deterministic:
        make_deterministic()

    m = cfg.actor_rollout_ref.model
    tokenizer_key = "tokenizer_path" if m.tokenizer_path not in (None, m.path) else "path"
    notice(f"loading the tokenizer of {m.tokenizer_path or m.path}")
    tokenizer = load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code, what=f"actor_rollout_ref.model.{tokenizer_key}")
    compute_score, need_gt, custom = _reward_fn(cfg, reward_fn)
    loader, val_records = data(tokenizer) if data else _prompt_data(cfg, tokenizer, need_gt, custom)
    notice(
        f"data: {len(loader.records)} training rows, {len(val_records)} validation rows; starting the workers "
        f"({'Ray' if uses_ray(cfg) else 'in-process'})"
    )
    a, algo = cfg.actor_rollout_ref.actor, cfg.algorithm
    if need_ref is None:
        need_ref = a.use_kl_loss or algo.use_kl_in_reward
    # The reference is the initial policy; `_start` saves it with checkpoints when it cannot be
    # reloaded from model.path (random weights, or weights changed by the warm-up).
    roles = {
        ACTOR: RewardModelTrainWorker if algo.name == "rm" else ActorRolloutRefWorker,
        **({CRITIC: CriticWorker} if cfg.critic_enabled else {}),
        **({REWARD_MODEL: JudgeWorker if cfg.reward_model.generative.enable else RewardModelWorker} if rm_spec else {}),
        **({ROLLOUT: RolloutWorker} if cfg.resource_pool.rollout else {}),
    }
    scorer = reward_pool(cfg, compute_score, in_memory=reward_fn is not None)
    try:
        workers = create_worker_groups(cfg, plan, roles)
    except BaseException:
        if hasattr(scorer, "close"):
            scorer.close()
        raise
    try:
        if cfg.trainer.deterministic and workers.backend is not None:
            workers.backend.run_on_hosts(make_worker_deterministic)
        if rm_spec is not None:
            notice(f"loading the reward model {rm_spec[0] if isinstance(rm_spec[0], str) else type(rm_spec[0]).__name__}")
            workers[REWARD_MODEL].init_model(*rm_spec)
        run = _start(cfg, plan, workers, out, resume_from, need_ref, loader, val_records, tokenizer, scorer)
        run.reward_model = workers.get(REWARD_MODEL)
        run.rollout = run.actor
        if workers.get(ROLLOUT) is not None:  # its ranks get the weights from the actor before each generate
            notice(f"rollout pool: {workers[ROLLOUT].world_size} rank(s) apart from the actor's; opening the weight channel")
            workers[ROLLOUT].init_model(cfg.actor_rollout_ref.model.path, True)
            run.rollout = RolloutPool.connect(run.actor, workers[ROLLOUT])
        return run
    except BaseException:
        workers.shutdown()
        if hasattr(scorer, "close"):
            scorer.close()
        raise


def _reward_model_spec(cfg, reward_models: list | None) -> tuple | None:
    """(model, tokenizer) for `RewardModelWorker.init_model`, or None when the run has no reward model."""
    if cfg.algorithm.name != "rl" or not (cfg.reward_model.enable or reward_models):
        return None
    if not reward_models:
        if not cfg.reward_model.model.path:
            raise ConfigError(["reward_model.enable=true needs reward_model.model.path (a sequence-classifier directory)"])
        return (cfg.reward_model.model.path, None)
    if len(reward_models) > 1:
        raise ConfigError([f"reward_models: got {len(reward_models)}; one reward model per run (wrap several in one nn.Module)"])
    model, tokenizer = reward_models[0] if isinstance(reward_models[0], tuple) else (reward_models[0], None)
    cfg.reward_model.enable = True
    return (str(model) if isinstance(model, Path) else model, tokenizer)


def _start(cfg, plan, workers, out, resume_from, need_ref, loader, val_records, tokenizer, compute_score) -> RunContext:
    """Load or resume the workers' models, open tracking, run the warm-up."""
    m = cfg.actor_rollout_ref.model
    total_steps = cfg.trainer.total_training_steps or cfg.trainer.total_epochs * len(loader)
    save_ref = need_ref and (m.random_init or cfg.warmup.steps > 0)
    actor, critic = workers[ACTOR], workers.get(CRITIC)
    actor_steps = total_steps * plan.actor.optimizer_steps_per_step
    critic_steps = total_steps * plan.critic.optimizer_steps_per_step if critic else 0

    state: dict = {}
    notice(
        f"loading the policy {m.path}{' (random weights)' if m.random_init and resume_from is None else ''}"
        f"{' + the frozen reference' if need_ref else ''}{' and the critic' if critic else ''}"
        f"{f' from {resume_from}' if resume_from else ''}; rollout engine {cfg.actor_rollout_ref.rollout.name}"
    )
    if resume_from is None:
        actor.init_model(m.path, m.random_init, actor_steps, need_ref, ref_path=None)
        if critic:
            critic.init_model(cfg.critic.model.path, m.random_init and cfg.critic.model.path == m.path, critic_steps)
    else:
        # Built from the checkpoint's config.json, then the (sharded) weights and optimizer are
        # loaded by name: any world size can resume any checkpoint.
        ref_path = None if (resume_from / "ref").exists() else m.path  # a saved ref comes with load_checkpoint
        actor.init_model(str(resume_from / "actor"), True, actor_steps, need_ref, ref_path=ref_path)
        actor.load_checkpoint(str(resume_from))
        if critic:
            critic.init_model(str(resume_from / "critic"), True, critic_steps)
            critic.load_checkpoint(str(resume_from))
        state = ckpt.load_trainer_state(resume_from)
        loader.load_state_dict(state["data"])
        ckpt.restore_rng(resume_from)
        _restore_worker_rng(workers, resume_from)

    global_step = state.get("global_step", 0)
    tracker = Tracker(
        cfg.trainer.logger,
        out,
        project=cfg.trainer.project_name,
        name=cfg.trainer.experiment_name,
        config=to_dict(cfg),
        total_steps=total_steps,
        resume_step=global_step if resume_from else None,
    )
    if resume_from is None:
        if cfg.warmup.steps > 0:
            notice(f"supervised warm-up: {cfg.warmup.steps} steps on {cfg.warmup.files}")
            state["warmup_metrics"] = run_warmup(cfg, actor, tokenizer)
        actor.freeze_reference()
        print(f"[hybridrl] run dir {out} | {total_steps} steps | {_where(cfg, workers)}", flush=True)
        r, dev = cfg.actor_rollout_ref.rollout, cfg.trainer.device
        if (
            r.name in ("native", "auto")
            and not r.enforce_eager
            and (dev == "cuda" or dev == "auto" and torch.cuda.is_available())
        ):
            notice("the first generation captures the native engine's CUDA graphs (once per batch-size band)")
    else:
        _truncate_jsonl(out / "samples.jsonl", global_step)
        print(f"[hybridrl] resumed from {resume_from} at step {global_step}/{total_steps}", flush=True)
    save_config(cfg, out / "config.yaml")

    return RunContext(
        cfg=cfg,
        dir=out,
        loader=loader,
        val_records=val_records,
        actor=actor,
        critic=critic,
        compute_score=compute_score,
        need_ref=need_ref,
        save_ref=save_ref,
        tracker=tracker,
        total_steps=total_steps,
        pad_token_id=tokenizer.pad_token_id,
        val_batch_size=cfg.data.val_batch_size or max(1, len(val_records)),
        workers=workers,
        global_step=global_step,
        trainer_state=state,
        tokenizer=tokenizer,
    )


def _where(cfg, workers: WorkerGroups) -> str:
    if workers.backend is None:
        return f"device {cfg.trainer.device}"
    pools = ", ".join(f"{pool}: {n} ranks" for pool, n in workers.backend.world_sizes().items())
    return f"Ray, device {cfg.trainer.device} ({pools})"


def _prompt_data(cfg, tokenizer, need_gt, custom_reward=None):
    """The RL loop's prompts: a resumable PromptLoader over the training rows, and validation rows."""
    from hybridrl.rollout.agent.rollout import chat_tools

    tools = chat_tools(cfg.actor_rollout_ref.rollout.multi_turn)  # hermes: the tools' schemas in the prompt
    records = load_prompt_records(
        cfg.data.train_files,
        tokenizer,
        prompt_key=cfg.data.prompt_key,
        reward_fn_key=cfg.data.reward_fn_key,
        max_prompt_length=cfg.data.max_prompt_length,
        truncation=cfg.data.truncation,
        filter_overlong=cfg.data.filter_overlong_prompts,
        require_ground_truth=need_gt,
        tools=tools,
    )
    _check_reward_kwargs(cfg, custom_reward, records)
    val_records = []
    if cfg.data.val_files:
        val_records = load_prompt_records(
            cfg.data.val_files,
            tokenizer,
            prompt_key=cfg.data.prompt_key,
            reward_fn_key=cfg.data.reward_fn_key,
            max_prompt_length=cfg.data.max_prompt_length,
            truncation=cfg.data.truncation,
            filter_overlong=cfg.data.filter_overlong_prompts,
            require_ground_truth=need_gt,
            max_rows=cfg.data.val_max_samples,
            tools=tools,
        )
    # DAPO dynamic sampling draws data.gen_batch_size prompts per generation round
    prompts_per_batch = (
        (cfg.data.gen_batch_size or cfg.data.train_batch_size)
        if cfg.algorithm.filter_groups.enable
        else cfg.data.train_batch_size
    )
    loader = PromptLoader(records, prompts_per_batch, tokenizer.pad_token_id, shuffle=cfg.data.shuffle, seed=_shuffle_seed(cfg))
    return loader, val_records


def _find_resume(cfg) -> Path | None:
    t = cfg.trainer
    if t.resume_mode == "disable":
        return None
    if t.resume_mode == "resume_path":
        path = Path(t.resume_from_path)
        if not (path / "trainer_state.json").exists():
            raise FileNotFoundError(f"trainer.resume_from_path={path} is not a complete checkpoint (no trainer_state.json)")
        return ckpt.check_resumable(path)
    last = ckpt.latest_checkpoint(checkpoints_dir(cfg))
    return ckpt.check_resumable(last) if last else None


def _truncate_jsonl(path: Path, step: int) -> None:
    truncate_jsonl(path, step)


# -- supervised warm-up -----------------------------------------------------------------------
def run_warmup(cfg, actor, tokenizer) -> dict:
    """A short supervised stage on (prompt, response) rows before RL (the quickstart uses it)."""
    w = cfg.warmup
    pairs = load_warmup_pairs(
        w.files,
        tokenizer,
        prompt_key=cfg.data.prompt_key,
        max_prompt_length=cfg.data.max_prompt_length,
        truncation=cfg.data.truncation,
    )
    rng = np.random.default_rng(cfg.trainer.seed)
    pad = tokenizer.pad_token_id
    for step in range(1, w.steps + 1):
        # Equal shares for the data-parallel ranks: an update must not train on padding rows.
        size = min(w.batch_size, len(pairs) - len(pairs) % actor.world_size)
        idx = rng.choice(len(pairs), size=size, replace=False)
        m = actor.sft_step(_sft_batch([pairs[i] for i in idx], pad), w.lr)
        if step == w.steps or step % max(1, w.steps // 5) == 0:
            print(
                f"warm-up {step}/{w.steps} | warmup/loss {m['warmup/loss']:.3f} | warmup/token_acc {m['warmup/token_acc']:.3f}",
                flush=True,
            )
    return m


def _sft_batch(pairs, pad: int) -> Batch:
    P = max(len(p) for p, _ in pairs)
    R = max(len(r) for _, r in pairs)
    prompts = torch.full((len(pairs), P), pad, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompts)
    responses = torch.full((len(pairs), R), pad, dtype=torch.long)
    response_mask = torch.zeros((len(pairs), R), dtype=torch.float32)
    for i, (p, r) in enumerate(pairs):
        prompts[i, P - len(p) :], prompt_mask[i, P - len(p) :] = torch.tensor(p), 1
        responses[i, : len(r)], response_mask[i, : len(r)] = torch.tensor(r), 1
    return Batch({K.PROMPTS: prompts, K.PROMPT_MASK: prompt_mask, K.RESPONSES: responses, K.RESPONSE_MASK: response_mask})


def _shuffle_seed(cfg) -> int:
    """data.seed (verl's name) seeds the prompt shuffle; unset, trainer.seed does."""
    return cfg.data.seed if cfg.data.seed is not None else cfg.trainer.seed
