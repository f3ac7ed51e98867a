"""The Python API: `RLTrainer(...).fit()`, and `grpo(...)` / `ppo(...)` for the common case.

    import hybridrl
    result = hybridrl.grpo(model="path/or/PreTrainedModel", data=rows, reward=my_fn, batch_size=8, rollout_n=4)
    result.history[-1]["critic/score/mean"], result.model()

It builds the run the CLI builds, through the same functions: the config is loaded by
`load_config`/`config_from_dict` with the command line's `key=value` overrides, checked like
`hybridrl train` checks it, and trained by the CLI's trainer (`fit_with_restarts`). What the
caller passes as Python objects is turned into what a config names, under the run directory's
`inputs/` (so `config.yaml` of an API run is a runnable CLI config, and resume works the same):

- a model object (actor, critic) is saved there with `save_pretrained` and loaded by path. The
  workers build their own (sharded) copy from a path on every backend anyway, the frozen
  reference and checkpoints reload from it, and training never changes the caller's object;
  a large model costs one save (seconds per GB) and its size on disk.
- rows (a list of dicts, a pandas DataFrame, a `datasets.Dataset`, a pyarrow Table) are
  written as JSONL and read back with the row checks every data file gets (hybridrl/data).
- a reward function object is not shipped anywhere: rewards are computed by the controller
  (this process), in a thread with `custom_reward_function.timeout_s` per call, on every backend.

Errors a user can fix raise `HybridRLError` with the one line `hybridrl train` prints; a run that
stopped itself (non-finite losses, a dead worker) raises `TrainingStopped`. Nothing is left
behind between two runs in one process: the RNG states, environment variables, torch's thread
count, the reward-failure log and a Ray cluster the run started are restored or shut down.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
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
      (hybridrl/trl_compat.py, docs/coming_from_trl.md).
    - `callbacks`: objects with `on_step_end(metrics)`, `on_evaluate(metrics)`, `on_save(path)`; one that
      returns True stops the run (hybridrl/trainer/callbacks.py, `EarlyStopping`).
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
        from hybridrl.trainer.callbacks import check_callbacks
        from hybridrl.trl_compat import adapt_reward

        try:  # TRL-form reward functions and rows (hybridrl/trl_compat.py)
            reward_fn, train_data, val_data = adapt_reward(reward_fn, reward_weights, train_data, val_data)
            self.callbacks = check_callbacks(callbacks)
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
        first = self._read(self._overrides, check=False)  # only for where the run directory is
        inputs = Path(first.trainer.default_local_dir) / "inputs"
        values = self._argument_values(inputs)
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

    def _argument_values(self, inputs: Path) -> dict[str, Any]:
        """Config keys the arguments set: a path as given, an object as the path it will be saved to."""
        o, out = self._objects, {}
        actor, critic, tok = o["actor"], o["critic"], o["tokenizer"]
        if actor is not None:
            out["actor_rollout_ref.model.path"] = _fspath(actor) if _is_path(actor) else str(inputs / "actor")
            if not _is_path(actor):
                out["actor_rollout_ref.model.random_init"] = False  # its weights are saved with it
        if tok is not None and (_is_path(tok) or _is_path(actor) or actor is None):  # else saved beside the actor object
            out["actor_rollout_ref.model.tokenizer_path"] = _fspath(tok) if _is_path(tok) else str(inputs / "tokenizer")
        if critic is not None:
            out["critic.model.path"] = _fspath(critic) if _is_path(critic) else str(inputs / "critic")
        if self.reward_models:  # decided here, before validation, so the checks see the reward model
            out["reward_model.enable"] = True
        for name, key in (("train_data", "data.train_files"), ("val_data", "data.val_files")):
            data = o[name]
            if data is not None:
                out[key] = _data_paths(data) if _is_data_path(data) else str(inputs / f"{name}.jsonl")
        return out

    def _write_inputs(self) -> None:
        """Save the object arguments where the config says they are (the run directory's inputs/)."""
        cfg, o = self.config, self._objects
        m = cfg.actor_rollout_ref.model
        actor, tok = o["actor"], o["tokenizer"]
        if actor is not None and not _is_path(actor):
            _save_model(actor, m.path, "actor")
            if tok is None:  # the model's own: the directory it was loaded from
                tok = _tokenizer_of(actor)
            if not _is_path(tok):
                tok.save_pretrained(m.path)
        elif tok is not None and not _is_path(tok):
            Path(m.tokenizer_path).mkdir(parents=True, exist_ok=True)
            tok.save_pretrained(m.tokenizer_path)
        if o["critic"] is not None and not _is_path(o["critic"]):
            _save_model(o["critic"], cfg.critic.model.path, "critic")  # the critic reads the actor's tokenizer
        for name, files in (("train_data", cfg.data.train_files), ("val_data", cfg.data.val_files)):
            if o[name] is not None and not _is_data_path(o[name]):
                _write_rows(o[name], files if isinstance(files, str) else files[0], name)

    # -- running -----------------------------------------------------------------------------
    def fit(self) -> FitResult:
        """Train to the end; returns the metrics history, the last validation and the trained model."""
        return _as_user_error(self._config_path, self.config)(self._fit)()

    def _fit(self) -> FitResult:
        from hybridrl import launch
        from hybridrl.config import ConfigError
        from hybridrl.trainer import checkpoint as ckpt
        from hybridrl.trainer import rundir
        from hybridrl.trainer.callbacks import with_callbacks
        from hybridrl.trainer.rundir import run_dir
        from hybridrl.trainer.supervise import fit_with_restarts

        cfg = self.config
        out = run_dir(cfg)
        _preflight(cfg)  # under torchrun, a missing wandb: one line, before any file is written
        with _restored_process_state(), rundir.locked(out):
            launch.claim_run_dir(cfg)  # before inputs/ is written: overwrite moves the old run aside
            self._write_inputs()
            problems = launch.input_problems(cfg, in_memory_rm=bool(self.reward_models))
            if problems:
                raise ConfigError(problems)
            for n in cfg.notices:  # what `hybridrl train` prints once at start
                print(f"hybridrl: notice: {n}", file=sys.stderr)
            if self.reward_fn is None:
                launch.check_reward_file(cfg)
            else:
                _check_reward_fn(self.reward_fn, cfg)
            fit_with_restarts(cfg, with_callbacks(self._trainer_class(), self.callbacks))
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


def keyword_overrides(settings: Mapping[str, Any]) -> list[str]:
    """`{"rollout_n": 8, "data.max_prompt_length": 64}` -> `["actor_rollout_ref.rollout.n=8", "data.max_prompt_length=64"]`.

    A name is a key of SHORT_KEYS, a dotted config key, or the last part of exactly one config key.

    >>> keyword_overrides({"rollout_n": 8, "max_prompt_length": 64, "trainer.logger": ["console"]})
    ['actor_rollout_ref.rollout.n=8', 'data.max_prompt_length=64', 'trainer.logger=["console"]']
    """
    from hybridrl.config import Config
    from hybridrl.config.schema import walk

    keys = [e.path for e in walk(Config()) if not e.is_section]
    out = []
    for name, value in settings.items():
        if name in SHORT_KEYS:
            key = SHORT_KEYS[name]
        elif "." in name:
            key = name
        else:
            matches = [k for k in keys if k.rsplit(".", 1)[-1] == name]
            if len(matches) != 1:
                from hybridrl.config import suggest_keys

                why = f"names {len(matches)} keys ({', '.join(matches)})" if matches else "is no config key"
                hint = f"; did you mean {suggest_keys(name)[0]!r}?" if not matches and suggest_keys(name) else ""
                example = (matches or ["data.train_batch_size"])[0]
                raise HybridRLError(
                    f"keyword {name}={value!r} {why}{hint}; pass the dotted key, e.g. **{{{example!r}: ...}}, "
                    f"or one of {', '.join(SHORT_KEYS)}"
                )
            key = matches[0]
        out.append(f"{key}={json.dumps(value)}")
    return out


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
    TRL's GRPOConfig names (`num_generations`, `learning_rate`, `beta`, ...: hybridrl/trl_compat.py);
    `reward` may be TRL-form functions (a list, with `reward_weights=`), `callbacks=` as RLTrainer's.
    Defaults: algorithm.adv_estimator=grpo, 4 samples per prompt, the KL loss to the reference on, and
    the mini-batch as large as the batch when only the batch size is given.
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
    from hybridrl.trl_compat import TRLSettingError, mini_batch_default, translate

    try:
        settings, trl_overrides, api = translate(settings, algorithm)
    except TRLSettingError as e:
        raise HybridRLError(str(e)) from None
    overrides = list([overrides] if isinstance(overrides, str) else overrides)
    keywords = keyword_overrides(settings)
    overrides = base + trl_overrides + mini_batch_default(config, overrides + keywords) + overrides + keywords
    trainer = RLTrainer(
        config,
        actor=model,
        critic=critic,
        tokenizer=api.get("processing_class", tokenizer),
        reward_fn=api.get("reward_funcs", reward),
        train_data=api.get("train_dataset", data),
        val_data=api.get("eval_dataset", val_data),
        overrides=overrides,
        reward_weights=api.get("reward_weights"),
        callbacks=api.get("callbacks"),
    )
    return trainer.fit()


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


def _is_path(x: Any) -> bool:
    return isinstance(x, (str, os.PathLike))


def _fspath(x: Any) -> str:
    return os.fspath(x)


def _is_data_path(x: Any) -> bool:
    return _is_path(x) or (isinstance(x, (list, tuple)) and bool(x) and all(_is_path(p) for p in x))


def _data_paths(x: Any) -> str | list[str]:
    return _fspath(x) if _is_path(x) else [_fspath(p) for p in x]


def _save_model(model: Any, path: str, what: str) -> None:
    if not hasattr(model, "save_pretrained"):
        raise HybridRLError(
            f"{what}: expected a model directory or a transformers PreTrainedModel (with save_pretrained), got "
            f"{type(model).__name__}"
        )
    Path(path).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)


