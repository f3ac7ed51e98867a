"""YAML file + `a.b.c=value` overrides -> a typed, checked, resolved `Config`.

Every problem (unreadable file, malformed override, unknown key, wrong type, failed
validation) is collected and raised together as one `ConfigError`, so a user fixes a
launch script in one round instead of one error per run.
"""

import copy
import dataclasses
import difflib
import errno
import importlib.util
import math
import os
import re
import stat
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .dialect import dialect
from .extensions import load_extensions
from .schema import Config, ConfigError, resolve, type_name, walk
from .tree import get, leaves, merge, pop, put
from .validate import config_notices as validation_notices
from .validate import find_problems
from .yamlio import Loader as _Loader

_ENTRIES = {e.path: e for e in walk(Config())}


# --------------------------------------------------------------------------- public API


def load_config(
    path: str | Path | None,
    overrides: Sequence[str] = (),
    *,
    check: bool = True,
    notices: list[str] | None = None,
    verl: str | None = None,
) -> Config:
    """Read a (possibly partial) YAML file, apply overrides, type-check, validate, resolve.

    path: a YAML mapping, or None for the defaults alone.
    overrides: `a.b.c=value` strings (a leading `+` or `++`, as Hydra users write, is ignored;
        `~a.b.c` resets a key to its default); the value is parsed as YAML, so `1e-6`, `[a,b]`,
        `null`, `true` work.
    check: also run `validate` (batch sizes, choices, ranges); type errors are always raised.
    notices: when a list, gets `cfg.notices`: one line per setting that is valid but probably not what was
        meant (settings the run ignores, two mechanisms doing the same job).
    verl: a verl command line (no hybridrl config file) of that entry point (ppo, dapo, sft):
        start from verl's defaults where they differ from ours, and map verl's engine and logger
        names (docs/verl.md).

    Keys of verl's config tree that are not ours, its `defaults:` lists and `${...}` are translated by
    the installed dialect (config/dialect.py: hybridrl/compat/verl); what that ignored or changed is in
    `cfg.notices`, to be shown once at start.
    """
    errors: list[str] = []
    tree = _read_yaml(path, errors) if path is not None else {}
    if "defaults" in tree:  # a Hydra defaults list, as verl's config tree has
        tree = dialect().compose(Path(path), lambda p: _read_yaml(p, errors), errors)
    if verl:
        base = dialect().base(verl)
        merge(base, tree)
        tree = base
    cfg = _load(copy.deepcopy(tree), overrides, check, errors, readable=not errors, verl=verl)
    cfg.notices = cfg.notices + config_notices(cfg, tree, overrides)
    if notices is not None:
        notices.extend(cfg.notices)
    return cfg


def config_notices(cfg: Config, tree: Mapping | None = None, overrides: Sequence[str] = ()) -> list[str]:
    """Settings that are valid but probably not what was meant, one line each.

    tree and overrides: what the user wrote (to tell values they set from inherited ones).
    """
    out = []
    a, algo = cfg.actor_rollout_ref.actor, cfg.algorithm
    if algo.name == "rl" and a.use_kl_loss and algo.use_kl_in_reward:
        out.append(
            "both actor_rollout_ref.actor.use_kl_loss and algorithm.use_kl_in_reward are on: the KL to the "
            "reference is penalised twice (in the loss and in the reward); verl's GRPO recipes use only the loss"
        )
    if not cfg.critic_enabled and tree is not None:
        keys = _critic_keys_set(tree, overrides)
        if keys:
            shown = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
            out.append(
                f"{shown} ignored: no critic runs with algorithm.adv_estimator={algo.adv_estimator} "
                f"(only gae learns a value function)"
            )
    return out


def _critic_keys_set(tree: Mapping, overrides: Sequence[str]) -> list[str]:
    """critic.* keys the user gave a value that differs from what the run would use anyway."""
    given: dict[str, Any] = dict(leaves(tree["critic"], "critic.")) if isinstance(tree.get("critic"), dict) else {}
    for item in [overrides] if isinstance(overrides, str) else overrides:
        key, sep, text = str(item).partition("=")
        key = key.strip().lstrip("+")
        if sep and key.startswith("critic."):
            given[key] = yaml.load(text, Loader=_Loader) if text.strip() else None
    if not given:
        return []
    baseline = copy.deepcopy(dict(tree))
    baseline.pop("critic", None)
    try:
        base = _load(baseline, [o for o in overrides if not str(o).lstrip("+").startswith("critic.")], False, [], True)
    except (ConfigError, yaml.YAMLError, TypeError):
        return []
    out = []
    for key, value in given.items():
        node: Any = base
        for part in key.split("."):
            node = getattr(node, part, _MISSING)
        if node is not _MISSING and node != value and not (isinstance(value, int) and node == float(value)):
            out.append(key)
    return sorted(out)


