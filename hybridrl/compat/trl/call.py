"""A `GRPOTrainer(...)` call's shape, read by `hybridrl.grpo`: TRL's positional order and `args=GRPOConfig(...)`.

    GRPOTrainer(model, reward_funcs, args=GRPOConfig(...), train_dataset=ds)   # TRL
    hybridrl.grpo(model, reward_funcs, args=GRPOConfig(...), train_dataset=ds) # the same call here

hybridrl's own order is `grpo(model, data, reward)`. Rows are never callable, so a function (or a list of
functions) in the second place is TRL's `reward_funcs`, and the third place is then TRL's `args`.

`args` is any object with GRPOConfig's attribute names (TRL need not be installed): the names set in it
are read as if passed by keyword (`grpo(**names)`; a keyword wins over the same name in `args`). For a
dataclass such as GRPOConfig, "set" means different from the class's defaults: TRL's defaults are not
carried over, so `args=GRPOConfig(num_generations=4)` runs as `grpo(num_generations=4)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .settings import TRL_ALIASES, TRL_NO_EFFECT, TRL_REFUSED, Translation, translate

# GRPOConfig names translate() reads besides its tables.
_READ = {
    "beta",
    "loss_type",
    "scale_rewards",
    "report_to",
    "reward_weights",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "adam_beta1",
    "adam_beta2",
}
# hybridrl's arguments and GRPOTrainer's names for them.
_SAME = {"data": "train_dataset", "reward": "reward_funcs", "val_data": "eval_dataset", "tokenizer": "processing_class"}


@dataclass
class Call:
    """A grpo()/ppo() call with TRL's shapes undone: hybridrl's positional values, the translated names."""

    data: Any
    reward: Any
    translation: Translation
    notices: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_call(data: Any, reward: Any, given: Mapping[str, Any], settings: dict[str, Any], algorithm: str) -> Call:
    """`given`: hybridrl's own arguments that were passed (val_data, tokenizer), for the clash check."""
    problems: list[str] = []
    if _rewards(data):  # TRL's order: (model, reward_funcs, args)
        data, reward, third = None, data, reward
        if third is not None:
            if _is_args(third) and "args" not in settings:
                settings = {**settings, "args": third}
            else:
                problems.append(
                    f"{algorithm}(model, reward_funcs, {type(third).__name__}): in TRL's order the third argument is "
                    f"args=GRPOConfig(...); pass the rows as train_dataset= (or hybridrl's {algorithm}(model, data, reward))"
                )
    notices: list[str] = []
    if "args" in settings:
        settings = dict(settings)
        from_args, unknown = args_settings(settings.pop("args"))
        settings = {**from_args, **settings}  # a keyword wins
        if unknown:
            notices.append(f"args: ignored, TRL's names with no counterpart here: {', '.join(sorted(unknown))}")
    t = translate(settings, algorithm)
    passed = {"data": data, "reward": reward, **given}
    for ours, theirs in _SAME.items():
        if theirs in t.api and passed.get(ours) is not None:
            problems.append(f"{ours} and {theirs} are the same argument (TRL's name and hybridrl's); pass one of them")
    return Call(data, reward, t, notices + t.notices, problems + t.problems)


def _rewards(x: Any) -> bool:
    """A reward function or a list of them (TRL's reward_funcs); rows and paths are never callable."""
    if isinstance(x, (list, tuple)):
        return bool(x) and all(callable(f) for f in x)
    return callable(x) and not isinstance(x, type)


def _is_args(x: Any) -> bool:
    """Looks like a GRPOConfig: an object of attributes, not rows, a path or a function."""
    if isinstance(x, (str, bytes, Sequence, Mapping)) or callable(x) or hasattr(x, "__fspath__"):
        return False
    return not (hasattr(x, "columns") or hasattr(x, "features") or hasattr(x, "to_pylist"))


def args_settings(args: Any) -> tuple[dict[str, Any], set[str]]:
    """(the names set in a GRPOConfig-shaped object that hybridrl reads, the other names set in it)."""
    if isinstance(args, Mapping):
        values = dict(args)
    elif dataclasses.is_dataclass(args) and not isinstance(args, type):
        values = _changed(args)
    elif hasattr(args, "__dict__"):
        values = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    else:
        raise ValueError(f"args: expected a GRPOConfig (or any object with its attribute names), got {type(args).__name__}")
    _drop_derived(values, args)
    known = set(TRL_ALIASES) | set(TRL_NO_EFFECT) | set(TRL_REFUSED) | _READ
    return {k: v for k, v in values.items() if k in known}, {k for k in values if k not in known}


def _changed(args: Any) -> dict[str, Any]:
    """The fields of a dataclass instance that differ from a default instance's (its defaults after
    `__post_init__`), or from the field defaults when the class cannot be built without arguments."""
    try:
        base = type(args)()
        default: Callable[[dataclasses.Field], Any] = lambda f: getattr(base, f.name, dataclasses.MISSING)  # noqa: E731
    except Exception:
        default = _field_default
    out = {}
    for f in dataclasses.fields(args):
        value = getattr(args, f.name, dataclasses.MISSING)
        try:
            same = bool(value == default(f))
        except Exception:  # values that do not compare (arrays): taken as set
            same = False
        if not same and value is not dataclasses.MISSING:
            out[f.name] = value
    return out


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _drop_derived(values: dict[str, Any], args: Any) -> None:
    """GRPOConfig fills generation_batch_size and steps_per_generation from the batch settings itself:
    left as it derives them (steps_per_generation = gradient_accumulation_steps, generation_batch_size =
    per_device_train_batch_size x processes x steps_per_generation), they say nothing of their own."""
    get = lambda name, default: values.get(name, getattr(args, name, default))  # noqa: E731
    steps = get("steps_per_generation", None)
    try:
        world = int(getattr(args, "world_size", 1) or 1)
    except Exception:  # a property that needs a distributed setup
        world = 1
    if steps is not None and get("generation_batch_size", None) == get("per_device_train_batch_size", 8) * world * steps:
        values.pop("steps_per_generation", None)  # one of the two says it all
        if steps == get("gradient_accumulation_steps", 1):
            values.pop("generation_batch_size", None)