def _tokenizer_of(model: Any):
    """The tokenizer in the local directory a model object was loaded from (its name_or_path)."""
    from hybridrl.models.loading import load_tokenizer

    source = getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "")
    if not source or not Path(source).is_dir():
        raise HybridRLError(
            f"actor: a model object needs its tokenizer: pass tokenizer= (a directory or a tokenizer object); "
            f"the model's name_or_path {source!r} is not a local directory to take it from"
        )
    return load_tokenizer(source, what="the actor model's name_or_path")


def _rows(data: Any, name: str) -> list:
    """Rows of a list of dicts, a pandas DataFrame, a datasets.Dataset or a pyarrow Table."""
    if isinstance(data, Mapping):
        raise HybridRLError(f"{name}: got one dict; pass a list of row dicts (or a DataFrame, Dataset, file path)")
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas
        return data.to_dict(orient="records")
    if hasattr(data, "to_pylist"):  # pyarrow.Table
        return data.to_pylist()
    if hasattr(data, "to_list") and hasattr(data, "features"):  # datasets.Dataset
        return data.to_list()
    if isinstance(data, Iterable) and not isinstance(data, (str, bytes)):
        return list(data)
    raise HybridRLError(
        f"{name}: expected a .jsonl/.parquet path, a list of row dicts, a pandas DataFrame or a datasets.Dataset, "
        f"got {type(data).__name__}"
    )