_MISSING = object()


def config_from_dict(d: Mapping[str, Any], overrides: Sequence[str] = (), *, check: bool = True) -> Config:
    """Like `load_config`, from an already-parsed nested mapping."""
    if not isinstance(d, Mapping):
        raise ConfigError([f"a config must be a mapping of sections, got {type(d).__name__}"])
    return _load(copy.deepcopy(dict(d)), overrides, check, [], readable=True)


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as nested plain dicts and lists."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML; `load_config` reads it back to an equal Config."""
    resolved = resolve(copy.deepcopy(cfg))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(to_dict(resolved), sort_keys=False, default_flow_style=None, width=100)
    path.write_text("# hybridrl config, resolved (every inherited value filled in)\n" + text)


# --------------------------------------------------------------------------- reading


def _load(
    tree: dict, overrides: Sequence[str], check: bool, errors: list[str], readable: bool, verl: str | None = None
) -> Config:
    if isinstance(overrides, str):  # a single override passed bare would be split into characters
        overrides = [overrides]
    for item in overrides:
        _apply_override(tree, item, errors)
    notices = dialect().translate(tree, verl, errors)  # verl's keys and forms (hybridrl/compat/verl)
    notices += _vllm_fallback(tree)
    cfg = Config()
    bad: set[str] = set()  # keys whose value was rejected; validation of them would mislead
    _fill(cfg, tree, "", errors, bad)
    if readable and "extensions" not in bad:
        try:
            load_extensions(cfg.extensions)  # before the checks: they may register estimators and losses
        except ValueError as e:
            errors.append(str(e))
    if check and readable:
        for problem in find_problems(cfg):
            if not any(k == b or k.startswith(b + ".") for k in problem.keys for b in bad):
                errors.append(problem.message)
    if errors:
        raise ConfigError(errors)
    cfg.notices = notices + validation_notices(cfg)
    return resolve(cfg)


def _vllm_fallback(tree: dict) -> list[str]:
    """`rollout.name=vllm` where vLLM is not installed: hybridrl's own engine with the same sampling settings,
    said in a notice at start, before any model loads. verl's scripts and YAML all name vllm, and most of them
    run here as they are."""
    key = "actor_rollout_ref.rollout.name"
    if get(tree, key) != "vllm" or importlib.util.find_spec("vllm") is not None:
        return []
    put(tree, key, "auto")
    return [
        f"{key}=vllm: hybridrl's own engine generates (native on a GPU, hf on CPU) with the same sampling "
        f"settings, as vLLM is not installed here (pip install vllm to generate with it)"
    ]


_MAX_YAML_DEPTH = 64  # [ and { levels; a config nests a handful
_MAX_YAML_BYTES = 16 << 20


def _flow_depth(text: str) -> int:
    """The deepest nesting of [ and { in `text` (quotes not told apart: a bound, not a parser)."""
    depth = most = 0
    for m in re.finditer(r"[\[\]{}]", text):
        depth = depth + 1 if m.group() in "[{" else max(0, depth - 1)
        most = max(most, depth)
    return most


