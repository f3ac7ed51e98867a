"""The Python API: `RLTrainer(...).fit()`, and `grpo(...)` / `ppo(...)` for the common case.

    import hybridrl
    result = hybridrl.grpo(model="path/or/PreTrainedModel", data=rows, reward=my_fn, batch_size=8, rollout_n=4)
    result.history[-1]["critic/score/mean"], result.model()

This module builds the config and hands it to the launch path the CLI uses (hybridrl/launch.py):
the config is loaded by `load_config`/`config_from_dict` with the command line's `key=value`
overrides, checked like `hybridrl train` checks it, and trained by `launch.train_in_process`
(the CLI's `fit_with_restarts` in this process). What the caller passes as Python objects is
turned into what a config names, under the run directory's `inputs/` (hybridrl/inputs.py), so
`config.yaml` of an API run is a runnable CLI config and resume works the same. A reward function
object is not shipped anywhere: rewards are computed by the controller (this process), in forks of
it with `custom_reward_function.timeout_s` per call, on every backend.

TRL's vocabulary (GRPOConfig's names, `args=GRPOConfig(...)`, GRPOTrainer's positional order, TRL-form
reward functions, transformers callbacks) is translated at this edge by hybridrl/compat/trl.

Errors a user can fix raise `HybridRLError` with the one line `hybridrl train` prints; a run that
stopped itself (non-finite losses, a dead worker) raises `TrainingStopped`. Nothing is left
behind between two runs in one process: the RNG states, environment variables, torch's thread
count, the reward-failure log and a Ray cluster the run started are restored or shut down.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

__all__ = ["FitResult", "HybridRLError", "RLTrainer", "TrainingStopped", "batched_reward", "grpo", "ppo"]


class HybridRLError(Exception):
    """A problem with what was passed (config, data, model, paths, reward function); the message is the
    one line `hybridrl train` prints after `hybridrl: error:`, naming what is wrong and the fix."""


class TrainingStopped(HybridRLError):
    """The run stopped itself: non-finite losses, a worker that died, dynamic sampling out of data.
    The last good checkpoint is intact (the message says where)."""


def batched_reward(fn: Callable) -> Callable:
    """Mark a reward function as batched: called once per batch as
    `fn(data_sources=[...], solution_strs=[...], ground_truths=[...], extra_infos=[...])`, returning one
    number or dict per response (verl's `batch` reward manager). The same as setting `fn.batched = True`.

    >>> @batched_reward
    ... def exact(data_sources, solution_strs, ground_truths, extra_infos):
    ...     return [float(s == g) for s, g in zip(solution_strs, ground_truths)]
    >>> exact.batched
    True
    """
    fn.batched = True
    return fn


@dataclass
class FitResult:
    """What `fit()` returns: the run's metrics and a way to its trained model."""

    run_dir: Path
    """The run directory (config.yaml, metrics.jsonl, checkpoints/, inputs/)."""
    history: list[dict]
    """metrics.jsonl: one dict per logged step (step 0: warm-up and validation before training)."""
    metrics: dict
    """The last training step's metrics."""
    validation: dict = field(default_factory=dict)
    """The last validation's metrics (val-core/..., val-aux/...); empty without val_data."""
    checkpoint: Path | None = None
    """The last checkpoint (checkpoints/step_N), where `model()` and `save()` read the policy."""

    def save(self, path: str | os.PathLike) -> Path:
        """Write the trained policy as a plain Hugging Face directory (`hybridrl export` does the same)."""
        import shutil

        from hybridrl.distributed.checkpoint import export_hf, is_sharded_checkpoint

        actor = self._actor_dir()
        if is_sharded_checkpoint(actor):
            return export_hf(actor, path)
        shutil.copytree(actor, path, dirs_exist_ok=True)  # LoRA: the actor dir is already the merged HF model
        return Path(path)

    def model(self, device: str = "cpu"):
        """The trained policy as a transformers `PreTrainedModel` (float32, eval mode)."""
        from hybridrl.models.loading import load_causal_lm

        with tempfile.TemporaryDirectory() as tmp:
            model = load_causal_lm(str(self.save(tmp))).to(device).eval()
        # where its tokenizer is, so that grpo(result.model(), ...) finds it
        model.name_or_path = model.config._name_or_path = str(self._actor_dir())
        return model

    def tokenizer(self):
        from hybridrl.models.loading import load_tokenizer

        return load_tokenizer(str(self._actor_dir()))

    def _actor_dir(self) -> Path:
        if self.checkpoint is None:
            raise HybridRLError(f"{self.run_dir} has no checkpoint: the run took no step, so there is no trained model")
        return self.checkpoint / "actor"


class RLTrainer:
    """A run of the RL trainer (PPO, GRPO, ...; DPO/KTO/SFT by algorithm.name) built from Python objects.

    Every argument is optional and takes a path or an object:

    - `config`: a YAML path, a dict of sections, or a `hybridrl.config.Config`; None = the defaults.
    - `overrides`: `["key=value", ...]`, exactly as on the command line (applied after `config`).
    - `actor`, `critic`: a model directory or a transformers `PreTrainedModel`; `tokenizer`: a
      directory or a tokenizer object (default: the actor's directory, or the model's `name_or_path`).
    - `reward_fn`: `(data_source, solution_str, ground_truth, extra_info) -> float | dict`, or a batched
      function (`batched_reward`), or a `hybridrl.rewards.remote.RemoteReward`; None = the config's. Or
      TRL's form, `f(prompts, completions, **columns) -> list[float]` (sync or async), or a list of such
      functions summed with `reward_weights`: rows are then `{"prompt": ..., <any columns>}`
      (hybridrl/compat/trl, docs/coming_from_trl.md).
    - `callbacks`: objects with `on_step_end(metrics)`, `on_evaluate(metrics)`, `on_save(path)`; one that
      returns True stops the run (hybridrl/trainer/callbacks.py, `EarlyStopping`). Their signatures are
      checked here; a transformers `TrainerCallback` is refused in one line.
    - `train_data`, `val_data`: a .jsonl/.parquet path (or a list of paths), a list of row dicts, a
      pandas DataFrame, a `datasets.Dataset`, or a pyarrow Table, in verl's row format.
    - `reward_models`: reward-model workers (see docs/api.md).

    Arguments win over the same keys in `config` and `overrides`.
    """

    def __init__(
        self,
        config: str | os.PathLike | Mapping | Any | None = None,
        *,
        actor: Any = None,
        critic: Any = None,
        tokenizer: Any = None,
        reward_models: Sequence[Any] | None = None,
        reward_fn: Callable | None = None,
        train_data: Any = None,
        val_data: Any = None,
        overrides: Sequence[str] | str | None = None,
        reward_weights: Sequence[float] | None = None,
        callbacks: Sequence[Any] | None = None,
    ):
        from hybridrl.compat import trl
        from hybridrl.trainer.callbacks import check_callbacks

        try:  # TRL-form reward functions and rows, transformers callbacks (hybridrl/compat/trl)
            reward_fn, train_data, val_data = trl.adapt_reward(reward_fn, reward_weights, train_data, val_data)
            self.callbacks = check_callbacks(trl.check_callbacks(callbacks))
        except ValueError as e:
            raise HybridRLError(str(e)) from None
        self.reward_fn, self.reward_models = reward_fn, list(reward_models or [])
        self._objects = {"actor": actor, "critic": critic, "tokenizer": tokenizer, "train_data": train_data, "val_data": val_data}
        self._config_source = config
        self._config_path = str(config) if isinstance(config, (str, os.PathLike)) else None
        self._overrides = [overrides] if isinstance(overrides, str) else list(overrides or [])
        self.config = _as_user_error(self._config_path, None)(self._load_config)()
        """The run's resolved `hybridrl.config.Config` (the object paths filled in)."""

    # -- building the config -----------------------------------------------------------------
    def _load_config(self):
        from hybridrl import inputs

        first = self._read(self._overrides, check=False)  # only for where the run directory is
        values = inputs.config_values(
            Path(first.trainer.default_local_dir) / "inputs", **self._objects, reward_models=bool(self.reward_models)
        )
        return self._read(self._overrides + [f"{k}={json.dumps(v)}" for k, v in values.items()], check=True)

    def _read(self, overrides: list[str], check: bool):
        from hybridrl.config import Config, ConfigError, config_from_dict, load_config, to_dict

        source = self._config_source
        if source is None or isinstance(source, (str, os.PathLike)):
            return load_config(source, overrides, check=check)
        if isinstance(source, Config) or is_dataclass(source):
            source = to_dict(source)
        if not isinstance(source, Mapping):
            raise ConfigError([f"config must be a YAML path, a dict or a hybridrl Config, got {type(source).__name__}"])
        return config_from_dict(source, overrides, check=check)

    # -- running -----------------------------------------------------------------------------
    def fit(self) -> FitResult:
        """Train to the end; returns the metrics history, the last validation and the trained model."""
        return _as_user_error(self._config_path, self.config)(self._fit)()

    def _fit(self) -> FitResult:
        from hybridrl import inputs, launch
        from hybridrl.trainer import checkpoint as ckpt
        from hybridrl.trainer.callbacks import with_callbacks
        from hybridrl.trainer.rundir import run_dir

        cfg = self.config
        launch.train_in_process(
            cfg,
            with_callbacks(self._trainer_class(), self.callbacks),
            write_inputs=functools.partial(inputs.write, cfg, **self._objects),
            reward_fn=self.reward_fn,
            in_memory_rm=bool(self.reward_models),
        )
        out = run_dir(cfg)
        history = _read_history(out / "metrics.jsonl")
        validation = next((_val(r) for r in reversed(history) if _val(r)), {})
        train = next((r for r in reversed(history) if r.get("step", 0) > 0), {})
        out = out.resolve()  # the result stays usable after a chdir (a notebook's %cd)
        return FitResult(out, history, train, validation, ckpt.latest_checkpoint(out / "checkpoints"))

    def _trainer_class(self):
        """The trainer `hybridrl train` picks for algorithm.name, with the reward function object bound."""
        from hybridrl.launch import trainer_class

        trainer = trainer_class(self.config)
        if self.reward_fn is None and not self.reward_models:
            return trainer
        from hybridrl.trainer.ppo import PPOTrainer

        if trainer is not PPOTrainer:
            name = self.config.algorithm.name
            what = "reward_fn" if self.reward_fn is not None else "reward_models"
            raise HybridRLError(f"{what} is for RL; algorithm.name={name} trains on fixed data and scores nothing")
        # the reward models (paths, modules, (module, tokenizer) pairs) go to build_run as they are
        return functools.partial(PPOTrainer, reward_fn=self.reward_fn, reward_models=self.reward_models or None)


# --------------------------------------------------------------------------- short forms

# Keyword names for the keys set most often; any other key by its last name when that is unique
# in the config (`ppo_epochs`), or dotted through a dict: `**{"actor_rollout_ref.rollout.top_p": 0.9}`.
SHORT_KEYS = {
    "batch_size": "data.train_batch_size",
    "max_prompt_length": "data.max_prompt_length",
    "max_response_length": "data.max_response_length",
    "rollout_n": "actor_rollout_ref.rollout.n",
    "lr": "actor_rollout_ref.actor.optim.lr",
    "steps": "trainer.total_training_steps",
    "epochs": "trainer.total_epochs",
    "mini_batch_size": "actor_rollout_ref.actor.ppo_mini_batch_size",
    "micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "kl_coef": "actor_rollout_ref.actor.kl_loss_coef",
    "temperature": "actor_rollout_ref.rollout.temperature",
    "output_dir": "trainer.default_local_dir",
    "device": "trainer.device",
    "seed": "trainer.seed",
    "n_gpus": "trainer.n_gpus_per_node",
}


def keyword_overrides(settings: Mapping[str, Any], problems: list[str] | None = None) -> list[str]:
    """`{"rollout_n": 8, "data.max_prompt_length": 64}` -> `["actor_rollout_ref.rollout.n=8", "data.max_prompt_length=64"]`.

    A name is a key of SHORT_KEYS, a dotted config key, or the last part of exactly one config key. Names
    that are none of these are reported together: appended to `problems`, or raised as one HybridRLError.

    >>> keyword_overrides({"rollout_n": 8, "max_prompt_length": 64, "trainer.logger": ["console"]})
    ['actor_rollout_ref.rollout.n=8', 'data.max_prompt_length=64', 'trainer.logger=["console"]']
    """
    from hybridrl.config import Config, suggest_keys
    from hybridrl.config.schema import walk

    keys = [e.path for e in walk(Config()) if not e.is_section]
    out, unknown = [], []
    for name, value in settings.items():
        if name in SHORT_KEYS:
            key = SHORT_KEYS[name]
        elif "." in name:
            key = name
        else:
            matches = [k for k in keys if k.rsplit(".", 1)[-1] == name]
            if len(matches) != 1:
                why = f"names {len(matches)} keys ({', '.join(matches)})" if matches else "is no config key"
                hint = f"; did you mean {suggest_keys(name)[0]!r}?" if not matches and suggest_keys(name) else ""
                example = (matches or ["data.train_batch_size"])[0]
                unknown.append(
                    f"keyword {name}={value!r} {why}{hint}; pass the dotted key, e.g. **{{{example!r}: ...}}, "
                    f"or one of {', '.join(SHORT_KEYS)}"
                )
                continue
            key = matches[0]
        out.append(f"{key}={json.dumps(value, default=str)}")
    if problems is not None:
        problems.extend(unknown)
    elif unknown:
        raise HybridRLError(_one_message(unknown, "the keywords"))
    return out


def _one_message(problems: list[str], where: str) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems in {where}: " + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))


def grpo(
    model: Any,
    data: Any = None,
    reward: Callable | Sequence[Callable] | None = None,
    *,
    val_data: Any = None,
    tokenizer: Any = None,
    config: Any = None,
    overrides: Sequence[str] = (),
    **settings: Any,
) -> FitResult:
    """GRPO in one call: `grpo(model, data, reward, batch_size=8, rollout_n=4, steps=20)`.

    `settings` are config keys by keyword (SHORT_KEYS, a unique last name, or dotted via a dict), or
    TRL's GRPOConfig names (`num_generations`, `learning_rate`, `beta`, ...), or `args=GRPOConfig(...)`
    (hybridrl/compat/trl); `reward` may be TRL-form functions (a list, with `reward_weights=`), and TRL's
    order `grpo(model, reward_funcs, args)` works too; `callbacks=` as RLTrainer's. Every name that cannot
    be used is reported in one HybridRLError. Defaults: algorithm.adv_estimator=grpo, 4 samples per prompt,
    the KL loss to the reference on, and the mini-batch as large as the batch when only the batch size is given.
    """
    base = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.use_kl_loss=true"]
    return _short_form(base, model, data, reward, val_data, tokenizer, config, overrides, settings, algorithm="grpo")


def ppo(
    model: Any,
    data: Any = None,
    reward: Callable | Sequence[Callable] | None = None,
    *,
    critic: Any = None,
    val_data: Any = None,
    tokenizer: Any = None,
    config: Any = None,
    overrides: Sequence[str] = (),
    **settings: Any,
) -> FitResult:
    """PPO with a learned critic (GAE) in one call; the critic starts from `critic` or the policy's weights."""
    base = ["algorithm.adv_estimator=gae"]
    return _short_form(
        base, model, data, reward, val_data, tokenizer, config, overrides, settings, critic=critic, algorithm="ppo"
    )


def _short_form(base, model, data, reward, val_data, tokenizer, config, overrides, settings, critic=None, algorithm="grpo"):
    from hybridrl.compat import trl

    try:  # TRL's positional order, args=GRPOConfig(...) and names (hybridrl/compat/trl)
        call = trl.read_call(data, reward, {"val_data": val_data, "tokenizer": tokenizer}, settings, algorithm)
    except ValueError as e:
        raise HybridRLError(str(e)) from None
    t = call.translation
    problems = list(call.problems)
    keywords = keyword_overrides(t.rest, problems)
    if problems:
        raise HybridRLError(_one_message(problems, f"the arguments of {algorithm}()"))
    overrides = list([overrides] if isinstance(overrides, str) else overrides)
    overrides = base + t.overrides + mini_batch_default(config, overrides + keywords) + overrides + keywords
    trainer = RLTrainer(
        config,
        actor=model,
        critic=critic,
        tokenizer=t.api.get("processing_class", tokenizer),
        reward_fn=t.api.get("reward_funcs", call.reward),
        train_data=t.api.get("train_dataset", call.data),
        val_data=t.api.get("eval_dataset", val_data),
        overrides=overrides,
        reward_weights=t.api.get("reward_weights"),
        callbacks=t.api.get("callbacks"),
    )
    trainer.config.notices += call.notices  # printed with the config's own at start
    return trainer.fit()


def mini_batch_default(config: Any, overrides: list[str]) -> list[str]:
    """`grpo(batch_size=8)`: the mini-batch follows the batch size given, unless a mini-batch size is given
    too (by keyword, override or the config). Without it the config's default (64) would exceed the batch.

    >>> mini_batch_default(None, ["data.train_batch_size=8"])
    ['actor_rollout_ref.actor.ppo_mini_batch_size=8']
    """
    mini = "actor_rollout_ref.actor.ppo_mini_batch_size="
    batch = [o.split("=", 1)[1] for o in overrides if o.startswith("data.train_batch_size=")]
    if not batch or any(o.startswith(mini) for o in overrides):
        return []
    if isinstance(config, Mapping):
        if (config.get("actor_rollout_ref") or {}).get("actor", {}).get("ppo_mini_batch_size") is not None:
            return []
    elif config is not None:
        return []  # a YAML file or a Config: its mini-batch size stands
    return [mini + batch[-1]]


# --------------------------------------------------------------------------- helpers


def _as_user_error(config_path: str | None, cfg):
    """Call through, turning a user error into HybridRLError with the CLI's one-line message."""

    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            from hybridrl.distributed.groups import WorkerDiedError
            from hybridrl.trainer.dynamic_sampling import DynamicSamplingError
            from hybridrl.trainer.loop import NonFiniteError

            try:
                return fn(*args, **kwargs)
            except HybridRLError:
                raise
            except (NonFiniteError, WorkerDiedError, DynamicSamplingError) as e:
                raise TrainingStopped(str(e)) from e
            except Exception as e:
                from hybridrl.launch import user_error_message  # the CLI's one-line messages

                message = user_error_message(e, cfg, config_path)
                if message is None:
                    raise  # a bug in hybridrl: the full traceback
                raise HybridRLError(message) from e

        return call

    return wrap


def _read_history(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _val(row: dict) -> dict:
    return {k: v for k, v in row.items() if k.startswith(("val-core/", "val-aux/"))}