def _write_rows(data: Any, path: str, name: str) -> None:
    rows = _rows(data, name)
    if not rows:
        raise HybridRLError(f"{name}: no rows; give at least one")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i, row in enumerate(rows):
            try:
                f.write(json.dumps(row, default=_jsonable, ensure_ascii=False) + "\n")
            except TypeError as e:
                raise HybridRLError(f"{name}, row {i}: {e}; rows hold strings, numbers, lists and dicts") from None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars (pandas/parquet rows hold them)
        return value.tolist()
    raise TypeError(f"a {type(value).__name__} is not JSON-serializable")


def _check_reward_fn(fn: Callable, cfg) -> None:
    """Call the reward function once on the first training row, its ground truth as the response, before
    any model work: a function with the wrong signature or a bug fails here, in one line, not as a run
    that scores every response 0 (in training, a call that raises scores 0 and counts in reward/errors)."""
    from hybridrl.data.converters import read_rows
    from hybridrl.rewards.manager import _as_number
    from hybridrl.rewards.pool import WorkerPool
    from hybridrl.rewards.remote import RemoteReward
    from hybridrl.rewards.trl import TRLRewards

    if isinstance(fn, RemoteReward):
        return  # a service: its failures are counted, never fatal
    if isinstance(fn, TRLRewards):
        files = cfg.data.train_files
        try:
            fn.probe(read_rows(files if isinstance(files, str) else files[0])[0])
        except ValueError as e:
            raise HybridRLError(str(e)) from None
        return
    if not callable(fn):
        raise HybridRLError(f"reward_fn must be a function, got {type(fn).__name__}")
    files = cfg.data.train_files
    row = read_rows(files if isinstance(files, str) else files[0])[0]
    truth = (row.get("reward_model") or {}).get("ground_truth") if isinstance(row.get("reward_model"), dict) else None
    call = {"data_source": row.get(cfg.data.reward_fn_key), "solution_str": str(truth), "ground_truth": truth}
    call["extra_info"] = row.get("extra_info") or {}
    kwargs = cfg.custom_reward_function.reward_kwargs
    if getattr(fn, "batched", False):
        target = functools.partial(_call_batched, fn, kwargs)
    else:
        target = functools.partial(fn, **kwargs) if kwargs else fn
    with WorkerPool(target, kind="thread", timeout_s=cfg.custom_reward_function.timeout_s) as pool:
        outcome = pool.map([call])[0]
    name = getattr(fn, "__name__", type(fn).__name__)
    shown = f"data_source={call['data_source']!r}, solution_str={call['solution_str']!r}, ground_truth={truth!r}"
    if outcome.error is not None:
        last = outcome.error.strip().splitlines()[-1]
        raise HybridRLError(
            f"reward_fn {name}({shown}) on the first training row failed: {last}; it must take (data_source, "
            f"solution_str, ground_truth, extra_info) and return a number or a dict with a numeric 'score' "
            f"(a batched function takes lists: hybridrl.batched_reward)"
        )
    value = outcome.value
    score = value.get("score") if isinstance(value, dict) else value
    if _as_number(score) is None:
        raise HybridRLError(
            f"reward_fn {name}({shown}) returned {value!r:.80}; return a finite number or a dict with a numeric 'score'"
        )