def _read_bytes(path: str | Path) -> bytes:
    """A config file's bytes: a regular file only (a FIFO would wait for a writer for ever, a device
    never end), opened without blocking, at most _MAX_YAML_BYTES."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device"
            raise OSError(errno.EINVAL, f"it is {kind}, not a file")
        if st.st_size > _MAX_YAML_BYTES:
            raise OSError(errno.EFBIG, f"{st.st_size >> 20} MiB, more than a config holds ({_MAX_YAML_BYTES >> 20} MiB at most)")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(_MAX_YAML_BYTES + 1)
    finally:
        os.close(fd)


def _read_yaml(path: str | Path, errors: list[str]) -> dict:
    try:
        data = _read_bytes(path)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            fix = "check the path"
        elif e.errno in (errno.EINVAL, errno.EFBIG, errno.EISDIR):
            fix = "give a YAML file"
        else:
            fix = "check its permissions"
        errors.append(f"cannot read config file {str(path)!r}: {e.strerror or e}; {fix}")
        return {}
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark is valid UTF-8 and skipped
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        errors.append(f"{path}:{line}: not valid UTF-8 (byte {data[e.start]:#04x}); re-save the file as UTF-8")
        return {}
    if _flow_depth(text) > _MAX_YAML_DEPTH:  # PyYAML recurses per level and slows down long before it fails
        errors.append(f"{path}: not valid YAML (brackets nested more than {_MAX_YAML_DEPTH} deep)")
        return {}
    try:
        tree = yaml.load(text, Loader=_Loader)
    except RecursionError:
        errors.append(f"{path}: not valid YAML (nested too deep)")
        return {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        reason = " ".join(str(getattr(e, "problem", None) or e).split())
        context = getattr(e, "context", None)
        if "appears twice" in reason:
            errors.append(f"{where}: {reason}")
        else:
            errors.append(f"{where}: not valid YAML ({reason}{', ' + ' '.join(context.split()) if context else ''})")
        return {}
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        errors.append(f"{path} must hold a mapping of sections (data:, trainer:, ...), got {type(tree).__name__}")
        return {}
    return tree


def _apply_override(tree: dict, item: str, errors: list[str]) -> None:
    key, sep, text = str(item).partition("=")
    key = key.strip().lstrip("+")
    if key.startswith("~"):  # Hydra's delete: back to the default
        key = key[1:]
        if key and get(tree, key, "absent") != "absent":
            pop(tree, key)
        return
    if not sep or not key:
        errors.append(f"override {item!r} is not of the form key=value (e.g. data.train_batch_size=128)")
        return
    if text.startswith("="):
        errors.append(f"override {item!r} has '==': write {key}={text[1:]} (one '=')")
        return
    try:
        value = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        reason = getattr(e, "problem", None) or e
        errors.append(f"override {item!r}: cannot parse the value as YAML ({reason})")
        return
    entry = _ENTRIES.get(key)
    if entry is not None and _is_text(entry.type) and isinstance(value, (bool, int, float)):
        value = text.strip()  # experiment_name=007 means the string "007", not the number 7
    if entry is not None and entry.type is str and value is None and not text.strip():
        value = ""  # `key=` empties a text key
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            errors.append(f"override {item!r}: {'.'.join(parts[: i + 1])} holds a value, not a section of keys")
            return
        node = child
    last = parts[-1]
    if isinstance(value, dict) and isinstance(node.get(last), dict):
        merge(node[last], value)
    else:
        node[last] = value


def _is_text(tp: Any) -> bool:
    return tp is str or set(typing.get_args(tp)) == {str, type(None)}


# --------------------------------------------------------------------------- typing


def _fill(obj: Any, raw: Any, prefix: str, errors: list[str], bad: set[str]) -> None:
    """Set obj's fields from the raw mapping, recursing into sections; record every problem."""
    if raw is None:  # `critic:` with nothing under it
        return
    if not isinstance(raw, dict):
        path = prefix.rstrip(".")
        errors.append(f"{path}: expected a section of keys ({type(obj).__name__}), got {_brief(raw)}")
        bad.add(path)
        return
    fields = {f.name: f for f in dataclasses.fields(obj)}
    for key, value in raw.items():
        path = f"{prefix}{key}"
        f = fields.get(key) if isinstance(key, str) else None
        if f is None:
            errors.extend(_unknown_key(path, value))
        elif dataclasses.is_dataclass(f.type):
            _fill(getattr(obj, key), value, path + ".", errors, bad)
        else:
            ok, coerced = _coerce(value, f.type)
            if ok:
                setattr(obj, key, coerced)
            else:
                hint = ""
                if _accepts_str(f.type) and isinstance(value, (bool, int, float)):
                    hint = f"; quote it in YAML: '{value}'"
                if isinstance(value, float) and not math.isfinite(value):
                    default = _ENTRIES[path].value if path in _ENTRIES else None
                    hint = "; it must be a finite number" + (f" (the default is {default})" if default is not None else "")
                errors.append(f"{path}: expected {type_name(f.type)}, got {_brief(value)}{hint}")
                bad.add(path)


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """(True, value converted to tp) or (False, None). Only int -> float and a lone string for
    a list of strings (`trainer.logger=console`) are converted; everything else must match."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if value is None:
            return type(None) in args, None
        for arm in args:
            ok, coerced = _coerce(value, arm)
            if ok:
                return True, coerced
        return False, None
    if tp is Any:
        return True, value
    if tp is type(None):
        return value is None, None
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return ok, float(value) if ok else None
    if tp is str:
        return isinstance(value, str), value
    if tp is dict or origin is dict:
        return isinstance(value, dict), copy.deepcopy(value)
    if tp is list or origin is list:
        item = args[0] if args else Any
        if isinstance(value, str) and item is str:
            value = [value]
        if not isinstance(value, list):
            return False, None
        out = []
        for v in value:
            ok, coerced = _coerce(v, item)
            if not ok:
                return False, None
            out.append(coerced)
        return True, out
    return isinstance(value, tp), value


def _accepts_str(tp: Any) -> bool:
    return tp is str or str in typing.get_args(tp)


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --------------------------------------------------------------------------- unknown keys


_MAX_UNKNOWN_LEAVES = 32  # each suggestion compares the key with every config key


def _leaves_over(tree: dict, limit: int) -> bool:
    """Whether the nested mapping holds more than `limit` leaves (counted until it is known)."""
    stack, n = [tree], 0
    while stack:
        for v in stack.pop().values():
            if isinstance(v, dict) and v:
                stack.append(v)
            else:
                n += 1
                if n > limit:
                    return True
    return False


def _unknown_key(path: str, value: Any, section: str | None = None) -> list[str]:
    """One message per unknown leaf; an unknown section is reported by the keys under it,
    which are what the suggestion can match (`actr.ppo_epochs` -> `actor.ppo_epochs`), and
    failing that by the section itself (`datta.x` -> `data`)."""
    if isinstance(value, dict) and value:
        if _leaves_over(value, _MAX_UNKNOWN_LEAVES):  # a whole foreign tree: one line, not a guess per key
            close = suggest_keys(path)
            hint = f"; did you mean '{close[0]}'?" if close else " (all keys: docs/config.md, or `hybridrl explain`)"
            return [f"unknown section '{path}' (over {_MAX_UNKNOWN_LEAVES} keys under it){hint}"]
        return [m for k, v in value.items() for m in _unknown_key(f"{path}.{k}", v, section or path)]
    close = suggest_keys(path) or (suggest_keys(section) if section else [])
    if not close:
        return [f"unknown key '{path}' (all keys: docs/config.md, or `hybridrl explain`)"]
    more = f" (or {', '.join(repr(c) for c in close[1:])})" if len(close) > 1 else ""
    return [f"unknown key '{path}'; did you mean '{close[0]}'?{more}"]


# Words that make names a letter or two apart mean different things: a suggestion never swaps them
# (`ppo_micro_batch_size` is not a typo of `ppo_mini_batch_size`).
_OPPOSITES = (("micro", "mini"), ("max", "min"), ("low", "high"), ("actor", "critic"), ("train", "val"))


def _other_meaning(leaf: str, candidate: str) -> bool:
    words, other = set(leaf.split("_")), set(candidate.split("_"))
    return any(
        a in words and b in other and a not in other or b in words and a in other and b not in other for a, b in _OPPOSITES
    )


def suggest_keys(path: str, limit: int = 3) -> list[str]:
    """Valid keys a mistyped or misplaced one probably meant, best first.

    Keys with the same last name anywhere in the tree (`actor.lr` -> `actor.optim.lr`) beat
    keys whose last name is close, which beat close full paths; only the best of these groups
    is returned, closest full path first.
    """
    leaf = path.rsplit(".", 1)[-1]
    ranked = []
    for candidate in _ENTRIES:
        candidate_leaf = candidate.rsplit(".", 1)[-1]
        if _other_meaning(leaf, candidate_leaf):
            continue
        ratio = difflib.SequenceMatcher(None, path, candidate).ratio()
        if candidate_leaf == leaf:
            tier = 0
        elif difflib.SequenceMatcher(None, leaf, candidate_leaf).ratio() >= 0.8:
            tier = 1
        elif ratio >= 0.75:
            tier = 2
        else:
            continue
        ranked.append((tier, -ratio, candidate))
    ranked.sort()
    return [candidate for tier, _, candidate in ranked[:limit] if tier == ranked[0][0]]
