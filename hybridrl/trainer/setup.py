"""Everything a run needs before its first step: data, workers, rewards, tracking, resume.

Kept apart from the loop (`loop.py`) and the steps (`ppo.py`, `offline.py`) so that those read as the
algorithm and this file as the plumbing. `build_run` is the one way to build a run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hybridrl.config import Config, ConfigError, plan_batches, resolve, save_config, to_dict
from hybridrl.data.batch import Batch
from hybridrl.data.dataset import PromptLoader, PromptRecord, load_prompt_records
from hybridrl.distributed.groups import WorkerGroups, create_worker_groups, uses_ray
from hybridrl.distributed.resource_pool import ACTOR, CRITIC, REWARD_MODEL, ROLLOUT
from hybridrl.distributed.worker_group import WorkerGroup
from hybridrl.models.loading import load_tokenizer
from hybridrl.rewards.assembly import build_scorer, check_kwargs, ground_truth_rule
from hybridrl.rewards.scorer import Scorer
from hybridrl.rollout.native.cache import stable_cache_addresses
from hybridrl.tracking.summary import end_of_run_summary
from hybridrl.tracking.tracker import Tracker, notice, truncate_jsonl
from hybridrl.trainer import checkpoint as ckpt
from hybridrl.trainer import rundir
from hybridrl.trainer.determinism import make_deterministic, make_worker_deterministic
from hybridrl.trainer.rollout_log import log_train_samples
from hybridrl.trainer.rollout_pool import RolloutPool
from hybridrl.trainer.rundir import checkpoints_dir, find_resume, run_dir
from hybridrl.trainer.warmup import run_warmup
from hybridrl.workers.actor import ActorRolloutRefWorker
from hybridrl.workers.critic import CriticWorker
from hybridrl.workers.judge import JudgeWorker
from hybridrl.workers.reward_model import RewardModelTrainWorker, RewardModelWorker
from hybridrl.workers.rollout import RolloutWorker


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
    scorer: Scorer  # the rule-based / custom / remote reward (hybridrl/rewards/assembly.py)
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
    tokenizer: Any = None  # the policy's: decodes responses scored while generating (hybridrl/rewards/stream.py)
    rollout: Any = None  # what generates: the actor's group, or the RolloutPool of resource_pool.rollout
    closed: bool = False
    reward_object: bool = False  # scored by a reward function object (the Python API's): eval cannot rebuild it
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
        stopping = sys.exc_info()[1]
        if isinstance(stopping, KeyboardInterrupt) and not self.closed:  # Ctrl-C, or SIGTERM/SIGHUP (SignalStop)
            why = str(stopping) or "interrupted"
            print(f"[hybridrl] {why}: closing the loggers and stopping the workers (Ctrl-C again quits at once)", flush=True)
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
                self.reward_object,
            )
        self.shutdown()

    def shutdown(self) -> None:
        """Stop the worker processes (Ray) or drop the in-process workers, and the reward pool."""
        if self.workers is not None:
            self.workers.shutdown()
        self.scorer.close()


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


def build_run(
    cfg: Config,
    data: Callable[..., tuple[PromptLoader, list[PromptRecord]]] | None = None,
    need_ref: bool | None = None,
    reward_fn: Any = None,
    reward_models: list | None = None,
) -> RunContext:
    """Data, workers (fresh or resumed from the latest checkpoint), tracking, warm-up.

    The RL loop calls it with the defaults. Other trainers pass `data(tokenizer) -> (loader,
    val_records)` in place of the prompt data and say whether they `need_ref` (the frozen
    reference policy); the rest (workers, checkpoints, resume, tracking) is shared. `reward_fn`:
    a reward function (or a ready `Scorer`) from the Python API, used in place of the configured one.
    `reward_models` (the Python API's): in place of reward_model.model.path, a list of one reward
    model: a path, an `nn.Module` with forward(input_ids, attention_mask) -> scores (an HF sequence
    classifier is one), or a (model, tokenizer) pair, with reward_model.enable=true (the API sets it).
    """
    if cfg.resource_pool.rollout == "auto":  # resolved by the launch loop: trainer/calibration.py
        raise ConfigError(
            [
                "resource_pool.rollout=auto is chosen by fit_with_restarts (hybridrl train, RLTrainer.fit); "
                "to build a trainer directly, set resource_pool.rollout to a number of devices or null"
            ]
        )
    rm_spec = _reward_model_spec(cfg, reward_models)
    resolve(cfg)  # a Config built in code: its "null = inherit" keys filled in, as loading does
    plan = plan_batches(cfg)
    out = run_dir(cfg)
    resume_from = find_resume(cfg)
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
    # The reward's processes start before the data is tokenized: a function given in Python runs in
    # forks of this process, made while it holds few threads (hybridrl/rewards/pool.py).
    scorer = build_scorer(cfg, reward_fn)
    try:
        loader, val_records = data(tokenizer) if data else _prompt_data(cfg, tokenizer, reward_fn)
    except BaseException:
        scorer.close()
        raise
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
    try:
        workers = create_worker_groups(cfg, plan, roles)
    except BaseException:
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
        run.reward_object = reward_fn is not None
        run.rollout = run.actor
        if workers.get(ROLLOUT) is not None:  # its ranks get the weights from the actor before each generate
            notice(f"rollout pool: {workers[ROLLOUT].world_size} rank(s) apart from the actor's; opening the weight channel")
            workers[ROLLOUT].init_model(cfg.actor_rollout_ref.model.path, True)
            run.rollout = RolloutPool.connect(run.actor, workers[ROLLOUT])
        return run
    except BaseException:
        workers.shutdown()
        scorer.close()
        raise


def _reward_model_spec(cfg, reward_models: list | None) -> tuple | None:
    """(model, tokenizer) for `RewardModelWorker.init_model`, or None when the run has no reward model."""
    if cfg.algorithm.name != "rl" or not cfg.reward_model.enable:
        if reward_models and cfg.algorithm.name == "rl":  # the Python API turns it on with its argument
            raise ConfigError(["reward_models given with reward_model.enable=false; set reward_model.enable=true"])
        return None
    if not reward_models:
        if not cfg.reward_model.model.path:
            raise ConfigError(["reward_model.enable=true needs reward_model.model.path (a sequence-classifier directory)"])
        return (cfg.reward_model.model.path, None)
    if len(reward_models) > 1:
        raise ConfigError([f"reward_models: got {len(reward_models)}; one reward model per run (wrap several in one nn.Module)"])
    model, tokenizer = reward_models[0] if isinstance(reward_models[0], tuple) else (reward_models[0], None)
    return (str(model) if isinstance(model, Path) else model, tokenizer)


def _start(cfg, plan, workers, out, resume_from, need_ref, loader, val_records, tokenizer, scorer) -> RunContext:
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
        scorer=scorer,
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


def _prompt_data(cfg, tokenizer, reward_fn=None):
    """The RL loop's prompts: a resumable PromptLoader over the training rows, and validation rows.
    `reward_fn`: the Python API's, in place of the config's (what the rows must hold, and the checks)."""
    from hybridrl.rollout.agent.rollout import chat_tools

    tools = chat_tools(cfg.actor_rollout_ref.rollout.multi_turn)  # hermes: the tools' schemas in the prompt
    need_gt = ground_truth_rule(cfg, reward_fn)
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
    try:
        check_kwargs(cfg, reward_fn, [r.data_source for r in records])
    except ValueError as e:
        raise ConfigError([str(e)]) from None
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


def _truncate_jsonl(path: Path, step: int) -> None:
    truncate_jsonl(path, step)


def _shuffle_seed(cfg) -> int:
    """data.seed (verl's name) seeds the prompt shuffle; unset, trainer.seed does."""
    return cfg.data.seed if cfg.data.seed is not None else cfg.trainer.seed