def _preflight(cfg) -> None:
    from hybridrl.preflight import backend_problems, launcher_refusal

    if refusal := launcher_refusal():
        raise HybridRLError(refusal)
    if problems := backend_problems(cfg):
        raise HybridRLError("; ".join(problems))
    from hybridrl.config.hub import fetch_repo_ids

    fetch_repo_ids(cfg)  # HYBRIDRL_ALLOW_HUB=1: model paths that are Hub ids become local snapshots


def _call_batched(fn, kwargs, data_source, solution_str, ground_truth, extra_info):
    out = fn(
        data_sources=[data_source], solution_strs=[solution_str], ground_truths=[ground_truth], extra_infos=[extra_info], **kwargs
    )
    out = list(out)
    if len(out) != 1:
        raise ValueError(f"the batched reward function returned {len(out)} results for 1 response")
    return out[0]


def _read_history(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _val(row: dict) -> dict:
    return {k: v for k, v in row.items() if k.startswith(("val-core/", "val-aux/"))}


@contextlib.contextmanager
def _restored_process_state():
    """What a run changes in this process, put back afterwards: RNG states, environment variables,
    torch's thread count and default dtype, the once-per-process reward-failure log, SIGTERM/SIGHUP
    handlers, and a Ray cluster or torch.distributed group that the run started."""
    import numpy as np
    import torch
    import torch.distributed as dist

    import hybridrl.rewards.manager as reward_manager
    from hybridrl.models.loading import hub_offline_by_default

    env = dict(os.environ)
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    ray_was_up = _ray_is_up()
    dist_was_up = dist.is_available() and dist.is_initialized()
    reward_manager._first_error_logged = False  # each run logs its first reward failure
    hub_offline_by_default()  # as the CLI: local model directories, no minute of Hub retries on a typo
    try:
        yield
    finally:
        if _ray_is_up() and not ray_was_up:
            import ray

            ray.shutdown()
        if dist.is_available() and dist.is_initialized() and not dist_was_up:
            dist.destroy_process_group()
        for sig, handler in handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                with contextlib.suppress(ValueError):  # not the main thread
                    signal.signal(sig, handler)
        os.environ.clear()
        os.environ.update(env)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)


def _ray_is_up() -> bool:
    ray = sys.modules.get("ray")  # never imported: never started
    return ray is not None and ray.is_initialized()
